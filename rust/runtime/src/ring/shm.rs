//! The operating-system side of a ring: names, the shared-memory mapping and the doorbell FIFOs.
//! A ring `<name>` is the segment `/dev/shm/<name>` plus the FIFOs `/dev/shm/<name>.data` and
//! `/dev/shm/<name>.space`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::{self, NonNull};

use crate::error::{Error, Result};

const MAX_NAME_LEN: usize = 200;

/// The FIFO the consumer sleeps on (the producer rings it when it pushes).
pub(super) const DATA: &str = "data";
/// The FIFO the producer sleeps on (the consumer rings it when it pops).
pub(super) const SPACE: &str = "space";

/// An OS error as the runtime reports it, naming the ring.
pub(super) fn os_error(what: &str, name: &str) -> Error {
    let err = io::Error::last_os_error();
    Error::InvalidArgument(format!("ring {name:?}: {what}: {err}"))
}

/// Ring names are plain file names: no path tricks, no NUL, nothing hidden.
pub(super) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "ring name {name:?} must be 1-{MAX_NAME_LEN} characters of [A-Za-z0-9._-], not \
             starting with '.'"
        )))
    }
}

fn c_string(s: String) -> CString {
    CString::new(s).expect("a checked ring name has no NUL")
}

fn shm_name(name: &str) -> CString {
    c_string(format!("/{name}"))
}

fn fifo_path(name: &str, which: &str) -> CString {
    c_string(format!("/dev/shm/{name}.{which}"))
}

/// A shared mapping of a whole segment, unmapped on drop.
pub(super) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(fd: &OwnedFd, len: usize, name: &str) -> Result<Mapping> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let fd = fd.as_raw_fd();
        // SAFETY: mapping a valid descriptor at an address the kernel picks aliases no Rust
        // object; the result is checked against MAP_FAILED before use.
        let ptr = unsafe { libc::mmap(ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(os_error("cannot map shared memory", name));
        }
        let base = NonNull::new(ptr.cast()).ok_or_else(|| os_error("null mapping", name))?;
        Ok(Mapping { base, len })
    }

    /// The first byte of the mapping (page aligned).
    pub(super) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The mapping's length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base` maps `len` bytes, and the ring hands out no reference that outlives it.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

fn shm_open(name: &str, flags: libc::c_int) -> Result<OwnedFd> {
    // SAFETY: the name is a valid NUL-terminated string that `shm_open` does not retain.
    let fd = unsafe { libc::shm_open(shm_name(name).as_ptr(), flags | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return Err(os_error("cannot open shared memory", name));
    }
    // SAFETY: `fd` was just returned by `shm_open` and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates the segment (zero filled, `len` bytes) and both FIFOs; fails if any of them exists.
/// On failure, whatever this call created is removed again (and nothing else).
pub(super) fn create(name: &str, len: usize) -> Result<Mapping> {
    let fifos = [fifo_path(name, DATA), fifo_path(name, SPACE)];
    let mut made_fifos = 0;
    let mut made_segment = false;
    let created = (|| {
        for path in &fifos {
            // SAFETY: the path is a valid NUL-terminated string.
            if unsafe { libc::mkfifo(path.as_ptr(), 0o600) } != 0 {
                return Err(os_error("cannot create doorbell FIFO", name));
            }
            made_fifos += 1;
        }
        let fd = shm_open(name, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR)?;
        made_segment = true;
        // SAFETY: `fd` is a valid descriptor of the segment just created.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(os_error("cannot size shared memory", name));
        }
        Mapping::new(&fd, len, name)
    })();
    if created.is_err() {
        // SAFETY: valid NUL-terminated strings naming only what this call created.
        unsafe {
            for path in &fifos[..made_fifos] {
                libc::unlink(path.as_ptr());
            }
            if made_segment {
                libc::shm_unlink(shm_name(name).as_ptr());
            }
        }
    }
    created
}

/// Maps an existing segment whole.
pub(super) fn open(name: &str) -> Result<Mapping> {
    let fd = shm_open(name, libc::O_RDWR)?;
    // SAFETY: `stat` is plain old data; all-zero is a valid value for it.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is valid and `stat` is writable memory of the type `fstat` fills.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(os_error("cannot stat shared memory", name));
    }
    let len = usize::try_from(stat.st_size).unwrap_or(0);
    if len == 0 {
        return Err(Error::Invariant(format!(
            "ring {name:?}: the segment is empty"
        )));
    }
    Mapping::new(&fd, len, name)
}

/// Opens one doorbell FIFO, nonblocking; `O_RDONLY` never waits for a writer, `O_RDWR` never
/// waits for a reader (Linux).
pub(super) fn open_fifo(name: &str, which: &str, flags: libc::c_int) -> Result<OwnedFd> {
    let flags = flags | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: the path is a valid NUL-terminated string that `open` does not retain.
    let fd = unsafe { libc::open(fifo_path(name, which).as_ptr(), flags) };
    if fd < 0 {
        return Err(os_error("cannot open doorbell FIFO", name));
    }
    // SAFETY: `fd` was just returned by `open` and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Removes the segment and FIFO names; returns whether any of them existed.
pub(super) fn unlink(name: &str) -> bool {
    if check_name(name).is_err() {
        return false;
    }
    // SAFETY: valid NUL-terminated strings; a missing name only makes the call fail.
    unsafe {
        let mut existed = libc::shm_unlink(shm_name(name).as_ptr()) == 0;
        for which in [DATA, SPACE] {
            existed |= libc::unlink(fifo_path(name, which).as_ptr()) == 0;
        }
        existed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_file_names() {
        for good in ["a", "srt-1234-scheduler", "x.y_z-0"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        let long = "n".repeat(MAX_NAME_LEN + 1);
        for bad in ["", ".hidden", "a/b", "../x", "a b", "nul\0", long.as_str()] {
            assert!(
                matches!(check_name(bad), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn create_refuses_existing_names_and_unlink_removes_all() {
        let name = format!("srt-test-shm-{}", std::process::id());
        let mapping = create(&name, 4096).expect("create");
        assert_eq!(mapping.len(), 4096);
        assert!(create(&name, 4096).is_err());
        // The failed second create must not have removed the first one's names.
        assert!(open(&name).is_ok());
        assert!(unlink(&name));
        assert!(!unlink(&name));
        assert!(open(&name).is_err());
        for which in [DATA, SPACE] {
            assert!(!std::path::Path::new(&format!("/dev/shm/{name}.{which}")).exists());
        }
    }
}
