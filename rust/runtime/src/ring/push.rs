//! Pushing: the producer half of `ShmRing`, including the splitting of messages longer than a
//! frame (see the module docs of `ring` for the framing).

use std::ptr;
use std::sync::atomic::Ordering::{Acquire, Release};

use super::{frame_size, Local, Positions, Role, ShmRing, FRAME_HEADER, MORE};
use crate::error::Result;

impl ShmRing {
    /// Appends one message of any length. `Ok(true)` once it is accepted: a message of at most
    /// `max_frame_len()` bytes is then in the ring; a longer one is split, its first parts are in
    /// the ring and the rest, copied, is pushed before anything else by the next `try_push` or
    /// `flush` (call `flush` until it returns `true` to deliver it without pushing more).
    /// `Ok(false)`, with nothing accepted, when there is no room now: for the message (or its
    /// first part), or for the rest of an earlier split message, which has to go first. An error
    /// only when the ring is corrupt or this is not the producer.
    pub fn try_push(&self, payload: &[u8]) -> Result<bool> {
        let mut guard = self.lock(Role::Producer)?;
        let local = &mut *guard;
        if !local.split.is_empty() && !self.push_rest(local)? {
            return Ok(false);
        }
        if payload.len() > self.max_frame_len() {
            return self.push_split(local, payload);
        }
        if !self.has_room(&mut local.pos, frame_size(payload.len()))? {
            return Ok(false);
        }
        self.write_frame(&mut local.pos, payload, false);
        self.header().head.store(local.pos.own, Release);
        drop(guard);
        self.wake_peer();
        Ok(true)
    }

    /// Appends a message only if it fits in one frame and there is room for it now (after the
    /// rest of any split message, which goes first): a push that never leaves parts of its own
    /// behind for `flush`. `Ok(false)`, with nothing accepted, otherwise.
    pub fn try_push_frame(&self, payload: &[u8]) -> Result<bool> {
        if payload.len() > self.max_frame_len() {
            return Ok(false);
        }
        self.try_push(payload)
    }

    /// Pushes what fits of the rest of a split message accepted earlier. `Ok(true)` when nothing
    /// is left to push (at once when no split message is pending).
    pub fn flush(&self) -> Result<bool> {
        let mut guard = self.lock(Role::Producer)?;
        let local = &mut *guard;
        Ok(local.split.is_empty() || self.push_rest(local)?)
    }

    /// The payload room a producer that waits to push a `need`-byte message must wait for: room
    /// for the next part of a pending split message (which goes first), for the first part of a
    /// message longer than a frame, else for the message. Never more than one frame can hold, so
    /// the wait can end.
    pub(super) fn room_needed(&self, need: usize) -> usize {
        if self.role == Role::Consumer {
            return need;
        }
        let local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        let rest = local.split.len() - local.split_pushed;
        if rest > 0 {
            rest.min(self.part_len())
        } else if need > self.max_frame_len() {
            self.part_len()
        } else {
            need
        }
    }

    /// Accepts a message longer than a frame if its first part fits now; keeps a copy of the
    /// parts that do not fit yet.
    fn push_split(&self, local: &mut Local, payload: &[u8]) -> Result<bool> {
        if !self.has_room(&mut local.pos, frame_size(self.part_len()))? {
            return Ok(false);
        }
        let pushed = self.push_parts(&mut local.pos, payload)?;
        if pushed < payload.len() {
            local.split = payload[pushed..].to_vec();
            local.split_pushed = 0;
        }
        Ok(true)
    }

    /// Pushes what fits of the pending rest of a split message; whether all of it is pushed.
    fn push_rest(&self, local: &mut Local) -> Result<bool> {
        let pushed = self.push_parts(&mut local.pos, &local.split[local.split_pushed..])?;
        local.split_pushed += pushed;
        if local.split_pushed < local.split.len() {
            return Ok(false);
        }
        local.split = Vec::new(); // a big message's copy: give the memory back
        local.split_pushed = 0;
        Ok(true)
    }

    /// Pushes the parts of `rest`, the end of a split message, while they fit, flagging `MORE`
    /// on all but the one that ends it; returns how many bytes it pushed. Each part is published
    /// at once, so the consumer can drain it while the next one is written.
    fn push_parts(&self, pos: &mut Positions, rest: &[u8]) -> Result<usize> {
        let mut pushed = 0;
        while pushed < rest.len() {
            let len = (rest.len() - pushed).min(self.part_len());
            if !self.has_room(pos, frame_size(len))? {
                break;
            }
            let end = pushed + len;
            self.write_frame(pos, &rest[pushed..end], end < rest.len());
            self.header().head.store(pos.own, Release);
            self.wake_peer();
            pushed = end;
        }
        Ok(pushed)
    }

    /// Whether `size` more bytes fit at `pos.own`; loads the consumer's `tail` only when the copy
    /// in `pos` says they do not.
    fn has_room(&self, pos: &mut Positions, size: usize) -> Result<bool> {
        let head = pos.own;
        let capacity = self.capacity as u64;
        if head + size as u64 - pos.other > capacity {
            let tail = self.header().tail.load(Acquire);
            self.check_positions(head, tail)?;
            pos.other = tail;
            if head + size as u64 - tail > capacity {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Writes one frame at `pos.own` and moves `pos.own` past it; the caller checked the room
    /// (`has_room`) and publishes `head` afterwards.
    fn write_frame(&self, pos: &mut Positions, payload: &[u8], more: bool) {
        let mask = self.capacity - 1;
        let offset = pos.own as usize & mask;
        let word = payload.len() as u32 | if more { MORE } else { 0 };
        let mut frame_header = [0u8; FRAME_HEADER];
        frame_header[..4].copy_from_slice(&word.to_le_bytes());
        frame_header[4..].copy_from_slice(&(!word).to_le_bytes());
        let body = (offset + FRAME_HEADER) & mask;
        let first = payload.len().min(self.capacity - body);
        // SAFETY: `offset` is 8-aligned and the capacity a multiple of 8, so the 8 header bytes
        // fit before the end; the payload (at most `max_frame_len`, so its length leaves the top
        // bit of `word` free) is split at the end of the area and wraps to its start. All of
        // [head, head + frame_size) is free (`has_room` saw it below an acquired `tail`), so the
        // consumer is not reading these bytes.
        unsafe {
            let data = self.data();
            ptr::copy_nonoverlapping(frame_header.as_ptr(), data.add(offset), FRAME_HEADER);
            ptr::copy_nonoverlapping(payload.as_ptr(), data.add(body), first);
            ptr::copy_nonoverlapping(payload.as_ptr().add(first), data, payload.len() - first);
        }
        pos.own += frame_size(payload.len()) as u64;
    }
}
