//! Sleeping and waking: the doorbell half of `ShmRing` (see the module docs of `ring` for the
//! protocol and its memory ordering).

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::fence;
use std::sync::atomic::Ordering::{Acquire, Relaxed, SeqCst};
use std::time::{Duration, Instant};

use super::{frame_size, shm, Role, ShmRing, Wake};
use crate::error::Result;

impl ShmRing {
    /// After publishing a position: rings the peer's doorbell if it announced it is sleeping.
    /// When the peer is busy this is one fence and one load, no system call.
    pub(super) fn wake_peer(&self) {
        let peer_flag = self.flags().1;
        fence(SeqCst);
        if peer_flag.load(Relaxed) != 0 && peer_flag.swap(0, Relaxed) != 0 {
            let byte = 1u8;
            // SAFETY: `bell_fd` is open for writing and `byte` is one readable byte. We hold the
            // FIFO read-write, so the write cannot raise SIGPIPE; `EAGAIN` means the FIFO already
            // holds unread bells, which wake the peer as well as ours would.
            unsafe { libc::write(self.bell_fd.as_raw_fd(), (&raw const byte).cast(), 1) };
        }
    }

    /// Whether this side can proceed now: data to pop, or room for a `need`-byte payload (at most
    /// `max_frame_len`: see `room_needed`).
    fn can_proceed(&self, need: usize) -> bool {
        let header = self.header();
        let head = header.head.load(Acquire);
        let tail = header.tail.load(Acquire);
        match self.role {
            Role::Consumer => head != tail,
            Role::Producer => {
                let used = head.wrapping_sub(tail);
                used.saturating_add(frame_size(need) as u64) <= self.capacity as u64
            }
        }
    }

    /// Polls the ring, without sleeping and without announcing anything, for up to `budget`:
    /// whether this side can proceed now. A short spin right after activity saves the doorbell
    /// round trip (write, `epoll`, read) when the peer answers quickly; it never replaces the
    /// sleep that follows when it returns `false`.
    pub fn spin(&self, need: usize, budget: Duration) -> bool {
        let need = self.room_needed(need);
        let start = Instant::now();
        loop {
            for _ in 0..32 {
                if self.can_proceed(need) {
                    return true;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= budget {
                return self.can_proceed(need);
            }
        }
    }

    /// Announces that this side is about to sleep on `fileno()`. Returns `false` when it should
    /// not sleep because it can already proceed (the announcement is then withdrawn). `need` is
    /// the length of the message a producer waits to push; it waits for room for what that push
    /// would write first (see `room_needed`: never more than fits). A consumer ignores `need`.
    pub fn prepare_wait(&self, need: usize) -> bool {
        let need = self.room_needed(need);
        let my_flag = self.flags().0;
        my_flag.store(1, Relaxed);
        fence(SeqCst);
        if self.peer_gone_at_attach || self.can_proceed(need) {
            my_flag.store(0, Relaxed);
            return false;
        }
        true
    }

    /// Ends a sleep on `fileno()` (after a wake-up or a timeout): drains the doorbell and
    /// withdraws the announcement. `PeerGone` when the peer is gone and, for a consumer, the ring
    /// is also empty (frames pushed before the producer left are still delivered); else `Ready`.
    pub fn finish_wait(&self) -> Result<Wake> {
        self.flags().0.store(0, Relaxed);
        let gone = self.peer_gone_at_attach || self.drain_bell()?;
        let drained = self.role == Role::Producer || !self.can_proceed(0);
        Ok(if gone && drained {
            Wake::PeerGone
        } else {
            Wake::Ready
        })
    }

    /// Reads pending bells. Returns whether the peer attached and has since closed its end: a
    /// read of 0 bytes means the FIFO has no writer left, and the peer's pid in the header says
    /// it had been there.
    pub(super) fn drain_bell(&self) -> Result<bool> {
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: `wait_fd` is open for reading and `buf` is writable for its length.
            let n = unsafe { libc::read(self.fileno(), buf.as_mut_ptr().cast(), buf.len()) };
            match n {
                0 => return Ok(self.peer_pid() != 0),
                n if n > 0 && (n as usize) < buf.len() => return Ok(false),
                n if n > 0 => continue,
                _ => match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(false),
                    Some(libc::EINTR) => continue,
                    _ => return Err(shm::os_error("cannot read doorbell", &self.name)),
                },
            }
        }
    }

    /// Blocks until this side may proceed (see `prepare_wait`), the peer goes away, or `timeout`
    /// passes. `Ready` can be spurious (for instance after a signal): the caller retries.
    pub fn wait(&self, need: usize, timeout: Option<Duration>) -> Result<Wake> {
        let need = self.room_needed(need);
        if !self.prepare_wait(need) {
            return if self.peer_gone_at_attach {
                self.finish_wait()
            } else {
                Ok(Wake::Ready)
            };
        }
        let millis = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as libc::c_int);
        let mut fds = libc::pollfd {
            fd: self.fileno(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `fds` is one valid `pollfd`; `poll` only writes its `revents`.
        let n = unsafe { libc::poll(&mut fds, 1, millis) };
        let woke = self.finish_wait()?;
        if n == 0 && woke == Wake::Ready && !self.can_proceed(need) {
            return Ok(Wake::TimedOut);
        }
        Ok(woke)
    }
}
