//! Adaptive spinning before a waiter sleeps on a futex.
//!
//! A futex sleep/wake round trip costs 10-15 us on a small VM (the idle vCPU
//! has to be woken by the hypervisor), while a hand-off to a waiter that is
//! still polling costs well under a microsecond. So a waiter first polls its
//! event counter for a short budget, and only then registers and sleeps.
//!
//! Spinning must never steal a core that another task needs. The policy:
//! - never on a single CPU;
//! - not while the machine is loaded: more runnable tasks than CPUs, the
//!   waiter included, counted from `/proc/loadavg` and re-read every 10 ms
//!   (on 2 vCPUs with one CPU-bound process beside a ping-ponging pair,
//!   polling that yields gave 2.8-3.4x `mp.Queue`'s round trip and sleeping
//!   at once 3.0-3.3x, without burning the spare cycles);
//! - on machines with 2 or fewer CPUs, the poll loop calls `sched_yield` on
//!   every turn, so any other runnable task gets the core at once (a "polite"
//!   spin); on larger machines it uses the CPU's pause hint;
//! - not when the process that last signalled this word ran on the waiter's
//!   own CPU (wake-ups tend to pull a ping-ponging pair onto one CPU, and a
//!   futex hand-off between tasks of one CPU is cheap, while spinning there
//!   only delays the peer);
//! - a waiter whose recent spins all failed (its peer is slow, e.g. stepping a
//!   simulator) stops spinning for a while, so a slow pipeline costs no CPU.
//!
//! `RLINF_CHANNEL_SPIN_US` sets the budget in microseconds (default 50;
//! `0` disables spinning).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const DEFAULT_BUDGET_US: u64 = 50;
const LOAD_RECHECK: Duration = Duration::from_millis(10);
/// After this many failed spins in a row, skip spinning for the next ones.
const FAILURES_BEFORE_BACKOFF: u32 = 16;
const BACKOFF_WAITS: u32 = 64;

struct Config {
    budget: Duration,
    cpus: usize,
}

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let us = std::env::var("RLINF_CHANNEL_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_BUDGET_US);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Config {
            budget: Duration::from_micros(us),
            cpus,
        }
    })
}

/// The CPU this thread runs on, plus one (0 if unknown).
pub fn current_cpu() -> u32 {
    // SAFETY: sched_getcpu has no preconditions; it reads the CPU number
    // through the vDSO / rseq area and returns -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).map_or(0, |c| c + 1)
}

/// Co-located waits in a row before a waiter moves to another CPU.
const COLOCATED_BEFORE_HOP: u32 = 32;

thread_local! {
    static COLOCATED_RUN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Called when a waiter finds that its notifier last ran on this same CPU.
///
/// Futex wake-ups tend to pull a ping-ponging pair onto one CPU, and since
/// they alternate (never both runnable) the load balancer never separates
/// them, so all their work is serialised on one CPU while another idles.
/// After [`COLOCATED_BEFORE_HOP`] such waits in a row on an idle machine,
/// the thread moves itself once: it narrows its affinity to exclude the
/// current CPU (the kernel migrates it at once) and restores the original
/// mask right away, so its placement stays the scheduler's from then on.
/// Returns true if it moved.
pub fn colocated_wait() -> bool {
    counters::SKIP_COLOCATED.fetch_add(1, Ordering::Relaxed);
    let run = COLOCATED_RUN.with(|r| {
        r.set(r.get() + 1);
        r.get()
    });
    if run < COLOCATED_BEFORE_HOP || !supported() || !idle_enough() {
        return false;
    }
    COLOCATED_RUN.with(|r| r.set(0));
    let moved = hop_to_another_cpu();
    if moved {
        counters::HOPS.fetch_add(1, Ordering::Relaxed);
    }
    moved
}

/// Resets the co-location run (the last wait was not co-located).
pub fn not_colocated() {
    COLOCATED_RUN.with(|r| r.set(0));
}

fn hop_to_another_cpu() -> bool {
    let Some(cpu) = current_cpu().checked_sub(1) else {
        return false;
    };
    let cpu = cpu as usize;
    // SAFETY: cpu_set_t is plain data; sched_{get,set}affinity read/write
    // exactly size_of::<cpu_set_t>() bytes of the sets we pass, for the
    // calling thread (pid 0).
    unsafe {
        let mut original: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut original) != 0 {
            return false;
        }
        if libc::CPU_COUNT(&original) < 2 || !libc::CPU_ISSET(cpu, &original) {
            return false;
        }
        let mut elsewhere = original;
        libc::CPU_CLR(cpu, &mut elsewhere);
        let moved = libc::sched_setaffinity(0, size, &elsewhere) == 0;
        // Always restore the caller's mask, whatever happened.
        libc::sched_setaffinity(0, size, &original);
        moved
    }
}

/// Whether this machine can spin at all (more than one CPU, non-zero budget).
pub fn supported() -> bool {
    let c = config();
    c.cpus > 1 && !c.budget.is_zero()
}

/// Runnable tasks right now (field 4 of `/proc/loadavg`, "running/total").
fn runnable_tasks() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().nth(3)?.split('/').next()?.parse().ok()
}

