//! Thin, audited wrappers over the OS calls the channel needs: POSIX shared
//! memory, `mmap`, `flock`, futexes, process liveness and the robust mutex.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use rustix::fs::{FlockOperation, Mode};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::shm;

/// Folder where Linux exposes POSIX shared-memory objects.
pub const SHM_DIR: &str = "/dev/shm";

/// Creates a new shared-memory object of `size` bytes (fails if it exists).
pub fn shm_create(name: &str, size: u64) -> io::Result<OwnedFd> {
    let fd = shm::open(
        format!("/{name}").as_str(),
        shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
        Mode::RUSR | Mode::WUSR,
    )?;
    if let Err(e) = rustix::fs::ftruncate(&fd, size) {
        let _ = shm::unlink(format!("/{name}").as_str());
        return Err(e.into());
    }
    Ok(fd)
}

/// Opens an existing shared-memory object read-write.
pub fn shm_open_existing(name: &str) -> io::Result<OwnedFd> {
    Ok(shm::open(
        format!("/{name}").as_str(),
        shm::OFlags::RDWR,
        Mode::empty(),
    )?)
}

/// Removes a shared-memory object's name (mappings stay valid).
pub fn shm_unlink(name: &str) -> io::Result<()> {
    Ok(shm::unlink(format!("/{name}").as_str())?)
}

/// Whether the shared-memory name `name` still refers to the file behind `fd`
/// (not removed, and not removed and created again by someone else).
pub fn is_named(fd: impl AsFd, name: &str) -> bool {
    let (Ok(ours), Ok(named)) = (
        rustix::fs::fstat(fd),
        rustix::fs::stat(format!("{SHM_DIR}/{name}").as_str()),
    ) else {
        return false;
    };
    (ours.st_dev, ours.st_ino) == (named.st_dev, named.st_ino)
}

/// Size in bytes of the file behind `fd`.
pub fn file_size(fd: impl AsFd) -> io::Result<u64> {
    Ok(rustix::fs::fstat(fd)?.st_size as u64)
}

