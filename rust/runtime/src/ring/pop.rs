//! Popping: the consumer half of `ShmRing`, including the reassembly of split messages (see the
//! module docs of `ring` for the framing).

use std::ptr;
use std::sync::atomic::Ordering::{Acquire, Release};

use super::{frame_size, Positions, Role, ShmRing, FRAME_HEADER, MORE};
use crate::error::Result;

/// A message at the front of the ring, handed to `try_pop_with` for copying out: one frame, or
/// the parts of a split message popped so far followed by its last part, still in the ring.
pub struct Frame<'a> {
    ring: &'a ShmRing,
    /// The parts before the last one (empty for a message of one frame).
    parts: &'a [u8],
    /// Where the payload of the last (or only) frame starts in the data area.
    offset: usize,
    /// Its length.
    last: usize,
}

impl Frame<'_> {
    /// The message length in bytes.
    pub fn len(&self) -> usize {
        self.parts.len() + self.last
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the message into `dst`, which must be exactly `len()` bytes long.
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(
            dst.len(),
            self.len(),
            "destination must match the message length"
        );
        let (parts, dst) = dst.split_at_mut(self.parts.len());
        parts.copy_from_slice(self.parts);
        self.ring.copy_out(self.offset, dst);
    }
}

/// A frame header read and checked by `next_frame`.
struct FrameAt {
    /// Where its payload starts in the data area.
    offset: usize,
    len: usize,
    more: bool,
}

impl ShmRing {
    /// Removes the message at the front, letting `take` copy it out first. `Ok(None)` when no
    /// whole message is there: the ring is empty, or only some parts of a split message have
    /// arrived (they are popped into a buffer of this handle, freeing their room for the rest).
    pub fn try_pop_with<T>(&self, take: impl FnOnce(&Frame<'_>) -> T) -> Result<Option<T>> {
        let mut guard = self.lock(Role::Consumer)?;
        let local = &mut *guard;
        loop {
            let Some(at) = self.next_frame(&mut local.pos)? else {
                return Ok(None);
            };
            let size = frame_size(at.len) as u64;
            if at.more {
                let start = local.split.len();
                local.split.resize(start + at.len, 0);
                self.copy_out(at.offset, &mut local.split[start..]);
                // Published at once: the producer may be waiting for this room to go on.
                local.pos.own += size;
                self.header().tail.store(local.pos.own, Release);
                self.wake_peer();
                continue;
            }
            let frame = Frame {
                ring: self,
                parts: &local.split,
                offset: at.offset,
                last: at.len,
            };
            // `take` runs before anything of its message is released: if it panics, the message
            // is still there to pop again.
            let taken = take(&frame);
            if !local.split.is_empty() {
                local.split = Vec::new(); // a big message's buffer: give the memory back
            }
            local.pos.own += size;
            self.header().tail.store(local.pos.own, Release);
            drop(guard);
            self.wake_peer();
            return Ok(Some(taken));
        }
    }

    /// Removes and returns the message at the front, or `None` when no whole message is there.
    pub fn try_pop(&self) -> Result<Option<Vec<u8>>> {
        self.try_pop_with(|frame| {
            let mut out = vec![0; frame.len()];
            frame.copy_to(&mut out);
            out
        })
    }

    /// The frame at `pos.own`, its header checked against what the producer published; `None`
    /// when the ring is empty.
    fn next_frame(&self, pos: &mut Positions) -> Result<Option<FrameAt>> {
        let tail = pos.own;
        if tail == pos.other {
            let head = self.header().head.load(Acquire);
            self.check_positions(head, tail)?;
            pos.other = head;
            if head == tail {
                return Ok(None);
            }
        }
        let offset = tail as usize & (self.capacity - 1);
        let mut frame_header = [0u8; FRAME_HEADER];
        // SAFETY: `offset` is 8-aligned inside the area, so 8 bytes fit; they were published by
        // the `head` we acquired. The copy is into a local array, read once and validated below.
        unsafe { ptr::copy_nonoverlapping(self.data().add(offset), frame_header.as_mut_ptr(), 8) };
        let word = u32::from_le_bytes(frame_header[..4].try_into().expect("4 bytes"));
        let check = u32::from_le_bytes(frame_header[4..].try_into().expect("4 bytes"));
        let (len, more) = ((word & !MORE) as usize, word & MORE != 0);
        let available = pos.other - tail;
        if check != !word || frame_size(len) as u64 > available || (more && len == 0) {
            return Err(self.corrupt(format!(
                "frame header at {tail} claims {len} bytes (more parts: {more}, check \
                 {check:#x}) with {available} bytes published"
            )));
        }
        Ok(Some(FrameAt {
            offset: (offset + FRAME_HEADER) & (self.capacity - 1),
            len,
            more,
        }))
    }

    /// Copies `dst.len()` payload bytes starting at `offset` in the data area, wrapping at its
    /// end, into `dst`.
    fn copy_out(&self, offset: usize, dst: &mut [u8]) {
        let first = dst.len().min(self.capacity - offset);
        // SAFETY: `offset < capacity` and `first <= capacity - offset`, and the rest wraps to the
        // start with `dst.len() - first <= capacity` (`next_frame` checked the frame against the
        // bytes published, which are at most `capacity`), so both source ranges lie inside the
        // data area; `dst` is a distinct local buffer. The bytes were published by the producer's
        // `Release` store of `head` that `next_frame` acquired, and the producer does not touch
        // them until our `tail` store; a corrupt producer can only make us copy wrong bytes, never
        // read out of bounds.
        unsafe {
            let data = self.data();
            ptr::copy_nonoverlapping(data.add(offset), dst.as_mut_ptr(), first);
            ptr::copy_nonoverlapping(data, dst.as_mut_ptr().add(first), dst.len() - first);
        }
    }
}
