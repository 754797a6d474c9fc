//! Unit tests of `ring.rs`, kept beside it so that the structure's file stays readable.

use super::*;
use std::collections::VecDeque;
use std::ptr;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

fn unique_name() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, SeqCst);
    format!("srt-test-ring-{}-{n}", std::process::id())
}

fn pair(capacity: usize) -> (ShmRing, ShmRing) {
    let name = unique_name();
    ShmRing::create(&name, capacity).expect("create");
    let producer = ShmRing::attach(&name, Role::Producer).expect("attach producer");
    let consumer = ShmRing::attach(&name, Role::Consumer).expect("attach consumer");
    (producer, consumer)
}

/// xorshift64*: deterministic sizes and bytes without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn frames_round_trip_across_wraparound_like_a_queue() {
    let (producer, consumer) = pair(256);
    let mut model = VecDeque::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for step in 0..20_000u32 {
        if rng.below(2) == 0 {
            let len = rng.below(producer.max_frame_len() + 1);
            let frame: Vec<u8> = (0..len).map(|i| (i as u32 ^ step) as u8).collect();
            let used: usize = model.iter().map(|f: &Vec<u8>| frame_size(f.len())).sum();
            let fits = used + frame_size(len) <= producer.capacity();
            assert_eq!(producer.try_push(&frame).unwrap(), fits);
            if fits {
                model.push_back(frame);
            }
        } else {
            assert_eq!(consumer.try_pop().unwrap(), model.pop_front());
        }
    }
    while let Some(frame) = model.pop_front() {
        assert_eq!(consumer.try_pop().unwrap(), Some(frame));
    }
    assert_eq!(consumer.try_pop().unwrap(), None);
}

#[test]
fn spin_sees_data_and_room_and_gives_up_after_its_budget() {
    let (producer, consumer) = pair(64);
    let budget = Duration::from_millis(2);
    let start = std::time::Instant::now();
    assert!(!consumer.spin(0, budget));
    assert!(start.elapsed() >= budget);
    assert!(producer.spin(48, Duration::ZERO));
    assert!(producer.try_push(&[7; 48]).unwrap());
    assert!(!producer.spin(8, Duration::ZERO));
    assert!(consumer.spin(0, budget));
    assert_eq!(consumer.try_pop().unwrap(), Some(vec![7; 48]));
    assert!(producer.spin(48, Duration::ZERO));
}