/// Free bytes on the file system that holds `/dev/shm`.
pub fn shm_free_bytes() -> io::Result<u64> {
    let st = rustix::fs::statvfs(SHM_DIR)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// A shared, read-write mapping of a whole file; unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all cross-thread access to it
// goes through atomics or the process-shared mutex (see layout.rs).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared and read-write.
    pub fn new(fd: impl AsFd, len: u64) -> io::Result<Self> {
        let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh mapping at an address the kernel picks; it aliases
        // nothing in this process, and `Drop` unmaps exactly this range.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len })
    }

    /// Base address.
    pub fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length of the mapping in bytes.
    pub fn size(&self) -> usize {
        self.len
    }

    /// Faults in `[off, off + len)` for writing, so a later copy runs at memcpy
    /// speed and a full `/dev/shm` is reported as an error instead of SIGBUS.
    pub fn populate_write(&self, off: u64, len: u64) -> io::Result<()> {
        let start = off & !(crate::layout::PAGE - 1);
        let end = off.saturating_add(len);
        if end > self.len as u64 || start >= end {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        // SAFETY: the range lies inside this mapping (checked above) and
        // MADV_POPULATE_WRITE only faults pages in; it never changes contents.
        let rc = unsafe {
            libc::madvise(
                self.base().add(start as usize).cast(),
                (end - start) as usize,
                MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINVAL) {
            // Kernel older than 5.14: the copy itself will fault the pages in.
            return Ok(());
        }
        Err(err)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range `new` mapped; every user of the
        // mapping holds an `Arc` to it, so nothing can still point into it.
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Takes a shared `flock` (blocking is never needed: holders only ever share).
pub fn lock_shared(fd: impl AsFd) -> io::Result<()> {
    Ok(rustix::fs::flock(
        fd,
        FlockOperation::NonBlockingLockShared,
    )?)
}

/// Drops this file description's `flock`.
pub fn unlock(fd: impl AsFd) -> io::Result<()> {
    Ok(rustix::fs::flock(fd, FlockOperation::Unlock)?)
}

/// Tries to take an exclusive `flock`; `Ok(false)` if someone else holds a lock.
pub fn try_lock_exclusive(fd: impl AsFd) -> io::Result<bool> {
    match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Sleeps on a shared futex while `*word == expected`, at most `timeout`.
/// Returns on wake, on a changed value, on timeout or on a signal alike:
/// callers re-check their condition in a loop.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // Shared (not PRIVATE) futex: the word lives in memory mapped by several processes.
    let _ = rustix::thread::futex::wait(
        word,
        rustix::thread::futex::Flags::empty(),
        expected,
        Some(&ts),
    );
}

/// Wakes every process sleeping on `word`.
pub fn futex_wake_all(word: &AtomicU32) {
    let _ =
        rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
}

/// This process's id and start time (clock ticks since boot), cached per
/// process (a forked child computes its own).
pub fn self_identity() -> (u32, u64) {
    static CACHED_PID: AtomicU32 = AtomicU32::new(0);
    static CACHED_START: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    if CACHED_PID.load(Ordering::Acquire) == pid {
        return (pid, CACHED_START.load(Ordering::Relaxed));
    }
    let start = proc_start_time(pid).unwrap_or(0);
    CACHED_START.store(start, Ordering::Relaxed);
    CACHED_PID.store(pid, Ordering::Release);
    (pid, start)
}

/// Start time of `pid` from `/proc/<pid>/stat` (field 22), or `None` if the
/// process does not exist or is a zombie (dead, not yet reaped).
pub fn proc_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // `rest` starts at field 3 (state); field 22 is 19 further.
    fields.nth(18)?.parse().ok()
}

/// Whether the process `(pid, start)` is still running.
pub fn process_alive(pid: u32, start: u64) -> bool {
    match proc_start_time(pid) {
        Some(s) => start == 0 || s == start,
        None => false,
    }
}

/// Outcome of taking the robust mutex.
#[derive(Debug, PartialEq, Eq)]
pub enum LockState {
    /// Taken normally.
    Clean,
    /// Taken, but the previous holder died inside its critical section:
    /// the caller must repair the shared state before relying on it.
    OwnerDied,
}

/// Initialises a process-shared, robust pthread mutex in place.
///
/// # Safety
/// `m` must point to writable memory for a `pthread_mutex_t` that no other
/// process uses yet (the segment is still being created).
pub unsafe fn mutex_init(m: *mut libc::pthread_mutex_t) -> io::Result<()> {
    let mut attr = std::mem::MaybeUninit::<libc::pthread_mutexattr_t>::uninit();
    // SAFETY: `attr` is initialised by pthread_mutexattr_init before any use
    // and destroyed at the end; `m` is valid per this function's contract.
    unsafe {
        check(libc::pthread_mutexattr_init(attr.as_mut_ptr()))?;
        let a = attr.as_mut_ptr();
        let r = check(libc::pthread_mutexattr_setpshared(
            a,
            libc::PTHREAD_PROCESS_SHARED,
        ))
        .and_then(|_| {
            check(libc::pthread_mutexattr_setrobust(
                a,
                libc::PTHREAD_MUTEX_ROBUST,
            ))
        })
        .and_then(|_| check(libc::pthread_mutex_init(m, a)));
        libc::pthread_mutexattr_destroy(a);
        r
    }
}

/// Takes the robust mutex, giving up after `timeout` (a holder that is alive
/// but stuck, e.g. stopped by a debugger, must not hang us forever).
///
/// # Safety
/// `m` must point to a mutex initialised by [`mutex_init`] in mapped memory.
pub unsafe fn mutex_lock(
    m: *mut libc::pthread_mutex_t,
    timeout: Duration,
) -> io::Result<LockState> {
    // SAFETY: `m` is valid per the contract; `clock_gettime` writes into `now`.
    unsafe {
        let rc = libc::pthread_mutex_trylock(m);
        let rc = if rc == libc::EBUSY {
            let mut now = std::mem::zeroed::<libc::timespec>();
            libc::clock_gettime(libc::CLOCK_REALTIME, &mut now);
            let total_ns = now.tv_nsec as u128 + timeout.as_nanos();
            let deadline = libc::timespec {
                tv_sec: now.tv_sec + (total_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (total_ns % 1_000_000_000) as _,
            };
            libc::pthread_mutex_timedlock(m, &deadline)
        } else {
            rc
        };
        match rc {
            0 => Ok(LockState::Clean),
            libc::EOWNERDEAD => {
                check(libc::pthread_mutex_consistent(m))?;
                Ok(LockState::OwnerDied)
            }
            libc::ETIMEDOUT => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "channel lock held too long by another process (stopped or hung?)",
            )),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }
}

/// Releases the mutex.
///
/// # Safety
/// The calling thread must hold `m`.
pub unsafe fn mutex_unlock(m: *mut libc::pthread_mutex_t) {
    // SAFETY: per the contract the caller holds the lock.
    unsafe {
        libc::pthread_mutex_unlock(m);
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_bogus_ones_are_not() {
        let (pid, start) = self_identity();
        assert!(start > 0);
        assert!(process_alive(pid, start));
        assert!(!process_alive(pid, start + 1), "pid reuse must be detected");
        assert!(!process_alive(u32::MAX - 1, 0));
    }

    #[test]
    fn reaped_and_zombie_children_are_dead() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = proc_start_time(pid).unwrap();
        assert!(process_alive(pid, start));
        child.kill().unwrap();
        // Not yet reaped: a zombie, which must count as dead.
        std::thread::sleep(Duration::from_millis(100));
        assert!(!process_alive(pid, start));
        child.wait().unwrap();
        assert!(!process_alive(pid, start));
    }
}
