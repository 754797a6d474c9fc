//! Binding of `srt_runtime::ring::ShmRing` as `srt._rust.ShmRing`: messages of any length in, the
//! same messages out (the core splits and reassembles those longer than a frame). Blocking waits
//! and large pushes release the GIL. A gone peer raises `BrokenPipeError`.

use std::time::Duration;

use pyo3::exceptions::{PyBrokenPipeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use srt_runtime::ring::{Role, ShmRing, Wake};

use crate::to_py_err;

/// Pushes of at least this many bytes copy without holding the GIL.
const DETACH_BYTES: usize = 64 * 1024;

/// One end (producer or consumer) of a shared-memory ring of byte frames.
#[pyclass(module = "srt._rust", name = "ShmRing", frozen)]
pub struct PyShmRing {
    inner: ShmRing,
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Producer => "producer",
        Role::Consumer => "consumer",
    }
}

impl PyShmRing {
    fn wake_to_bool(&self, wake: Wake) -> PyResult<bool> {
        match wake {
            Wake::Ready => Ok(true),
            Wake::TimedOut => Ok(false),
            Wake::PeerGone => {
                let peer = match self.inner.role() {
                    Role::Producer => Role::Consumer,
                    Role::Consumer => Role::Producer,
                };
                Err(PyBrokenPipeError::new_err(format!(
                    "ring {:?}: its {} (pid {}) is gone",
                    self.inner.name(),
                    role_name(peer),
                    self.inner.peer_pid()
                )))
            }
        }
    }
}

#[pymethods]
impl PyShmRing {
    /// Creates the named ring with a data area of `capacity` bytes (a power of two).
    #[staticmethod]
    fn create(name: &str, capacity: usize) -> PyResult<()> {
        ShmRing::create(name, capacity).map_err(to_py_err)
    }

    /// Removes the ring's names; returns whether any existed. Attached ends keep working.
    #[staticmethod]
    fn unlink(name: &str) -> bool {
        ShmRing::unlink(name)
    }

    /// Attaches to the named ring as `"producer"` or `"consumer"`.
    #[staticmethod]
    fn attach(name: &str, role: &str) -> PyResult<Self> {
        let role = match role {
            "producer" => Role::Producer,
            "consumer" => Role::Consumer,
            other => {
                let message = format!("role must be 'producer' or 'consumer', not {other:?}");
                return Err(PyValueError::new_err(message));
            }
        };
        let inner = ShmRing::attach(name, role).map_err(to_py_err)?;
        Ok(PyShmRing { inner })
    }

    /// Appends one message of any length; `False` (nothing accepted) when there is no room now.
    /// A message longer than `max_frame_len` is split: accepted once its first part is in; the
    /// rest is pushed before anything else, by later pushes or `flush()`.
    fn try_push(&self, py: Python<'_>, data: &[u8]) -> PyResult<bool> {
        let pushed = if data.len() >= DETACH_BYTES {
            py.detach(|| self.inner.try_push(data))
        } else {
            self.inner.try_push(data)
        };
        pushed.map_err(to_py_err)
    }

    /// Appends a message if it fits in one frame and there is room now; `False` (nothing
    /// accepted) otherwise, also for a message `try_push` would split.
    fn try_push_frame(&self, py: Python<'_>, data: &[u8]) -> PyResult<bool> {
        let pushed = if data.len() >= DETACH_BYTES {
            py.detach(|| self.inner.try_push_frame(data))
        } else {
            self.inner.try_push_frame(data)
        };
        pushed.map_err(to_py_err)
    }

