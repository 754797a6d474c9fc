//! `ShmRing`: a single-producer single-consumer ring of length-prefixed frames in a named POSIX
//! shared-memory segment, with FIFO doorbells so that a side with nothing to do sleeps in the
//! kernel (an idle server uses no CPU). Linux only.
//!
//! Layout of the segment `/dev/shm/<name>` (all integers little endian):
//!
//! ```text
//! [0, 64)    magic, version, capacity           written once by `create`
//! [64, 128)  head: bytes ever pushed             written by the producer only
//! [128,192)  tail: bytes ever popped             written by the consumer only
//! [192,256)  producer/consumer pids, the "consumer sleeping" and "producer waiting" flags
//! [256, 256 + capacity)  the data area; capacity is a power of two
//! ```
//!
//! A frame is an 8-byte header (`u32` word, `u32` bitwise-not of the word) followed by the
//! payload, padded to a multiple of 8 bytes. The word's low 31 bits are the payload length (the
//! capacity is at most 2^31, so a length never needs the top bit); its top bit, `MORE`, says that
//! the frame is a part of a split message and more parts follow. Positions are multiples of 8 and
//! the capacity is a power of two >= 64, so a frame header never straddles the end of the data
//! area; a payload may wrap around it. `head` and `tail` only grow (a `u64` of bytes never wraps
//! in practice).
//!
//! Messages: a message of at most `max_frame_len()` bytes is one frame, exactly as above (no
//! extra header, no extra copy). A longer one is split by the producer into parts of at most
//! `part_len()` bytes (a frame of a quarter of the ring, so that the producer keeps pushing while
//! the consumer drains), every part but the last flagged `MORE`, so a message may be many times
//! the ring's size. The consumer appends `MORE` parts to a buffer of its own and hands out the
//! message when the unflagged last part arrives: `try_pop` returns `None` until then, and callers
//! never see parts. A split message is accepted by `try_push` as soon as its first part is in the
//! ring; the producer keeps a copy of the parts that did not fit yet and pushes them before
//! anything else, at the next `try_push` or `flush` (which a caller repeats until it returns
//! `true`, waiting for room in between). So the parts of one message are never interleaved with
//! other frames, whatever the caller does, and a push never fails on the size of its payload.
//! `try_push_frame` refuses what it would have to split (for callers that must not leave parts
//! behind), and a producer that waits for room (`prepare_wait`, `spin`, `wait`) waits for room for
//! what its next push writes first, a part or a frame: never for more than the ring can hold.
//!
//! Memory ordering: the producer writes a frame's bytes, then stores `head` with `Release`; the
//! consumer loads `head` with `Acquire` before reading those bytes. The consumer copies a frame
//! out, then stores `tail` with `Release`; the producer loads `tail` with `Acquire` before
//! overwriting that space. Sleeping uses the store-buffering (Dekker) pattern: the sleeper stores
//! its flag, issues a `SeqCst` fence, and re-checks the ring; the waker stores its position,
//! issues a `SeqCst` fence, and checks the flag. The two fences forbid both sides from missing
//! each other's store, so a wake-up is never lost. A waker clears the flag with `swap` before
//! writing one byte to the doorbell, so a busy ring costs no system call per message.
//!
//! Doorbells are two named FIFOs, `<name>.data` (producer rings the consumer) and `<name>.space`
//! (consumer rings the producer). Each side opens the FIFO it sleeps on read-only and the other
//! one read-write. When a process dies the kernel closes its descriptors, the FIFO its peer
//! sleeps on loses its last writer, and the peer's `poll` wakes with `POLLHUP`: a dead peer is
//! noticed at once, without timers. A nonblocking read that returns 0 tells "no writer" apart from
//! "no bell yet" (`EAGAIN`); the peer's pid in the header tells "gone" apart from "not attached".
//!
//! The names exist only until both ends have attached: the second side to attach unlinks them,
//! so no crash after start-up can leave anything in `/dev/shm`. The other side may be buggy or
//! corrupt: every header field and frame length read from shared memory is bounds-checked, a
//! violation is an `Error::Invariant`, and the ring then stays poisoned. A split message's
//! total size is not bounded by the ring (only by the consumer's memory), but every part is: its
//! length is checked against the bytes published, and a `MORE` part may not be empty.

mod doorbell;
mod pop;
mod push;
mod shm;

pub use pop::Frame;

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::{self, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Mutex, MutexGuard};

use crate::error::{Error, Result};
use shm::Mapping;

const MAGIC: u64 = u64::from_le_bytes(*b"SRTRING1");
const VERSION: u32 = 1;
const HEADER_SIZE: usize = 256;
const FRAME_HEADER: usize = 8;
/// The frame-header flag of a part of a split message that more parts follow.
const MORE: u32 = 1 << 31;
/// The smallest data area a ring may have.
pub const MIN_CAPACITY: usize = 64;
/// The largest data area a ring may have (frame lengths are `u32`).
pub const MAX_CAPACITY: usize = 1 << 31;

