//! The UCX home helper: a disposable process that owns the home side of one
//! UCX connection.
//!
//! What: when a connection says UCX hello, the agent spawns a helper
//! ([`HomeHelper::spawn`]). The helper ([`serve_stdio`]) starts its own UCX
//! worker with a progress thread ([`super::ucx::home`]) and answers on its
//! stdout with the worker address. For each channel the connection opens,
//! the agent asks it to attach the channel's shared-memory segment by
//! (namespace, name) and register that mapping with UCX; the helper answers
//! with its mapping's base address and the packed remote key. Peers then
//! put/get into the helper's mapping of the same shared memory, so the
//! agent and the channel see the payload. When the connection ends, the
//! agent asks the helper to unregister, drain ([`super::ucx::Home::quiesce`])
//! and stop UCX ([`HomeHelper::quiesce`]; killed if it does not answer in
//! time), withdraws the connection's reservations and leases, lets go of
//! its channels, then says bye ([`HomeHelper::end`]): the helper lets go of
//! them last (so whoever holds a segment last removes its name, as usual)
//! and exits, and the agent reaps it. A helper whose agent dies without a
//! bye (its stdin ends, or it is reparented) stops UCX, waits until the
//! agent is gone, lets go of the channels and exits.
//!
//! Why: UCX (1.13 and 1.22) aborts the process (`ucs_fatal`) when a peer is
//! killed while its emulated put/get over `UCX_TLS=tcp` is in flight
//! (`ucp_put_handler`/`ucp_get_req_handler` -> `ucp_request_try_send`); no
//! UCX error handling reaches that path. In a helper the abort ends only
//! that connection: the agent sees the helper's stdout close, closes the
//! peer's control stream, and withdraws the peer's reservations and leases
//! (safe: the helper, the only process UCX writes through, is dead).
//!
//! Cost: one extra process per UCX connection on the home node, started on
//! hello, and one mapping of each channel the connection opens. Opening a
//! UCX connection plus one request (median of 20, `ucx-tcp`, debug build,
//! 2-core VM): 20 ms with the worker in the home process (before), 19 ms
//! with the `rlinf-ucx-home` binary, 77 ms with `python -m
//! rlinf.core.ucx_home` (an interpreter start).
//!
//! Which program: [`crate::agent::set_ucx_home_helper`] or the environment
//! variable [`crate::agent::UCX_HOME_HELPER_ENV`] (wins); the Python
//! binding's `ChannelAgent` sets `sys.executable -m rlinf.core.ucx_home`
//! when neither is set.
//!
//! Protocol (frames of [`crate::wire`]): helper -> agent first `OK, bytes
//! address` or `error, str why`; agent -> helper `ATTACH, str ns, str name`
//! -> `OK, u64 base, bytes key` or `error, str why`; `QUIESCE` -> `OK`;
//! `BYE`: the helper exits.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::channel::Channel;
use crate::protocol::OK;
use crate::ucx_sys::MemRegion;
use crate::wire::{self, Reader, Writer};

const ATTACH: u8 = 1;
const QUIESCE: u8 = 2;
const BYE: u8 = 3;
const FAILED: u8 = 1;
/// Bound on the helper's start (a Python interpreter on a busy node) and on
/// an attach (which may wait for the channel's creator).
const REPLY_BOUND: Duration = Duration::from_secs(60);
/// Bound on the drain at the end of a connection.
const QUIESCE_BOUND: Duration = Duration::from_secs(5);
/// Bound on the helper's exit after its stdin closed, before it is killed.
const EXIT_BOUND: Duration = Duration::from_secs(2);
/// Bound on the wait of a helper whose agent died for the agent to be gone.
const ORPHAN_BOUND: Duration = Duration::from_secs(10);

/// Runs the helper on this process's stdin/stdout until the agent says bye
/// or is gone; returns the exit code. Writes to fd 1 from anything else go
/// to stderr, so that nothing but frames reaches the agent.
pub fn serve_stdio() -> i32 {
    let ppid = rustix::process::getppid();
    let Ok(out) = io::stdout().as_fd().try_clone_to_owned() else {
        return 2;
    };
    // SAFETY: dup2 on the standard descriptors has no memory-safety
    // preconditions; fd 1 (now duplicated as `out`) becomes a copy of fd 2.
    unsafe { libc::dup2(2, 1) };
    let mut out = std::fs::File::from(out);
    let mut input = io::stdin().lock();
    match serve(&mut input, &mut out, ppid) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rlinf-ucx-home: {e}");
            1
        }
    }
}