#[test]
fn a_full_ring_refuses_until_popped() {
    let (producer, consumer) = pair(64);
    assert_eq!(producer.max_frame_len(), 56);
    assert!(producer.try_push(&[1; 24]).unwrap()); // 32 bytes
    assert!(producer.try_push(&[2; 17]).unwrap()); // 8 + 24 = 32 bytes: full
    assert!(!producer.try_push(&[]).unwrap());
    assert!(
        producer.prepare_wait(0),
        "a full ring lets the producer sleep"
    );
    assert_eq!(consumer.try_pop().unwrap(), Some(vec![1; 24]));
    let mut fds = libc::pollfd {
        fd: producer.fileno(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid `pollfd`; a zero timeout only checks the doorbell.
    let rung = unsafe { libc::poll(&mut fds, 1, 0) };
    assert_eq!(rung, 1, "the pop rang the doorbell");
    assert_eq!(producer.finish_wait().unwrap(), Wake::Ready);
    assert!(!producer.prepare_wait(0), "no sleeping while there is room");
    assert!(producer.try_push(&[]).unwrap());
    assert_eq!(consumer.try_pop().unwrap(), Some(vec![2; 17]));
    assert_eq!(consumer.try_pop().unwrap(), Some(vec![]));
}

#[test]
fn roles_are_exclusive_and_checked() {
    let name = unique_name();
    ShmRing::create(&name, 64).unwrap();
    assert!(ShmRing::create(&name, 64).is_err());
    let producer = ShmRing::attach(&name, Role::Producer).unwrap();
    assert!(matches!(producer.try_pop(), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        ShmRing::attach(&name, Role::Producer),
        Err(Error::InvalidArgument(_))
    ));
    assert!(ShmRing::unlink(&name));
    assert!(matches!(
        ShmRing::create(&name, 100),
        Err(Error::InvalidArgument(_))
    ));
    assert!(ShmRing::attach("no-such-ring-for-srt", Role::Consumer).is_err());
}

#[test]
fn the_names_go_away_once_both_ends_attached() {
    let name = unique_name();
    ShmRing::create(&name, 64).unwrap();
    let exists = || std::path::Path::new(&format!("/dev/shm/{name}")).exists();
    let consumer = ShmRing::attach(&name, Role::Consumer).unwrap();
    assert!(exists());
    let producer = ShmRing::attach(&name, Role::Producer).unwrap();
    assert!(!exists());
    assert!(!ShmRing::unlink(&name));
    assert!(producer.try_push(b"still works").unwrap());
    assert_eq!(
        consumer.try_pop().unwrap().as_deref(),
        Some(&b"still works"[..])
    );
}

#[test]
fn a_corrupt_frame_header_is_an_error_and_poisons_the_ring() {
    let (producer, consumer) = pair(64);
    assert!(producer.try_push(b"hello").unwrap());
    // SAFETY: the first 4 bytes of the data area are inside the mapping; nobody reads them
    // concurrently in this test.
    unsafe { ptr::copy_nonoverlapping(1000u32.to_le_bytes().as_ptr(), consumer.data(), 4) };
    assert!(matches!(consumer.try_pop(), Err(Error::Invariant(_))));
    assert!(matches!(consumer.try_pop(), Err(Error::Invariant(_))));
}

#[test]
fn an_impossible_head_is_an_error() {
    let (producer, consumer) = pair(64);
    producer.header().head.store(1 << 20, SeqCst);
    assert!(matches!(consumer.try_pop(), Err(Error::Invariant(_))));
    let (producer, _consumer) = pair(64);
    assert!(producer.try_push(&[0; 56]).unwrap());
    producer.header().tail.store(72, SeqCst); // beyond head: the consumer popped air
    assert!(matches!(
        producer.try_push(&[0; 1]),
        Err(Error::Invariant(_))
    ));
}

#[test]
fn a_consumer_drains_then_sees_its_producer_gone() {
    let (producer, consumer) = pair(64);
    assert_eq!(
        consumer.wait(0, Some(Duration::from_millis(10))).unwrap(),
        Wake::TimedOut
    );
    producer.try_push(b"last words").unwrap();
    drop(producer);
    assert_eq!(consumer.wait(0, None).unwrap(), Wake::Ready);
    assert_eq!(
        consumer.try_pop().unwrap().as_deref(),
        Some(&b"last words"[..])
    );
    assert_eq!(consumer.wait(0, None).unwrap(), Wake::PeerGone);
}

#[test]
fn a_full_producer_sees_its_consumer_gone() {
    let (producer, consumer) = pair(64);
    producer.try_push(&[0; 56]).unwrap();
    let waiter = std::thread::spawn(move || producer.wait(1, None));
    std::thread::sleep(Duration::from_millis(20));
    drop(consumer);
    assert_eq!(waiter.join().unwrap().unwrap(), Wake::PeerGone);
}

#[test]
fn attaching_after_the_peer_left_reports_it_gone() {
    let name = unique_name();
    ShmRing::create(&name, 64).unwrap();
    drop(ShmRing::attach(&name, Role::Producer).unwrap());
    let consumer = ShmRing::attach(&name, Role::Consumer).unwrap();
    assert_eq!(
        consumer.wait(0, Some(Duration::from_secs(5))).unwrap(),
        Wake::PeerGone
    );
}

#[test]
fn blocking_threads_pass_every_message_in_order() {
    let (producer, consumer) = pair(1024);
    const N: u32 = 20_000;
    let sender = std::thread::spawn(move || {
        let mut rng = Rng(7);
        for i in 0..N {
            // One message in 200 is up to 20 times the ring's size.
            let len = match rng.below(200) {
                0 => 4 + rng.below(20 * 1024),
                _ => 4 + rng.below(600),
            };
            let mut frame = vec![(i % 251) as u8; len];
            frame[..4].copy_from_slice(&i.to_le_bytes());
            while !producer.try_push(&frame).unwrap() {
                assert_ne!(producer.wait(len, None).unwrap(), Wake::PeerGone);
            }
            while !producer.flush().unwrap() {
                assert_ne!(producer.wait(0, None).unwrap(), Wake::PeerGone);
            }
        }
    });
    let mut expected = 0u32;
    loop {
        match consumer.try_pop().unwrap() {
            Some(frame) => {
                assert_eq!(frame[..4], expected.to_le_bytes());
                assert!(frame[4..].iter().all(|&b| b == (expected % 251) as u8));
                expected += 1;
            }
            None if consumer.wait(0, None).unwrap() == Wake::PeerGone => break,
            None => {}
        }
    }
    sender.join().unwrap();
    assert_eq!(expected, N);
}

/// A message of `len` bytes, different for every `seed`.
fn message(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31) ^ seed)
        .map(|x| x as u8)
        .collect()
}

#[test]
fn messages_of_any_length_round_trip_in_order_across_wraparound() {
    let (producer, consumer) = pair(256);
    assert_eq!(producer.part_len(), 56);
    let mut sent = VecDeque::new();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut split = 0;
    for step in 0..20_000u32 {
        match rng.below(4) {
            0 | 1 => {
                let len = match rng.below(8) {
                    0 => producer.max_frame_len() + 1 + rng.below(5 * producer.capacity()),
                    _ => rng.below(producer.max_frame_len() + 1),
                };
                let msg = message(len, step);
                if producer.try_push(&msg).unwrap() {
                    split += usize::from(len > producer.max_frame_len());
                    sent.push_back(msg);
                }
            }
            2 => {
                producer.flush().unwrap();
            }
            _ => {
                if let Some(msg) = consumer.try_pop().unwrap() {
                    assert_eq!(Some(msg), sent.pop_front());
                }
            }
        }
    }
    assert!(split > 100, "only {split} split messages were accepted");
    while !sent.is_empty() {
        producer.flush().unwrap();
        if let Some(msg) = consumer.try_pop().unwrap() {
            assert_eq!(Some(msg), sent.pop_front());
        }
    }
    assert!(producer.flush().unwrap());
    assert_eq!(consumer.try_pop().unwrap(), None);
}

