//! The free list of KV slots: SGLang's `TokenToKVPoolAllocator` (page size 1) and
//! `PagedTokenToKVPoolAllocator` (page size > 1) semantics.
//!
//! The pool has `(num_pages + 1) * page_size` slots; page 0 (slot 0 when the page size is 1) is
//! padding that is never handed out. The lowest free pages leave first, so a server reuses the
//! slots it has touched: the CPU's KV cache lies in pages the kernel zeroes at their first touch
//! (`memory_pool.py`), and a free list that cycled through the whole pool would meet a fresh
//! page on each new token until every page had been touched once (measured: a decode step of
//! 16 sequences 0.41 ms slower on fresh pages than on touched ones), and would make all of the
//! pool resident. Every page is either free or allocated, never both, and a free that names a
//! slot which is not allocated fails as a whole, leaving the allocator as it was.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};

/// Hands out KV slots (whole pages of them) and takes them back.
#[derive(Debug, Clone)]
pub struct TokenAllocator {
    page_size: usize,
    num_pages: usize,
    /// The free pages, lowest first.
    free_pages: BinaryHeap<Reverse<u32>>,
    allocated: Vec<bool>,
    /// Per slot: the batch number of the last `free` that named it (duplicate detection).
    slot_mark: Vec<u32>,
    /// Per page: the batch number of the last `free` that named it (page deduplication).
    page_mark: Vec<u32>,
    batch: u32,
}

impl TokenAllocator {
    /// An allocator of `size` slots (rounded down to whole pages), all free, beside the padding
    /// page 0. Slot ids run up to `(size / page_size + 1) * page_size - 1`.
    pub fn new(size: usize, page_size: usize) -> Result<Self> {
        if page_size == 0 {
            return Err(Error::InvalidArgument("page_size must be ≥ 1".into()));
        }
        let num_pages = size / page_size;
        let total = num_pages
            .checked_add(1)
            .and_then(|pages| pages.checked_mul(page_size))
            .filter(|&t| t <= u32::MAX as usize)
            .ok_or_else(|| Error::InvalidArgument(format!("{size} slots do not fit in u32")))?;
        let mut allocator = TokenAllocator {
            page_size,
            num_pages,
            free_pages: BinaryHeap::with_capacity(num_pages),
            allocated: vec![false; num_pages + 1],
            slot_mark: vec![0; total],
            page_mark: vec![0; num_pages + 1],
            batch: 0,
        };
        allocator.clear();
        Ok(allocator)
    }

    /// The number of allocatable slots (padding excluded).
    pub fn size(&self) -> usize {
        self.num_pages * self.page_size
    }

    /// The number of slots per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The number of free slots.
    pub fn available(&self) -> usize {
        self.free_pages.len() * self.page_size
    }

    /// `n` slots (a whole number of pages: the lowest free ones, in slot order) or `None` when
    /// fewer are free; a shortfall takes nothing.
    pub fn alloc(&mut self, n: usize) -> Result<Option<Vec<u32>>> {
        if !n.is_multiple_of(self.page_size) {
            return Err(Error::InvalidArgument(format!(
                "alloc of {n} slots is not a whole number of pages of {}",
                self.page_size
            )));
        }
        let pages = n / self.page_size;
        if pages > self.free_pages.len() {
            return Ok(None);
        }
        let mut slots = Vec::with_capacity(n);
        let lowest = std::iter::from_fn(|| self.free_pages.pop().map(|Reverse(page)| page));
        for page in lowest.take(pages) {
            self.allocated[page as usize] = true;
            let first = page * self.page_size as u32;
            slots.extend(first..first + self.page_size as u32);
        }
        Ok(Some(slots))
    }

