//! The children map of a radix node, keyed by the first token (page size 1) or the first page of
//! each child's key. Two variants so that the common page size 1 hashes a plain `u32`.

use rustc_hash::FxHashMap;

/// The children of a node, keyed by the first token (page size 1) or the first page of their key.
#[derive(Debug)]
pub(super) enum Children {
    Token(FxHashMap<u32, u32>),
    Page(FxHashMap<Box<[u32]>, u32>),
}

impl Children {
    pub(super) fn new(page_size: usize) -> Self {
        if page_size == 1 {
            Children::Token(FxHashMap::default())
        } else {
            Children::Page(FxHashMap::default())
        }
    }

    /// `first` is the first page of a key (its first token when the page size is 1).
    pub(super) fn get(&self, first: &[u32]) -> Option<u32> {
        match self {
            Children::Token(map) => map.get(&first[0]).copied(),
            Children::Page(map) => map.get(first).copied(),
        }
    }

    pub(super) fn insert(&mut self, first: &[u32], child: u32) {
        match self {
            Children::Token(map) => map.insert(first[0], child),
            Children::Page(map) => map.insert(first.into(), child),
        };
    }

    pub(super) fn remove(&mut self, first: &[u32]) -> Option<u32> {
        match self {
            Children::Token(map) => map.remove(&first[0]),
            Children::Page(map) => map.remove(first),
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Children::Token(map) => map.len(),
            Children::Page(map) => map.len(),
        }
    }

    pub(super) fn values(&self) -> Box<dyn Iterator<Item = u32> + '_> {
        match self {
            Children::Token(map) => Box::new(map.values().copied()),
            Children::Page(map) => Box::new(map.values().copied()),
        }
    }

    pub(super) fn clear(&mut self) {
        match self {
            Children::Token(map) => *map = FxHashMap::default(),
            Children::Page(map) => *map = FxHashMap::default(),
        }
    }
}