#[test]
fn a_consumer_with_some_parts_waits_for_the_last_and_whole_frames_wait_behind_them() {
    let (producer, consumer) = pair(64);
    assert_eq!(producer.part_len(), 8);
    let big = message(100, 1); // 13 parts of 16 bytes at most: 4 fill the ring
    assert!(
        producer.try_push(&big).unwrap(),
        "accepted: its first part fits"
    );
    assert!(!producer.flush().unwrap());
    assert!(
        !producer.try_push(b"small").unwrap(),
        "a whole frame never goes between the parts of a message"
    );
    let mut rounds = 0;
    loop {
        assert_eq!(consumer.try_pop().unwrap(), None, "only some parts are in");
        rounds += 1;
        if producer.flush().unwrap() {
            break;
        }
    }
    assert_eq!(rounds, 3);
    assert!(producer.try_push(b"small").unwrap());
    assert_eq!(consumer.try_pop().unwrap(), Some(big));
    assert_eq!(consumer.try_pop().unwrap().as_deref(), Some(&b"small"[..]));
    assert_eq!(consumer.try_pop().unwrap(), None);
}

#[test]
fn a_producer_waiting_to_push_a_long_message_waits_for_room_for_a_part() {
    let (producer, consumer) = pair(64);
    assert!(
        !producer.prepare_wait(1 << 20),
        "an empty ring has room for the first part of any message"
    );
    assert!(producer.try_push(&[0; 56]).unwrap());
    assert!(!producer.spin(1 << 20, Duration::ZERO));
    assert!(
        producer.prepare_wait(1 << 20),
        "a full ring has no room for a part"
    );
    assert_eq!(consumer.try_pop().unwrap(), Some(vec![0; 56]));
    assert_eq!(producer.finish_wait().unwrap(), Wake::Ready);
    assert!(producer.spin(1 << 20, Duration::ZERO));
    assert_eq!(producer.room_needed(40), 40);
    // 76 bytes: 9 parts of 8 bytes and one of 4; the first 4 fill the ring.
    assert!(producer.try_push(&message(76, 5)).unwrap());
    // The rest goes first: room for its next part is what any push waits for.
    assert_eq!(producer.room_needed(0), 8);
    assert_eq!(producer.room_needed(56), 8);
    assert!(producer.prepare_wait(0));
    assert_eq!(consumer.try_pop().unwrap(), None);
    assert_eq!(producer.finish_wait().unwrap(), Wake::Ready);
    assert!(!producer.flush().unwrap());
    assert_eq!(consumer.try_pop().unwrap(), None);
    assert!(producer.try_push(&message(12, 6)).unwrap());
    assert_eq!(producer.room_needed(0), 0, "all parts are in");
    assert_eq!(consumer.try_pop().unwrap(), Some(message(76, 5)));
    assert_eq!(consumer.try_pop().unwrap(), Some(message(12, 6)));
}

#[test]
fn corrupt_part_headers_are_errors() {
    let write_header = |ring: &ShmRing, word: u32, check: u32| {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&word.to_le_bytes());
        bytes[4..].copy_from_slice(&check.to_le_bytes());
        // SAFETY: the first 8 bytes of the data area are inside the mapping; nobody reads them
        // concurrently in this test.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), ring.data(), 8) };
    };
    for (word, check) in [
        (MORE, !MORE),             // an empty part that says more follow
        (MORE | 60, !(MORE | 60)), // a part longer than what was published
        (MORE | 8, !8u32),         // the flag set without its check
        (8, !(MORE | 8)),          // the flag cleared without its check
        (u32::MAX, 0),             // a length past any capacity
    ] {
        let (producer, consumer) = pair(64);
        assert!(producer.try_push(&message(100, 4)).unwrap());
        write_header(&consumer, word, check);
        let err = consumer.try_pop();
        assert!(
            matches!(err, Err(Error::Invariant(_))),
            "{word:#x}/{check:#x}: {err:?}"
        );
        assert!(matches!(consumer.try_pop(), Err(Error::Invariant(_))));
    }
}

#[test]
fn a_frame_push_refuses_what_it_would_split() {
    let (producer, consumer) = pair(64);
    assert!(!producer.try_push_frame(&[1; 57]).unwrap());
    assert!(producer.try_push_frame(&[2; 56]).unwrap());
    assert_eq!(consumer.try_pop().unwrap(), Some(vec![2; 56]));
    assert_eq!(consumer.try_pop().unwrap(), None);
}
