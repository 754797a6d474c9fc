//! The radix tree's self-check, used by tests (Rust and Python) after every operation.

use super::{RadixTree, ROOT};
use crate::error::{Error, Result};

impl RadixTree {
    /// Checks the invariants listed in the module docs, walking the whole tree.
    pub fn validate(&self) -> Result<()> {
        let broken = |what: String| Err(Error::Invariant(what));
        let (mut evictable, mut protected, mut seen) = (0, 0, 0);
        let queued = self.lru.entries();
        let mut stack = vec![ROOT];
        while let Some(index) = stack.pop() {
            let node = &self.nodes[index as usize];
            seen += 1;
            if !node.live {
                return broken(format!("radix node {index} is reachable but dead"));
            }
            for child in node.children.values() {
                let c = &self.nodes[child as usize];
                let whole = !c.key.is_empty() && c.key.len().is_multiple_of(self.page_size);
                if c.parent != index || !whole || c.key.len() != c.value.len() {
                    return broken(format!("radix node {child} has a bad key or parent"));
                }
                if node.children.get(&c.key[..self.page_size]) != Some(child) {
                    return broken(format!("radix node {child} is filed under the wrong key"));
                }
                if index != ROOT && c.lock_ref > node.lock_ref {
                    return broken(format!("radix node {child} is locked more than its parent"));
                }
                stack.push(child);
            }
            if self.is_unlocked_leaf(index) && !queued.contains(&(node.last_access, index)) {
                return broken(format!("unlocked leaf {index} is not queued for eviction"));
            }
            if index != ROOT {
                *(if node.lock_ref == 0 {
                    &mut evictable
                } else {
                    &mut protected
                }) += node.value.len();
            }
        }
        if seen != self.nodes.iter().filter(|n| n.live).count() {
            return broken("a live radix node is unreachable".into());
        }
        if (evictable, protected) != (self.evictable, self.protected) {
            return broken(format!(
                "radix sizes are {}/{} but the nodes hold {evictable}/{protected}",
                self.evictable, self.protected
            ));
        }
        Ok(())
    }
}
