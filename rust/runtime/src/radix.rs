//! The radix tree of the prefix cache: token-id prefixes → the KV slots that hold them.
//!
//! SGLang's `mem_cache/radix_cache.py` semantics. Each edge holds a run of token ids (its key)
//! and the KV slot ids of those tokens (its value). Nodes live in an arena and are named across
//! the boundary by [`NodeHandle`]s that carry a generation, so a handle to an evicted or reset
//! node is detected instead of aliasing whatever reused its place.
//!
//! What must stay true:
//! - every non-root node has a non-empty key of a whole number of pages, `key.len() == value.len()`,
//!   and its parent's children map holds it under the first page of its key;
//! - a node's lock count is at most its parent's (locks run along the path to the root);
//! - `evictable` is the slot count of unlocked nodes and `protected` that of locked ones;
//! - every unlocked leaf has an entry in the eviction queue `lru` with its current stamp.

use crate::error::{Error, Result};
use children::Children;
use lru::LruLeaves;

mod children;
mod lru;
mod validate;

/// A node of the tree as Python sees it: the arena index in the low 32 bits and the node's
/// generation in the high 32 bits.
pub type NodeHandle = u64;

const ROOT: u32 = 0;

#[derive(Debug)]
struct Node {
    key: Vec<u32>,
    value: Vec<u32>,
    children: Children,
    parent: u32,
    lock_ref: u32,
    last_access: u64,
    generation: u32,
    live: bool,
}

/// The prefix cache's radix tree. Not thread-safe by itself: the owner serializes access.
#[derive(Debug)]
pub struct RadixTree {
    page_size: usize,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    lru: LruLeaves,
    clock: u64,
    evictable: usize,
    protected: usize,
}