/// One attached channel; field order is drop order (unregister, then unmap).
struct Attached {
    region: Option<MemRegion>,
    _channel: Channel,
}

fn failed(why: &str) -> Vec<u8> {
    Writer::new(FAILED).bytes(why.as_bytes()).finish()
}

/// Waits until stdin is readable (or closed); `false` if the parent `ppid`
/// is gone first (this process was reparented).
fn wait_input(ppid: Option<rustix::process::Pid>) -> bool {
    loop {
        let mut fds = [libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: `fds` is a valid array of one pollfd for the duration of the call.
        if unsafe { libc::poll(fds.as_mut_ptr(), 1, 200) } > 0 {
            return true;
        }
        if rustix::process::getppid() != ppid {
            return false;
        }
    }
}

fn serve(
    input: &mut impl Read,
    out: &mut impl Write,
    ppid: Option<rustix::process::Pid>,
) -> io::Result<()> {
    let home = match super::ucx::home() {
        Ok(h) => h,
        Err(e) => return wire::write_frame(out, &failed(&e.to_string())),
    };
    wire::write_frame(out, &Writer::new(OK).bytes(home.address()).finish())?;
    let mut attached = Vec::new();
    let mut frame = Vec::new();
    loop {
        if !wait_input(ppid) || wire::read_frame(input, &mut frame).is_err() {
            // The agent ended without a goodbye (it died): stop UCX, wait
            // until the agent is gone, then let go of the channels as their
            // last holder (their names are removed when no one holds them).
            home.pause();
            let deadline = Instant::now() + ORPHAN_BOUND;
            while rustix::process::getppid() == ppid && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            drop(attached);
            return Ok(());
        }
        let mut r = Reader::new(&frame);
        let reply = match r.u8()? {
            ATTACH => {
                let (ns, name) = (r.str()?, r.str()?);
                let attach = || -> Result<(Attached, u64, Vec<u8>), String> {
                    let ch = Channel::attach(ns, name).map_err(|e| e.to_string())?;
                    let (base, len) = ch.mapped_region();
                    // SAFETY: the region is dropped before the channel that
                    // keeps the mapping alive (field order of `Attached`).
                    let (region, key) =
                        unsafe { home.register(base, len) }.map_err(|e| e.to_string())?;
                    let a = Attached {
                        region: Some(region),
                        _channel: ch,
                    };
                    Ok((a, base as u64, key))
                };
                match attach() {
                    Ok((a, base, key)) => {
                        attached.push(a);
                        Writer::new(OK).u64(base).bytes(&key).finish()
                    }
                    Err(e) => failed(&format!("cannot register the channel with UCX: {e}")),
                }
            }
            QUIESCE => {
                for a in &mut attached {
                    a.region = None;
                }
                home.quiesce();
                home.pause();
                Writer::new(OK).finish()
            }
            // The agent has let go of the channels: this process may be
            // their last holder.
            BYE => return Ok(()),
            other => failed(&format!("unknown helper request {other}")),
        };
        wire::write_frame(out, &reply)?;
    }
}

/// The agent's handle on one connection's helper process.
pub struct HomeHelper {
    child: Arc<Mutex<Child>>,
    stdin: Option<ChildStdin>,
    replies: mpsc::Receiver<Vec<u8>>,
    watcher: Option<JoinHandle<()>>,
    ending: Arc<AtomicBool>,
    address: Vec<u8>,
    pid: u32,
}

fn lock(child: &Mutex<Child>) -> std::sync::MutexGuard<'_, Child> {
    child.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reaps `child`, killing it if it has not exited within [`EXIT_BOUND`].
fn reap(child: &Mutex<Child>) -> io::Result<ExitStatus> {
    let deadline = Instant::now() + EXIT_BOUND;
    loop {
        if let Some(status) = lock(child).try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            let mut c = lock(child);
            let _ = c.kill();
            return c.wait();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl HomeHelper {
    /// Spawns `command` (program, then arguments) and waits for its worker
    /// address. `on_death` runs on the watcher thread, with a description of
    /// the exit status, if the helper dies before [`Self::end`] or does not
    /// exit cleanly.
    ///
    /// # Errors
    /// If the helper cannot start, or UCX cannot start in it.
    pub fn spawn(
        command: &[OsString],
        on_death: impl FnOnce(String) + Send + 'static,
    ) -> io::Result<Self> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty helper command"))?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot start the UCX home helper {program:?}: {e}"),
                )
            })?;
        let stdin = child.stdin.take();
        let pid = child.id();
        let mut stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("no stdout"))?;
        let child = Arc::new(Mutex::new(child));
        let ending = Arc::new(AtomicBool::new(false));
        // Set once the helper has started: a helper that fails to start is
        // an error of the hello (replied to the peer), not a death to report.
        let armed = Arc::new(AtomicBool::new(false));
        let (tx, replies) = mpsc::channel();
        let (c, e, a) = (Arc::clone(&child), Arc::clone(&ending), Arc::clone(&armed));
        let watcher = std::thread::Builder::new()
            .name("rlinf-ucx-helper".into())
            .spawn(move || {
                let mut frame = Vec::new();
                while wire::read_frame(&mut stdout, &mut frame).is_ok() {
                    if tx.send(std::mem::take(&mut frame)).is_err() {
                        break;
                    }
                }
                drop(tx);
                let status = reap(&c);
                // Reported when the connection did not end first, or when the
                // helper did not exit cleanly (e.g. UCX aborted in the drain).
                let clean = status.as_ref().is_ok_and(|s| s.success());
                if a.load(Ordering::Acquire) && (!e.load(Ordering::Acquire) || !clean) {
                    on_death(match status {
                        Ok(s) => s.to_string(),
                        Err(e) => format!("status unknown: {e}"),
                    });
                }
            })?;
        let mut helper = Self {
            child,
            stdin,
            replies,
            watcher: Some(watcher),
            ending,
            address: Vec::new(),
            pid,
        };
        let reply = helper.reply("start")?;
        helper.address = Reader::new(&reply).bytes()?.to_vec();
        armed.store(true, Ordering::Release);
        Ok(helper)
    }

    /// The helper's UCX worker address.
    pub fn address(&self) -> &[u8] {
        &self.address
    }

    /// The helper's next reply, after its `OK` byte, or its error.
    fn reply(&mut self, what: &str) -> io::Result<Vec<u8>> {
        let mut frame = self.replies.recv_timeout(REPLY_BOUND).map_err(|e| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("the UCX home helper gave no answer to {what}: {e}"),
            )
        })?;
        if frame.first() == Some(&OK) {
            frame.remove(0);
            Ok(frame)
        } else {
            let why = Reader::new(frame.get(1..).unwrap_or(&[]))
                .str()
                .unwrap_or("")
                .to_owned();
            Err(io::Error::other(why))
        }
    }

    fn request(&mut self, msg: &[u8]) -> io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| io::Error::other("helper ended"))?;
        wire::write_frame(stdin, msg)
    }

    /// Has the helper attach channel `ns`/`name` and register it with UCX;
    /// returns the helper's mapping base and the packed remote key.
    ///
    /// # Errors
    /// If the helper fails to, or is gone.
    pub fn attach(&mut self, ns: &str, name: &str) -> io::Result<(u64, Vec<u8>)> {
        self.request(
            &Writer::new(ATTACH)
                .bytes(ns.as_bytes())
                .bytes(name.as_bytes())
                .finish(),
        )?;
        let reply = self.reply("attach")?;
        let mut r = Reader::new(&reply);
        Ok((r.u64()?, r.bytes()?.to_vec()))
    }

    /// Has the helper unregister the regions, apply what peers had already
    /// sent and stop progressing UCX, waiting a bound for its answer; kills
    /// and reaps it if none comes. Either way no UCX write lands after this
    /// returns, so the connection's reservations can be withdrawn.
    pub fn quiesce(&mut self) {
        if self.watcher.is_none() {
            return;
        }
        self.ending.store(true, Ordering::Release);
        let acked = self.request(&Writer::new(QUIESCE).finish()).is_ok()
            && self.replies.recv_timeout(QUIESCE_BOUND).is_ok();
        if !acked {
            self.stdin = None;
            let _ = lock(&self.child).kill();
            self.join();
        }
    }

    /// Ends the helper (after [`Self::quiesce`] and after this process let
    /// go of the channels): says bye, closes its stdin, reaps it (killed if
    /// it does not exit within a bound). Idempotent.
    pub fn end(&mut self) {
        if self.watcher.is_none() {
            return;
        }
        self.ending.store(true, Ordering::Release);
        let _ = self.request(&Writer::new(BYE).finish());
        self.stdin = None;
        let deadline = Instant::now() + EXIT_BOUND;
        while self.watcher.as_ref().is_some_and(|w| !w.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.watcher.as_ref().is_some_and(|w| !w.is_finished()) {
            let _ = lock(&self.child).kill();
        }
        self.join();
    }

    fn join(&mut self) {
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
    }

    /// The helper's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl Drop for HomeHelper {
    fn drop(&mut self) {
        self.end();
    }
}