/// The header at the start of the segment. Every field is atomic because the other process may
/// write any of them at any time (legitimately or not); `repr(C)` fixes the layout above.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    _reserved: AtomicU32,
    capacity: AtomicU64,
    _pad0: [u64; 5],
    head: AtomicU64,
    _pad1: [u64; 7],
    tail: AtomicU64,
    _pad2: [u64; 7],
    producer_pid: AtomicU32,
    consumer_pid: AtomicU32,
    consumer_sleeping: AtomicU32,
    producer_waiting: AtomicU32,
    _pad3: [u64; 6],
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_SIZE);

/// Which end of a ring a handle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Pushes frames; sleeps on the "space" doorbell when the ring is full.
    Producer,
    /// Pops frames; sleeps on the "data" doorbell when the ring is empty.
    Consumer,
}

/// The outcome of a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The condition may hold now (wake-ups can be spurious): try again.
    Ready,
    /// The timeout passed without a wake-up.
    TimedOut,
    /// The other end is gone (its process exited or dropped the ring), and for a consumer the
    /// ring is drained.
    PeerGone,
}

/// The positions one side keeps to itself, so it reads the other side's cache line only when the
/// copy it has is not enough.
struct Positions {
    /// The producer's `head`, or the consumer's `tail`.
    own: u64,
    /// The last value of the other side's position that this side loaded.
    other: u64,
}

/// The state one side keeps to itself, behind the handle's mutex.
struct Local {
    pos: Positions,
    /// Producer: the copy of a split message's parts that did not fit when it was accepted,
    /// pushed before anything else (`split[split_pushed..]` is left). Consumer: the parts of a
    /// split message popped so far. Empty otherwise.
    split: Vec<u8>,
    /// Producer: how many bytes of `split` are pushed. Consumer: always 0.
    split_pushed: usize,
}

impl Local {
    fn new(own: u64, other: u64) -> Local {
        Local {
            pos: Positions { own, other },
            split: Vec::new(),
            split_pushed: 0,
        }
    }
}

/// One end of a shared-memory ring. Dropping it unmaps the segment and closes the doorbells,
/// which the peer sees as this end going away.
pub struct ShmRing {
    name: String,
    role: Role,
    mapping: Mapping,
    capacity: usize,
    local: Mutex<Local>,
    poisoned: AtomicBool,
    peer_gone_at_attach: bool,
    wait_fd: OwnedFd,
    bell_fd: OwnedFd,
}

// SAFETY: the mapping is process-wide and stays valid until drop (`Mapping` holds a raw
// pointer, hence no automatic `Send`). All shared header state is
// atomic; the side-local positions sit behind a mutex that every push/pop holds while it touches
// the data area, so two threads of one process cannot act as two producers (or consumers).
unsafe impl Send for ShmRing {}
// SAFETY: as above; `&self` methods synchronise through the mutex and the atomics.
unsafe impl Sync for ShmRing {}

/// The bytes a frame with a payload of `len` bytes occupies: header plus padded payload.
fn frame_size(len: usize) -> usize {
    FRAME_HEADER + len.div_ceil(8) * 8
}