impl RadixTree {
    /// An empty tree whose keys are matched and inserted in whole pages of `page_size` tokens.
    pub fn new(page_size: usize) -> Result<Self> {
        if page_size == 0 || page_size > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "page_size must be ≥ 1, got {page_size}"
            )));
        }
        let root = Node {
            key: Vec::new(),
            value: Vec::new(),
            children: Children::new(page_size),
            parent: ROOT,
            lock_ref: 1,
            last_access: 0,
            generation: 0,
            live: true,
        };
        Ok(RadixTree {
            page_size,
            nodes: vec![root],
            free_nodes: Vec::new(),
            lru: LruLeaves::default(),
            clock: 0,
            evictable: 0,
            protected: 0,
        })
    }

    /// The number of tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The handle of the root, which stands for the empty prefix; locking it is a no-op.
    pub fn root(&self) -> NodeHandle {
        self.handle(ROOT)
    }

    /// The slots of the longest cached prefix of `tokens` (whole pages only) and the handle of
    /// the node where it ends. An edge matched part-way is split there, so the handle always
    /// ends exactly at the match. Every node on the path counts as used now (LRU).
    pub fn match_prefix(&mut self, tokens: &[u32]) -> (Vec<u32>, NodeHandle) {
        let mut slots = Vec::new();
        let node = self.match_into(tokens, &mut slots);
        (slots, self.handle(node))
    }

    /// Like [`RadixTree::match_prefix`], but appends the slots to `slots` and returns the arena
    /// index of the last node.
    fn match_into(&mut self, tokens: &[u32], slots: &mut Vec<u32>) -> u32 {
        let key = &tokens[..self.aligned(tokens.len())];
        let now = self.tick();
        let mut node = ROOT;
        let mut pos = 0;
        while pos < key.len() {
            let Some(child) = self.nodes[node as usize]
                .children
                .get(&key[pos..pos + self.page_size])
            else {
                break;
            };
            self.touch(child, now);
            let matched = self.key_match(&self.nodes[child as usize].key, &key[pos..]);
            if matched < self.nodes[child as usize].key.len() {
                node = self.split(child, matched);
                slots.extend_from_slice(&self.nodes[node as usize].value);
                break;
            }
            slots.extend_from_slice(&self.nodes[child as usize].value);
            node = child;
            pos += matched;
        }
        node
    }

    /// Caches `slots` as the KV slots of `tokens` (whole pages only: a tail shorter than a page
    /// is left out and stays the caller's) and returns how many leading tokens were cached
    /// already. The caller still owns its slots for that prefix and should free them, since the
    /// tree keeps its own.
    pub fn insert(&mut self, tokens: &[u32], slots: &[u32]) -> Result<usize> {
        if tokens.len() != slots.len() {
            return Err(Error::InvalidArgument(format!(
                "insert got {} tokens but {} slots",
                tokens.len(),
                slots.len()
            )));
        }
        let len = self.aligned(tokens.len());
        let now = self.tick();
        let mut node = ROOT;
        let mut pos = 0;
        while pos < len {
            let first = &tokens[pos..pos + self.page_size];
            let Some(child) = self.nodes[node as usize].children.get(first) else {
                break;
            };
            self.touch(child, now);
            let matched = self.key_match(&self.nodes[child as usize].key, &tokens[pos..len]);
            pos += matched;
            if matched < self.nodes[child as usize].key.len() {
                node = self.split(child, matched);
                break;
            }
            node = child;
        }
        if pos < len {
            // A new leaf counts as newer than the path it hangs from, as in SGLang, where it is
            // stamped after the walk; so two leaves never tie in the LRU order.
            let created = self.tick();
            let (key, value) = (tokens[pos..len].to_vec(), slots[pos..len].to_vec());
            let leaf = self.new_node(key, value, node, created);
            self.nodes[node as usize]
                .children
                .insert(&tokens[pos..pos + self.page_size], leaf);
            self.evictable += len - pos;
            self.offer(leaf);
        }
        Ok(pos)
    }

    /// Adds a lock on every node from `node` up to the root; locked nodes are never evicted.
    /// Returns the change of the evictable size (zero or negative), as SGLang's `inc_lock_ref`.
    pub fn lock(&mut self, node: NodeHandle) -> Result<i64> {
        let mut index = self.resolve(node)?;
        let mut delta = 0i64;
        while index != ROOT {
            let n = &mut self.nodes[index as usize];
            if n.lock_ref == 0 {
                self.evictable -= n.value.len();
                self.protected += n.value.len();
                delta -= n.value.len() as i64;
            }
            n.lock_ref += 1;
            index = n.parent;
        }
        Ok(delta)
    }

    /// Removes a lock taken by [`RadixTree::lock`]. Returns the change of the evictable size
    /// (zero or positive). Unlocking a node that is not locked changes nothing and is an error.
    pub fn unlock(&mut self, node: NodeHandle) -> Result<i64> {
        let start = self.resolve(node)?;
        let mut index = start;
        while index != ROOT {
            let n = &self.nodes[index as usize];
            if n.lock_ref == 0 {
                return Err(if index == start {
                    Error::InvalidArgument(format!(
                        "unlock of radix node {node}, which is not locked"
                    ))
                } else {
                    Error::Invariant(format!(
                        "radix node {index} is unlocked below a locked node"
                    ))
                });
            }
            index = n.parent;
        }
        let mut index = start;
        let mut delta = 0i64;
        while index != ROOT {
            let n = &mut self.nodes[index as usize];
            n.lock_ref -= 1;
            let parent = n.parent;
            if n.lock_ref == 0 {
                self.protected -= n.value.len();
                self.evictable += n.value.len();
                delta += n.value.len() as i64;
                self.offer(index);
            }
            index = parent;
        }
        Ok(delta)
    }

    /// Evicts unlocked leaves, least recently used first (a parent that becomes an unlocked leaf
    /// joins the queue), until at least `num_tokens` slots are out or nothing evictable is left.
    /// Returns the evicted slots, which the caller gives back to its allocator.
    pub fn evict(&mut self, num_tokens: usize) -> Vec<u32> {
        let mut evicted = Vec::new();
        while evicted.len() < num_tokens {
            let Some((stamp, leaf)) = self.lru.pop() else {
                break;
            };
            if !self.is_unlocked_leaf(leaf) || self.nodes[leaf as usize].last_access != stamp {
                continue; // a stale entry (see `lru`)
            }
            let parent = self.nodes[leaf as usize].parent;
            evicted.extend_from_slice(&self.nodes[leaf as usize].value);
            self.evictable -= self.nodes[leaf as usize].value.len();
            let first = self.nodes[leaf as usize].key[..self.page_size].to_vec();
            self.nodes[parent as usize].children.remove(&first);
            self.free_node(leaf);
            self.offer(parent);
        }
        evicted
    }

    /// Slots held by unlocked nodes (what [`RadixTree::evict`] could free).
    pub fn evictable_size(&self) -> usize {
        self.evictable
    }

    /// Slots held by locked nodes.
    pub fn protected_size(&self) -> usize {
        self.protected
    }

    /// All slots held by the tree, counted node by node (not from the running sizes, so it can
    /// check them).
    pub fn total_size(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.live)
            .map(|n| n.value.len())
            .sum()
    }

    /// Drops every node and lock. All handles, the root's included, become stale.
    pub fn reset(&mut self) {
        self.free_nodes.clear();
        self.lru.clear();
        for (index, node) in self.nodes.iter_mut().enumerate() {
            node.generation = node.generation.wrapping_add(1);
            node.children.clear();
            if index as u32 != ROOT {
                node.live = false;
                node.key = Vec::new();
                node.value = Vec::new();
                self.free_nodes.push(index as u32);
            }
        }
        self.evictable = 0;
        self.protected = 0;
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.nodes[ROOT as usize].last_access = self.clock;
        self.clock
    }

    /// Stamps `index` as used at `now`, re-queueing it for eviction if it is an unlocked leaf.
    fn touch(&mut self, index: u32, now: u64) {
        self.nodes[index as usize].last_access = now;
        self.offer(index);
    }

    /// Queues `index` for eviction if it is an unlocked leaf; rebuilds the queue when stale
    /// entries outnumber the nodes, so it stays O(nodes) in size.
    fn offer(&mut self, index: u32) {
        if !self.is_unlocked_leaf(index) {
            return;
        }
        self.lru.push(self.nodes[index as usize].last_access, index);
        if self.lru.exceeds(2 * self.nodes.len() + 64) {
            let leaves = (0..self.nodes.len() as u32).filter(|&i| self.is_unlocked_leaf(i));
            let entries = leaves.map(|i| (self.nodes[i as usize].last_access, i));
            self.lru.rebuild(entries.collect());
        }
    }

    /// Whether `index` is a live non-root node without locks or children (evictable now).
    fn is_unlocked_leaf(&self, index: u32) -> bool {
        let n = &self.nodes[index as usize];
        index != ROOT && n.live && n.lock_ref == 0 && n.children.len() == 0
    }

    fn aligned(&self, len: usize) -> usize {
        len - len % self.page_size
    }

    /// The length of the common prefix of `a` and `b`, rounded down to whole pages.
    fn key_match(&self, a: &[u32], b: &[u32]) -> usize {
        self.aligned(common_prefix(a, b))
    }

    fn handle(&self, index: u32) -> NodeHandle {
        (u64::from(self.nodes[index as usize].generation) << 32) | u64::from(index)
    }

    fn resolve(&self, handle: NodeHandle) -> Result<u32> {
        let index = (handle & u64::from(u32::MAX)) as u32;
        match self.nodes.get(index as usize) {
            Some(node) if node.live && self.handle(index) == handle => Ok(index),
            _ => Err(Error::InvalidArgument(format!(
                "unknown or stale radix node handle {handle}"
            ))),
        }
    }

    /// Splits `child` after `at` tokens: a new node takes the first `at` tokens and becomes
    /// `child`'s parent. `child` keeps its index, so handles to it stay valid.
    fn split(&mut self, child: u32, at: usize) -> u32 {
        let c = &mut self.nodes[child as usize];
        let key: Vec<u32> = c.key.drain(..at).collect();
        let value: Vec<u32> = c.value.drain(..at).collect();
        let (parent, lock_ref, last_access) = (c.parent, c.lock_ref, c.last_access);
        let upper = self.new_node(key, value, parent, last_access);
        self.nodes[upper as usize].lock_ref = lock_ref;
        let first_lower = self.nodes[child as usize].key[..self.page_size].to_vec();
        self.nodes[upper as usize]
            .children
            .insert(&first_lower, child);
        self.nodes[child as usize].parent = upper;
        let first_upper = self.nodes[upper as usize].key[..self.page_size].to_vec();
        self.nodes[parent as usize]
            .children
            .insert(&first_upper, upper);
        upper
    }

    fn new_node(&mut self, key: Vec<u32>, value: Vec<u32>, parent: u32, now: u64) -> u32 {
        if let Some(index) = self.free_nodes.pop() {
            let node = &mut self.nodes[index as usize];
            (node.key, node.value, node.parent, node.lock_ref) = (key, value, parent, 0);
            (node.last_access, node.live) = (now, true);
            return index;
        }
        self.nodes.push(Node {
            key,
            value,
            children: Children::new(self.page_size),
            parent,
            lock_ref: 0,
            last_access: now,
            generation: 0,
            live: true,
        });
        (self.nodes.len() - 1) as u32
    }

    fn free_node(&mut self, index: u32) {
        let node = &mut self.nodes[index as usize];
        node.generation = node.generation.wrapping_add(1);
        node.live = false;
        node.key = Vec::new();
        node.value = Vec::new();
        node.children.clear();
        self.free_nodes.push(index);
    }
}

/// The length of the common prefix of `a` and `b`: whole chunks are compared as slices (a
/// `memcmp`, several times faster than a token at a time on long prompts), then the rest.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    const CHUNK: usize = 32;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    i + a[i..n]
        .iter()
        .zip(&b[i..n])
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests;