    /// Gives back the pages of `slots`. Naming any slot of a page frees the whole page (as
    /// SGLang's paged allocator does); naming a slot twice, a slot out of range, the padding or
    /// a slot whose page is free is an error that names the slot and frees nothing.
    pub fn free(&mut self, slots: &[u32]) -> Result<()> {
        self.next_batch();
        let batch = self.batch;
        let mut pages = Vec::with_capacity(slots.len().div_ceil(self.page_size));
        for &slot in slots {
            let page = slot as usize / self.page_size;
            let problem = if page == 0 {
                "the reserved padding slot"
            } else if page > self.num_pages {
                "out of range"
            } else if self.slot_mark[slot as usize] == batch {
                "named twice in one free"
            } else if !self.allocated[page] {
                "not allocated"
            } else {
                ""
            };
            if !problem.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "cannot free slot {slot}: {problem}"
                )));
            }
            self.slot_mark[slot as usize] = batch;
            if self.page_mark[page] != batch {
                self.page_mark[page] = batch;
                pages.push(page as u32);
            }
        }
        for &page in &pages {
            self.allocated[page as usize] = false;
        }
        self.free_pages.extend(pages.into_iter().map(Reverse));
        Ok(())
    }

    /// Frees every slot.
    pub fn clear(&mut self) {
        self.free_pages = (1..=self.num_pages as u32).map(Reverse).collect();
        self.allocated.fill(false);
    }

    /// Whether `slot`'s page is allocated (false for the padding and out-of-range slots).
    pub fn is_allocated(&self, slot: u32) -> bool {
        let page = slot as usize / self.page_size;
        page != 0 && self.allocated.get(page).copied().unwrap_or(false)
    }

    fn next_batch(&mut self) {
        if self.batch == u32::MAX {
            self.slot_mark.fill(0);
            self.page_mark.fill(0);
            self.batch = 0;
        }
        self.batch += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_the_lowest_free_slots_and_never_the_padding() {
        let mut a = TokenAllocator::new(4, 1).unwrap();
        assert_eq!(a.available(), 4);
        assert_eq!(a.alloc(3), Ok(Some(vec![1, 2, 3])));
        assert_eq!(a.alloc(2), Ok(None));
        assert_eq!(a.available(), 1);
        a.free(&[2, 1]).unwrap();
        assert_eq!(a.alloc(3), Ok(Some(vec![1, 2, 4])));
        a.clear();
        assert_eq!(a.alloc(4), Ok(Some(vec![1, 2, 3, 4])));
        assert!(!a.is_allocated(0));
    }

    #[test]
    fn bad_frees_name_the_slot_and_change_nothing() {
        let mut a = TokenAllocator::new(4, 1).unwrap();
        a.alloc(2).unwrap();
        for (slots, bad) in [(&[1, 3][..], 3), (&[1, 1], 1), (&[0], 0), (&[2, 9], 9)] {
            let err = a.free(slots).unwrap_err();
            assert!(err.to_string().contains(&format!("slot {bad}:")), "{err}");
            assert_eq!(a.available(), 2);
            assert!(a.is_allocated(1) && a.is_allocated(2));
        }
        a.free(&[1, 2]).unwrap();
        assert!(a.free(&[1]).is_err(), "double free across calls");
    }

    #[test]
    fn pages_are_allocated_and_freed_whole() {
        let mut a = TokenAllocator::new(9, 4).unwrap();
        assert_eq!((a.size(), a.available()), (8, 8));
        assert!(a.alloc(3).is_err());
        assert_eq!(a.alloc(4), Ok(Some(vec![4, 5, 6, 7])));
        assert_eq!(a.alloc(8), Ok(None));
        a.free(&[5, 6]).unwrap();
        assert_eq!(a.available(), 8);
        assert!(a.free(&[4]).is_err());
        assert_eq!(a.alloc(8), Ok(Some(vec![4, 5, 6, 7, 8, 9, 10, 11])));
    }

    #[test]
    fn rejects_pools_that_do_not_fit() {
        assert!(TokenAllocator::new(4, 0).is_err());
        assert!(TokenAllocator::new(u32::MAX as usize, 1).is_err());
        // The padding page makes one page more than `size / page_size`: that count must not
        // wrap around to an empty pool whose free list still names every u32 page.
        assert!(TokenAllocator::new(usize::MAX, 1).is_err());
        assert!(TokenAllocator::new(usize::MAX, 2).is_err());
    }
}