/// Whether the machine has spare CPU now (cached for [`LOAD_RECHECK`]).
fn idle_enough() -> bool {
    static CHECKED_AT_NS: AtomicU64 = AtomicU64::new(0);
    static IDLE: AtomicU32 = AtomicU32::new(1);
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let now = EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64;
    let last = CHECKED_AT_NS.load(Ordering::Relaxed);
    if now.saturating_sub(last) >= LOAD_RECHECK.as_nanos() as u64 || last == 0 {
        CHECKED_AT_NS.store(now.max(1), Ordering::Relaxed);
        // The waiter itself is one of the runnable tasks.
        let idle = runnable_tasks().is_none_or(|r| r <= config().cpus);
        IDLE.store(idle as u32, Ordering::Relaxed);
    }
    IDLE.load(Ordering::Relaxed) != 0
}

/// Per-process counters of how waits went (see [`stats`]).
pub mod counters {
    use std::sync::atomic::AtomicU64;
    /// Spins that saw the event.
    pub static SPIN_HIT: AtomicU64 = AtomicU64::new(0);
    /// Spins that ran out of budget.
    pub static SPIN_MISS: AtomicU64 = AtomicU64::new(0);
    /// Waits that did not spin: the notifier shares our CPU.
    pub static SKIP_COLOCATED: AtomicU64 = AtomicU64::new(0);
    /// Waits that did not spin: the machine is loaded.
    pub static SKIP_LOADED: AtomicU64 = AtomicU64::new(0);
    /// Waits that did not spin: backing off after failed spins.
    pub static SKIP_BACKOFF: AtomicU64 = AtomicU64::new(0);
    /// Futex sleeps.
    pub static SLEEPS: AtomicU64 = AtomicU64::new(0);
    /// Moves to another CPU after waiting co-located with the notifier.
    pub static HOPS: AtomicU64 = AtomicU64::new(0);
}

/// `(name, count)` of every wait counter of this process.
pub fn stats() -> Vec<(&'static str, u64)> {
    use counters::*;
    [
        ("spin_hit", &SPIN_HIT),
        ("spin_miss", &SPIN_MISS),
        ("skip_colocated", &SKIP_COLOCATED),
        ("skip_loaded", &SKIP_LOADED),
        ("skip_backoff", &SKIP_BACKOFF),
        ("sleeps", &SLEEPS),
        ("cpu_hops", &HOPS),
    ]
    .into_iter()
    .map(|(n, c)| (n, c.load(Ordering::Relaxed)))
    .collect()
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

thread_local! {
    static FAILURES: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    static SKIP: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Polls `word` until it differs from `seen` or the budget runs out.
/// Returns true if it changed (the caller retries instead of sleeping).
pub fn spin_until_changed(word: &AtomicU32, seen: u32, allowed: bool) -> bool {
    if word.load(Ordering::Acquire) != seen {
        return true;
    }
    if !allowed {
        return false;
    }
    let skip = SKIP.with(|s| s.get());
    if skip > 0 {
        SKIP.with(|s| s.set(skip - 1));
        bump(&counters::SKIP_BACKOFF);
        return false;
    }
    if !idle_enough() {
        bump(&counters::SKIP_LOADED);
        return false;
    }
    let c = config();
    let polite = c.cpus <= 2;
    let until = Instant::now() + c.budget;
    loop {
        for _ in 0..32 {
            if word.load(Ordering::Acquire) != seen {
                FAILURES.with(|f| f.set(0));
                bump(&counters::SPIN_HIT);
                return true;
            }
            std::hint::spin_loop();
        }
        if polite {
            std::thread::yield_now();
        }
        if Instant::now() >= until {
            break;
        }
    }
    bump(&counters::SPIN_MISS);
    let failures = FAILURES.with(|f| {
        f.set(f.get() + 1);
        f.get()
    });
    if failures >= FAILURES_BEFORE_BACKOFF {
        FAILURES.with(|f| f.set(0));
        SKIP.with(|s| s.set(BACKOFF_WAITS));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_already_changed_word_is_reported_at_once() {
        let w = AtomicU32::new(5);
        assert!(spin_until_changed(&w, 4, false));
        assert!(spin_until_changed(&w, 4, true));
    }

    #[test]
    fn unchanged_words_give_up_within_the_budget() {
        let w = AtomicU32::new(5);
        assert!(
            !spin_until_changed(&w, 5, false),
            "disallowed: no spinning at all"
        );
        for _ in 0..40 {
            let t0 = Instant::now();
            assert!(!spin_until_changed(&w, 5, true));
            // The budget plus scheduling slack; never an unbounded poll.
            assert!(t0.elapsed() < config().budget + Duration::from_millis(50));
        }
    }

    #[test]
    fn repeated_failures_back_off() {
        let w = AtomicU32::new(0);
        for _ in 0..FAILURES_BEFORE_BACKOFF + 1 {
            spin_until_changed(&w, 0, true);
        }
        // Backing off (or the machine is loaded): the next waits return at once.
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(!spin_until_changed(&w, 0, true));
        }
        assert!(t0.elapsed() < Duration::from_millis(5) + config().budget);
    }

    #[test]
    fn loadavg_parses() {
        assert!(runnable_tasks().is_some_and(|r| r >= 1));
    }
}
