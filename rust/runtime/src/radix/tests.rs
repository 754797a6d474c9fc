//! Unit tests of `radix.rs`, kept beside it so that the structure's file stays readable.

use super::*;

fn tree_with(page_size: usize, seqs: &[&[u32]]) -> RadixTree {
    let mut tree = RadixTree::new(page_size).unwrap();
    for seq in seqs {
        let slots: Vec<u32> = seq.iter().map(|t| t + 100).collect();
        tree.insert(seq, &slots).unwrap();
    }
    tree.validate().unwrap();
    tree
}

#[test]
fn empty_tree_matches_nothing_at_the_root() {
    let mut tree = RadixTree::new(1).unwrap();
    let (slots, node) = tree.match_prefix(&[1, 2, 3]);
    assert!(slots.is_empty());
    assert_eq!(node, tree.root());
    assert_eq!(tree.lock(node), Ok(0));
    assert!(RadixTree::new(0).is_err());
}

#[test]
fn insert_reports_the_cached_prefix_and_match_splits_edges() {
    let mut tree = tree_with(1, &[&[1, 2, 3, 4]]);
    assert_eq!(tree.insert(&[1, 2, 9], &[0, 0, 50]), Ok(2));
    assert_eq!(tree.total_size(), 5);
    let (slots, node) = tree.match_prefix(&[1, 2, 3, 7]);
    assert_eq!(slots, vec![101, 102, 103]);
    assert_eq!(tree.lock(node), Ok(-3));
    assert_eq!((tree.evictable_size(), tree.protected_size()), (2, 3));
    tree.validate().unwrap();
    assert_eq!(tree.match_prefix(&[1, 2, 9]).0, vec![101, 102, 50]);
    assert!(tree.insert(&[1], &[]).is_err());
}

#[test]
fn a_handle_survives_a_split_above_it() {
    let mut tree = tree_with(1, &[&[1, 2, 3, 4]]);
    let (_, leaf) = tree.match_prefix(&[1, 2, 3, 4]);
    tree.lock(leaf).unwrap();
    tree.match_prefix(&[1, 2]);
    tree.validate().unwrap();
    assert_eq!(tree.protected_size(), 4);
    assert_eq!(tree.unlock(leaf), Ok(4));
    assert_eq!(tree.evictable_size(), 4);
    tree.validate().unwrap();
}

#[test]
fn unlock_below_zero_and_stale_handles_are_errors() {
    let mut tree = tree_with(1, &[&[1, 2], &[3]]);
    let (_, node) = tree.match_prefix(&[1, 2]);
    assert!(matches!(tree.unlock(node), Err(Error::InvalidArgument(_))));
    assert_eq!(tree.evict(10), vec![103, 101, 102]);
    assert!(matches!(tree.lock(node), Err(Error::InvalidArgument(_))));
    assert!(tree.lock(12345).is_err());
    tree.insert(&[5, 6], &[1, 2]).unwrap();
    assert!(
        tree.lock(node).is_err(),
        "a reused arena entry must not revive an old handle"
    );
    let root = tree.root();
    tree.reset();
    assert!(tree.lock(root).is_err());
    assert_eq!((tree.total_size(), tree.evictable_size()), (0, 0));
    tree.validate().unwrap();
}

#[test]
fn evict_goes_in_lru_order_skips_locks_and_climbs_to_parents() {
    let mut tree = tree_with(1, &[&[1, 2, 3], &[1, 2, 4], &[5, 6]]);
    tree.match_prefix(&[1, 2, 3]);
    tree.match_prefix(&[5, 6]);
    let (_, locked) = tree.match_prefix(&[1, 2, 4]);
    tree.lock(locked).unwrap();
    assert_eq!(tree.evict(1), vec![103]);
    assert_eq!(tree.evict(1), vec![105, 106]);
    assert_eq!(tree.evict(100), Vec::<u32>::new());
    tree.unlock(locked).unwrap();
    assert_eq!(tree.evict(100), vec![104, 101, 102]);
    assert_eq!(tree.total_size(), 0);
    tree.validate().unwrap();
}

#[test]
fn stale_queue_entries_are_skipped_and_the_queue_stays_bounded() {
    let mut tree = tree_with(1, &[&[1, 2], &[3, 4], &[5]]);
    for _ in 0..200 {
        let (_, node) = tree.match_prefix(&[1, 2]);
        tree.lock(node).unwrap();
        tree.unlock(node).unwrap();
    }
    tree.match_prefix(&[3, 4]);
    tree.validate().unwrap();
    assert!(!tree.lru.exceeds(2 * tree.nodes.len() + 64));
    assert_eq!(tree.evict(1), vec![105]);
    assert_eq!(tree.evict(2), vec![101, 102]);
    tree.insert(&[6], &[106]).unwrap();
    tree.validate().unwrap();
    assert_eq!(tree.evict(10), vec![103, 104, 106]);
    assert_eq!(tree.lru.pop(), None);
}

#[test]
fn common_prefix_is_exact_around_chunk_boundaries() {
    let a: Vec<u32> = (0..100).collect();
    for at in [0, 1, 31, 32, 33, 64, 99] {
        let mut b = a.clone();
        b[at] = 1000;
        assert_eq!(common_prefix(&a, &b), at);
        assert_eq!(common_prefix(&a[..at], &b), at);
    }
    assert_eq!(common_prefix(&a, &a[..70]), 70);
    assert_eq!(common_prefix(&a, &[]), 0);
}

#[test]
fn pages_are_matched_and_inserted_whole() {
    let mut tree = tree_with(2, &[&[1, 2, 3, 4, 5]]);
    assert_eq!(tree.total_size(), 4);
    assert_eq!(tree.match_prefix(&[1, 2, 3, 9]).0, vec![101, 102]);
    assert_eq!(tree.match_prefix(&[1, 9, 3, 4]).0, Vec::<u32>::new());
    assert_eq!(tree.insert(&[1, 2, 3, 7, 8, 8], &[0, 0, 0, 0, 1, 1]), Ok(2));
    assert_eq!(
        tree.match_prefix(&[1, 2, 3, 7, 8, 8]).0,
        vec![101, 102, 0, 0, 1, 1]
    );
    assert_eq!(tree.total_size(), 8);
    tree.validate().unwrap();
}
