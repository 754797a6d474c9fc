//! Runs one piece of work on several threads: on the OpenMP threads already in the process when
//! there are some (PyTorch's CPU build brings libgomp and exports its symbols), else on threads
//! spawned for the call.
//!
//! Why OpenMP's threads: the model runner alternates our kernels with PyTorch's operators many
//! times per forward. PyTorch's OpenMP workers keep spinning for a while after each of its
//! parallel regions; threads of our own would compete with them for the same few cores. Running
//! our work in OpenMP's team shares the cores instead, and a team of spinning workers starts a
//! region within microseconds. The team size follows `torch.set_num_threads`
//! (`omp_get_max_threads`).
//!
//! What must stay true: the work closure does not panic (an unwind cannot cross OpenMP's C
//! frames; it would abort the process), and it splits its work by the `(thread, threads)` it is
//! given, which may be fewer threads than asked for.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

type GompParallel = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint);
type OmpQuery = unsafe extern "C" fn() -> c_int;

/// The three entry points of libgomp that a parallel region needs.
struct OpenMp {
    parallel: GompParallel,
    thread_num: OmpQuery,
    num_threads: OmpQuery,
    max_threads: OmpQuery,
}

static OPENMP: OnceLock<OpenMp> = OnceLock::new();

fn symbol(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT only searches the symbols already loaded; `name` is a
    // valid NUL-terminated string.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!address.is_null()).then_some(address)
}

/// libgomp, when the process has loaded it into its global symbols. Looked up until found (a
/// process may load PyTorch after its first call), then kept.
fn openmp() -> Option<&'static OpenMp> {
    if let Some(found) = OPENMP.get() {
        return Some(found);
    }
    let parallel = symbol(c"GOMP_parallel")?;
    let thread_num = symbol(c"omp_get_thread_num")?;
    let num_threads = symbol(c"omp_get_num_threads")?;
    let max_threads = symbol(c"omp_get_max_threads")?;
    // SAFETY: these are libgomp's exported functions, whose C signatures are the ones given
    // (GOMP_parallel is libgomp's ABI for `#pragma omp parallel` since GCC 4.9).
    let found = unsafe {
        OpenMp {
            parallel: std::mem::transmute::<*mut c_void, GompParallel>(parallel),
            thread_num: std::mem::transmute::<*mut c_void, OmpQuery>(thread_num),
            num_threads: std::mem::transmute::<*mut c_void, OmpQuery>(num_threads),
            max_threads: std::mem::transmute::<*mut c_void, OmpQuery>(max_threads),
        }
    };
    Some(OPENMP.get_or_init(|| found))
}