    /// Pushes what fits of the rest of a split message; `True` when nothing is left to push.
    fn flush(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.inner.flush()).map_err(to_py_err)
    }

    /// Removes and returns the oldest message, or `None` when no whole message is there yet.
    fn try_pop<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let popped = self.inner.try_pop_with(|frame| {
            PyBytes::new_with(py, frame.len(), |buf| {
                frame.copy_to(buf);
                Ok(())
            })
        });
        popped.map_err(to_py_err)?.transpose()
    }

    /// Removes and returns up to `max` messages, oldest first, stopping once they hold
    /// `max_bytes` (at least one message; an empty list when none is there): one call for a
    /// burst, small enough to stay in cache.
    fn try_pop_many<'py>(
        &self,
        py: Python<'py>,
        max: usize,
        max_bytes: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let frames = PyList::empty(py);
        let mut bytes = 0;
        while frames.len() < max && (frames.is_empty() || bytes < max_bytes) {
            match self.try_pop(py)? {
                Some(frame) => {
                    bytes += frame.as_bytes().len();
                    frames.append(frame)?;
                }
                None => break,
            }
        }
        Ok(frames)
    }

    /// Polls, GIL released and without sleeping, for up to `timeout` seconds until this end may
    /// proceed (data to pop; room for `need` bytes); returns whether it may.
    #[pyo3(signature = (timeout, need = 0))]
    fn spin(&self, py: Python<'_>, timeout: f64, need: usize) -> PyResult<bool> {
        if !(timeout.is_finite() && timeout >= 0.0) {
            return Err(PyValueError::new_err(format!("bad timeout {timeout}")));
        }
        let budget = Duration::from_secs_f64(timeout);
        Ok(py.detach(|| self.inner.spin(need, budget)))
    }

    /// The descriptor this end sleeps on; readable when the peer rang or went away.
    fn fileno(&self) -> i32 {
        self.inner.fileno()
    }

    /// Announces a sleep on `fileno()`; `False` when this end can proceed now and must not sleep.
    /// A producer passes the length of the message it waits to push (it waits for room for
    /// what that push writes first: a part of a long message, or the rest of a split one).
    #[pyo3(signature = (need = 0))]
    fn prepare_wait(&self, need: usize) -> bool {
        self.inner.prepare_wait(need)
    }

    /// Ends a sleep on `fileno()`. Raises `BrokenPipeError` when the peer is gone (for a
    /// consumer: and the ring is drained).
    fn finish_wait(&self) -> PyResult<()> {
        let wake = self.inner.finish_wait().map_err(to_py_err)?;
        self.wake_to_bool(wake).map(drop)
    }

    /// Blocks, without the GIL, until this end may proceed or `timeout` seconds pass; returns
    /// whether it may proceed (wake-ups can be spurious). Raises `BrokenPipeError` when the peer
    /// is gone.
    #[pyo3(signature = (timeout = None, need = 0))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>, need: usize) -> PyResult<bool> {
        let timeout = match timeout {
            Some(t) if t.is_finite() && t >= 0.0 => Some(Duration::from_secs_f64(t)),
            Some(t) => return Err(PyValueError::new_err(format!("bad timeout {t}"))),
            None => None,
        };
        let wake = py
            .detach(|| self.inner.wait(need, timeout))
            .map_err(to_py_err)?;
        py.check_signals()?;
        self.wake_to_bool(wake)
    }

    /// The ring's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// `"producer"` or `"consumer"`.
    #[getter]
    fn role(&self) -> &'static str {
        role_name(self.inner.role())
    }

    /// The data area's size in bytes.
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    /// The longest message pushed as one frame; longer ones are split into parts.
    #[getter]
    fn max_frame_len(&self) -> usize {
        self.inner.max_frame_len()
    }

    /// The longest part of a split message (a quarter of the ring).
    #[getter]
    fn part_len(&self) -> usize {
        self.inner.part_len()
    }

    /// The peer's pid, or 0 while it has not attached.
    #[getter]
    fn peer_pid(&self) -> u32 {
        self.inner.peer_pid()
    }

    fn __repr__(&self) -> String {
        let (name, role) = (self.inner.name(), role_name(self.inner.role()));
        format!(
            "ShmRing(name={name:?}, role={role:?}, capacity={})",
            self.inner.capacity()
        )
    }
}

/// Registers the ring class on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyShmRing>()
}