impl ShmRing {
    /// Creates the named segment (data area of `capacity` bytes, a power of two in
    /// `[MIN_CAPACITY, MAX_CAPACITY]`) and its two doorbell FIFOs. Fails if any name exists.
    pub fn create(name: &str, capacity: usize) -> Result<()> {
        shm::check_name(name)?;
        if !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) || !capacity.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "ring capacity must be a power of two in [{MIN_CAPACITY}, {MAX_CAPACITY}], got \
                 {capacity}"
            )));
        }
        let mapping = shm::create(name, HEADER_SIZE + capacity)?;
        // SAFETY: the mapping is `HEADER_SIZE + capacity` bytes, page aligned, and zero filled,
        // which is a valid `Header` (atomics only); it outlives this reference.
        let header = unsafe { &*(mapping.base() as *const Header) };
        header.version.store(VERSION, Ordering::Relaxed);
        header.capacity.store(capacity as u64, Ordering::Relaxed);
        // Attachers load the magic with `Acquire`, so they see the fields above.
        header.magic.store(MAGIC, Ordering::Release);
        Ok(())
    }

    /// Removes the segment and FIFO names (open handles keep working). Returns whether any of
    /// them existed. Safe to call more than once and from either side.
    pub fn unlink(name: &str) -> bool {
        shm::unlink(name)
    }

    /// Attaches to an existing ring as `role`. Each role can be attached once in the ring's life.
    /// Once both roles are attached, the names are unlinked.
    pub fn attach(name: &str, role: Role) -> Result<ShmRing> {
        shm::check_name(name)?;
        let mapping = shm::open(name)?;
        if mapping.len() < HEADER_SIZE + MIN_CAPACITY {
            let len = mapping.len();
            return Err(Error::Invariant(format!(
                "ring {name:?}: segment of {len} bytes"
            )));
        }
        let (mine, theirs) = match role {
            Role::Producer => (shm::SPACE, shm::DATA),
            Role::Consumer => (shm::DATA, shm::SPACE),
        };
        let wait_fd = shm::open_fifo(name, mine, libc::O_RDONLY)?;
        let bell_fd = shm::open_fifo(name, theirs, libc::O_RDWR)?;
        let ring = ShmRing {
            name: name.to_owned(),
            role,
            mapping,
            capacity: 0,
            local: Mutex::new(Local::new(0, 0)),
            poisoned: AtomicBool::new(false),
            peer_gone_at_attach: false,
            wait_fd,
            bell_fd,
        };
        ring.init_attached()
    }

    /// Validates the header, claims this side's role and loads the positions.
    fn init_attached(mut self) -> Result<ShmRing> {
        let header = self.header();
        if header.magic.load(Ordering::Acquire) != MAGIC
            || header.version.load(Ordering::Relaxed) != VERSION
        {
            return Err(self.corrupt("bad magic or version in the header".into()));
        }
        let capacity = usize::try_from(header.capacity.load(Ordering::Relaxed)).unwrap_or(0);
        if !capacity.is_power_of_two()
            || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity)
            || HEADER_SIZE + capacity != self.mapping.len()
        {
            let map_len = self.mapping.len();
            return Err(self.corrupt(format!("capacity {capacity} does not fit {map_len} bytes")));
        }
        self.capacity = capacity;
        let mine = self.pids().0;
        if let Err(pid) = mine.compare_exchange(0, std::process::id(), SeqCst, SeqCst) {
            return Err(Error::InvalidArgument(format!(
                "ring {:?} already has a {:?} (pid {pid})",
                self.name, self.role
            )));
        }
        let head = self.header().head.load(Ordering::Acquire);
        let tail = self.header().tail.load(Ordering::Acquire);
        self.check_positions(head, tail)?;
        *self.local.get_mut().unwrap_or_else(|e| e.into_inner()) = match self.role {
            Role::Producer => Local::new(head, tail),
            Role::Consumer => Local::new(tail, head),
        };
        // Our pid store and this load are both SeqCst: of two sides attaching at once, at least
        // one sees the other and unlinks the names.
        if self.pids().1.load(SeqCst) != 0 {
            shm::unlink(&self.name);
            // A peer that attached and already died closed its doorbell end before we opened
            // ours, which `poll` does not report: probe once.
            self.peer_gone_at_attach = self.drain_bell()?;
        }
        Ok(self)
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is at least `HEADER_SIZE` bytes, page aligned, lives as long as
        // `self`, and holds only atomics, which tolerate concurrent writes by the other process.
        unsafe { &*(self.mapping.base() as *const Header) }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: `HEADER_SIZE + capacity == map_len`, so the data area lies inside the mapping.
        unsafe { self.mapping.base().add(HEADER_SIZE) }
    }

    /// (this side's pid slot, the peer's pid slot)
    fn pids(&self) -> (&AtomicU32, &AtomicU32) {
        let header = self.header();
        match self.role {
            Role::Producer => (&header.producer_pid, &header.consumer_pid),
            Role::Consumer => (&header.consumer_pid, &header.producer_pid),
        }
    }

    /// (the flag this side raises before sleeping, the flag the peer raises)
    fn flags(&self) -> (&AtomicU32, &AtomicU32) {
        let header = self.header();
        match self.role {
            Role::Producer => (&header.producer_waiting, &header.consumer_sleeping),
            Role::Consumer => (&header.consumer_sleeping, &header.producer_waiting),
        }
    }

    /// The ring's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Which end this handle is.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The size of the data area in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The longest message pushed as a single frame; longer ones are split into parts.
    pub fn max_frame_len(&self) -> usize {
        self.capacity - FRAME_HEADER
    }

    /// The longest part of a split message: a part's frame fills a quarter of the ring.
    pub fn part_len(&self) -> usize {
        self.capacity / 4 - FRAME_HEADER
    }

    /// The peer's pid, or 0 while the peer has not attached.
    pub fn peer_pid(&self) -> u32 {
        self.pids().1.load(Ordering::Relaxed)
    }

    /// The descriptor this side sleeps on: readable when the peer rang or went away.
    pub fn fileno(&self) -> RawFd {
        self.wait_fd.as_raw_fd()
    }

    fn corrupt(&self, what: String) -> Error {
        self.poisoned.store(true, Ordering::Relaxed);
        Error::Invariant(format!("ring {:?} is corrupt: {what}", self.name))
    }

    fn check_positions(&self, head: u64, tail: u64) -> Result<()> {
        if tail > head || head - tail > self.capacity as u64 || !(head | tail).is_multiple_of(8) {
            return Err(self.corrupt(format!("head {head} and tail {tail} are inconsistent")));
        }
        Ok(())
    }

    fn lock(&self, role: Role) -> Result<MutexGuard<'_, Local>> {
        if self.role != role {
            return Err(Error::InvalidArgument(format!(
                "ring {:?} is attached as the {:?}",
                self.name, self.role
            )));
        }
        if self.poisoned.load(Ordering::Relaxed) {
            return Err(Error::Invariant(format!("ring {:?} is corrupt", self.name)));
        }
        // A panic while holding the lock leaves positions that still satisfy the invariants
        // (they move only past a frame that is complete, and a consumer's `take` runs before its
        // message is released), so a poisoned mutex is usable.
        Ok(self.local.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[cfg(test)]
mod tests;