/// How many threads `run` uses: OpenMP's current team size, else the machine's cores.
pub fn max_threads() -> usize {
    match openmp() {
        // SAFETY: omp_get_max_threads takes no arguments and only reads OpenMP's settings.
        Some(omp) => usize::try_from(unsafe { (omp.max_threads)() })
            .unwrap_or(1)
            .max(1),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// What a parallel region's threads share: the work and the library that runs it.
struct Region<'a> {
    work: &'a (dyn Fn(usize, usize) + Sync),
    omp: &'static OpenMp,
}

extern "C" fn region_entry(data: *mut c_void) {
    // SAFETY: `data` is the `Region` that `run` passed to GOMP_parallel, alive until
    // GOMP_parallel returns, which is after every thread of the team has left this function.
    let region = unsafe { &*(data as *const Region<'_>) };
    // SAFETY: called inside the parallel region, where both queries are defined.
    let (thread, threads) = unsafe { ((region.omp.thread_num)(), (region.omp.num_threads)()) };
    let threads = usize::try_from(threads).unwrap_or(1).max(1);
    let thread = usize::try_from(thread).unwrap_or(0).min(threads - 1);
    (region.work)(thread, threads);
}

/// Calls `work(thread, threads)` once for each of `threads` threads (the caller's included)
/// and returns when all have finished. `threads` may come out smaller than asked: never more
/// than [`max_threads`], so that no count can start more threads than the machine runs.
pub fn run(threads: usize, work: &(dyn Fn(usize, usize) + Sync)) {
    let threads = threads.min(max_threads());
    if threads <= 1 {
        work(0, 1);
        return;
    }
    match openmp() {
        Some(omp) => {
            let region = Region { work, omp };
            let team = c_uint::try_from(threads).unwrap_or(c_uint::MAX);
            // SAFETY: `region_entry` reads `region` only while GOMP_parallel runs, and
            // GOMP_parallel returns after the whole team is done; flags 0 asks for nothing
            // special (no proc_bind).
            unsafe {
                (omp.parallel)(
                    region_entry,
                    &region as *const Region<'_> as *mut c_void,
                    team,
                    0,
                )
            };
        }
        None => std::thread::scope(|scope| {
            for thread in 1..threads {
                scope.spawn(move || work(thread, threads));
            }
            work(0, threads);
        }),
    }
}

/// Pins the threads that [`run`] uses, one CPU each: thread `t` of a team of `cpus.len()` runs
/// on `cpus[t]` from now on. Returns how many threads were pinned, which is fewer than
/// `cpus.len()` when OpenMP's team is smaller (`torch.set_num_threads` sets it; set it first).
///
/// Why per thread: OpenMP keeps its workers between regions, thread `t` of a team of a given
/// size being the same worker each time, so a worker pinned once stays pinned for every later
/// region of PyTorch's and of ours. Pinning the process instead (`sched_setaffinity` of the
/// pid) would let the workers still trade places between its CPUs.
pub fn pin_threads(cpus: &[usize]) -> crate::Result<usize> {
    if cpus.is_empty() {
        return Err(crate::Error::InvalidArgument(
            "no CPU to pin threads to".into(),
        ));
    }
    // CPU_SETSIZE bits fit in a cpu_set_t; a larger index cannot be set in one.
    let limit = usize::try_from(libc::CPU_SETSIZE).unwrap_or(0);
    if let Some(&cpu) = cpus.iter().find(|&&cpu| cpu >= limit) {
        return Err(crate::Error::InvalidArgument(format!(
            "CPU {cpu} is beyond the {limit} a CPU set holds"
        )));
    }
    let pinned = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicI32::new(0);
    run(cpus.len(), &|thread, _threads| {
        // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET writes one bit of it, at an
        // index checked above to be below CPU_SETSIZE; sched_setaffinity(0, ...) applies to
        // the calling thread and reads only the set passed with its size.
        let status = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpus[thread], &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if status == 0 {
            pinned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        } else {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(-1);
            failed.store(errno, std::sync::atomic::Ordering::Relaxed);
        }
    });
    match failed.into_inner() {
        0 => Ok(pinned.into_inner()),
        errno => Err(crate::Error::InvalidArgument(format!(
            "pinning a thread to one of CPUs {cpus:?} failed: {}",
            std::io::Error::from_raw_os_error(errno)
        ))),
    }
}

/// The CPUs the calling thread may run on.
pub fn thread_cpus() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is the empty set; sched_getaffinity(0, ...) fills it for
    // the calling thread, writing at most its size; CPU_ISSET reads bits below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        let limit = usize::try_from(libc::CPU_SETSIZE).unwrap_or(0);
        (0..limit)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_thread_runs_once_with_its_own_index() {
        let seen: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
        let team = AtomicUsize::new(0);
        run(4, &|thread, threads| {
            seen[thread].fetch_add(1, Ordering::Relaxed);
            team.store(threads, Ordering::Relaxed);
        });
        let threads = team.load(Ordering::Relaxed);
        assert!((1..=4).contains(&threads));
        for (index, count) in seen.iter().enumerate() {
            assert_eq!(count.load(Ordering::Relaxed), usize::from(index < threads));
        }
    }

    #[test]
    fn no_more_threads_than_the_machine_runs() {
        let limit = max_threads();
        let calls = AtomicUsize::new(0);
        run(limit + 3, &|thread, threads| {
            assert!(thread < threads && threads <= limit);
            calls.fetch_add(1, Ordering::Relaxed);
        });
        assert!((1..=limit).contains(&calls.load(Ordering::Relaxed)));
    }

    #[test]
    fn one_thread_runs_on_the_caller() {
        let caller = std::thread::current().id();
        run(1, &|thread, threads| {
            assert_eq!((thread, threads), (0, 1));
            assert_eq!(std::thread::current().id(), caller);
        });
        assert!(max_threads() >= 1);
    }
    #[test]
    fn pinned_threads_stay_on_their_cpu() {
        // In a thread of its own, so that pinning does not follow the test harness's threads.
        std::thread::spawn(|| {
            let allowed = thread_cpus();
            assert!(!allowed.is_empty());
            let cpus: Vec<usize> = allowed.iter().copied().rev().collect();
            let pinned = pin_threads(&cpus).unwrap();
            assert!(pinned >= 1 && pinned <= cpus.len());
            // The caller is thread 0 of every team: it now runs on cpus[0] alone.
            assert_eq!(thread_cpus(), vec![cpus[0]]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pinning_refuses_empty_and_impossible_sets() {
        assert!(pin_threads(&[]).is_err());
        let beyond = usize::try_from(libc::CPU_SETSIZE).unwrap();
        assert!(pin_threads(&[beyond]).is_err());
    }
}
