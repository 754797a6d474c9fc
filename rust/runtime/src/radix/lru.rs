//! The eviction queue of the radix tree: unlocked leaves, least recently used first.
//!
//! A lazy min-heap of `(last_access, node)` entries. The tree pushes an entry whenever a node
//! becomes an unlocked leaf or is touched while it is one, and never removes entries when that
//! stops being true; instead, whoever pops an entry skips it unless the node is still an unlocked
//! leaf stamped `last_access` (such an entry orders exactly as a fresh one would, so using it is
//! sound even if it was pushed for an earlier occupant of the arena slot). Eviction then costs
//! O(k log n) for k leaves rather than a scan of the whole arena per call. Stale entries are
//! dropped by a rebuild when the heap outgrows the tree.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

/// Unlocked leaves by last access (see the module docs for the laziness).
#[derive(Debug, Default)]
pub(super) struct LruLeaves {
    heap: BinaryHeap<Reverse<(u64, u32)>>,
}

impl LruLeaves {
    /// Queues `node`, stamped `last_access`.
    pub(super) fn push(&mut self, last_access: u64, node: u32) {
        self.heap.push(Reverse((last_access, node)));
    }

    /// The oldest entry, which may be stale.
    pub(super) fn pop(&mut self) -> Option<(u64, u32)> {
        self.heap.pop().map(|Reverse(entry)| entry)
    }

    /// Whether the heap holds more than `limit` entries (time to rebuild).
    pub(super) fn exceeds(&self, limit: usize) -> bool {
        self.heap.len() > limit
    }

    /// Replaces every entry by `entries` (the current unlocked leaves).
    pub(super) fn rebuild(&mut self, entries: Vec<(u64, u32)>) {
        self.heap = entries.into_iter().map(Reverse).collect();
    }

    /// Drops every entry.
    pub(super) fn clear(&mut self) {
        self.heap.clear();
    }

    /// The entries as a set, for the tree's self-check.
    pub(super) fn entries(&self) -> HashSet<(u64, u32)> {
        self.heap.iter().map(|&Reverse(entry)| entry).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_oldest_first_and_rebuild_replaces_everything() {
        let mut lru = LruLeaves::default();
        for (stamp, node) in [(5, 1), (2, 7), (9, 3), (2, 4)] {
            lru.push(stamp, node);
        }
        assert!(lru.exceeds(3) && !lru.exceeds(4));
        assert_eq!(lru.pop(), Some((2, 4)));
        assert_eq!(lru.pop(), Some((2, 7)));
        lru.rebuild(vec![(8, 2)]);
        assert_eq!(lru.entries(), HashSet::from([(8, 2)]));
        lru.clear();
        assert_eq!(lru.pop(), None);
    }
}
