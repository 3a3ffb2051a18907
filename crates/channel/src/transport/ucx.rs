//! The UCX transport (cargo feature `ucx`): real one-sided put/get into the
//! home node's arena through UCP, with control messages over the agent's TCP
//! stream.
//!
//! What: [`UcxTransport`] connects like [`super::tcp::TcpTransport`] (one TCP
//! stream to the agent carries the control frames), then says hello
//! ([`crate::protocol::OP_UCX_HELLO`]); the agent answers with its UCX worker
//! address and from then on appends, to its replies, what a one-sided
//! operation needs: the packed remote key of each channel's mapping (on
//! open) and the home-node address of each reserved or leased block (on
//! reserve and take). A put is `ucp_put_nbx` of each slice followed by
//! `ucp_ep_flush_nbx`: the bytes are in the home node's memory (remote
//! completion) before the publish message is sent. A get is `ucp_get_nbx`.
//!
//! Why: on RDMA hardware (InfiniBand/RoCE, UCX's `rc`/`dc`) the same code is
//! truly one-sided: no CPU on the home node touches the payload. On nodes
//! without it UCX picks `tcp` or, on one host, shared memory (`sm`, `posix`,
//! `cma`), which also lets CI test the path for real.
//!
//! Cost: on the home node each UCX connection has a helper process
//! ([`super::ucx_home`]) running one UCX worker with a progress thread
//! ([`home`]): UCX's emulated transports (tcp, and sm with memory UCX did not
//! allocate) complete one-sided operations only while the target
//! progresses. It sleeps on the worker's event fd when idle. The helper
//! registers the mapping of each channel the connection opens once
//! (`ucp_mem_map`, no pinning on tcp/sm; pinned pages on RDMA), so a channel
//! costs one registration per connected peer connection, not one per block.
//! The helper exists because UCX aborts the process serving a connection
//! when the peer dies mid-transfer over tcp; see [`super::ucx_home`].
//!
//! Trust and withdrawal: a peer holding a channel's key can write anywhere in
//! that channel's mapping on the home node, as with any RDMA registration;
//! peers are processes of the same job. When a connection ends, the helper
//! unregisters its regions, lets the progress thread drain what that peer
//! had already sent ([`Home::quiesce`]) and stops progressing
//! ([`Home::pause`]), and only then the agent withdraws the connection's
//! unpublished reservations and releases its leases, as the TCP path does;
//! if the helper died instead, nothing writes through it any more. Over
//! shared-memory transports (`sm`: cma, posix) a peer that is alive but has
//! dropped its control connection could still write after that; a killed
//! peer cannot.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::{Endpoint, OpId, RemoteDesc, Transport};
use crate::protocol::{OK, OP_OPEN, OP_PUBLISH, OP_RELEASE, OP_RESERVE, OP_TAKE, OP_UCX_HELLO};
use crate::ucx_sys::{Ep, MemRegion, RKey, Request, Worker};
use crate::wire::{self, Reader, Writer};

/// The UCX transport. Its worker (one per transport value, shared by its
/// endpoints) is created on first use.
pub struct UcxTransport {
    tls: Option<String>,
    worker: OnceLock<Result<Arc<Worker>, (io::ErrorKind, String)>>,
}

impl UcxTransport {
    /// A transport configured by UCX's environment (`UCX_TLS` and the other
    /// `UCX_*` variables pass through to UCX).
    pub fn new() -> Self {
        Self {
            tls: None,
            worker: OnceLock::new(),
        }
    }

    /// A transport restricted to the UCX transports `tls` (a `UCX_TLS`
    /// value such as `"tcp"` or `"sm"`), whatever the environment says.
    pub fn with_tls(tls: &str) -> Self {
        Self {
            tls: Some(tls.to_owned()),
            worker: OnceLock::new(),
        }
    }

    /// This transport's worker, created on first use.
    ///
    /// # Errors
    /// If UCX cannot initialise here (the error is kept and repeated).
    pub fn worker(&self) -> io::Result<Arc<Worker>> {
        match self
            .worker
            .get_or_init(|| Worker::new(self.tls.as_deref()).map_err(|e| (e.kind(), e.to_string())))
        {
            Ok(w) => Ok(Arc::clone(w)),
            Err((kind, e)) => Err(io::Error::new(*kind, e.clone())),
        }
    }
}

impl Default for UcxTransport {
    fn default() -> Self {
        Self::new()
    }
}

impl Transport for UcxTransport {
    fn name(&self) -> &'static str {
        "ucx"
    }

    fn connect(&self, address: &str, timeout: Duration) -> io::Result<Box<dyn Endpoint>> {
        if crate::tls::requested()? {
            return Err(super::ucx_with_tls());
        }
        let worker = self.worker()?;
        let mut stream = super::tcp::connect_stream(address, timeout)?;
        wire::write_frame(&mut stream, &Writer::new(OP_UCX_HELLO).finish())?;
        let mut reply = Vec::new();
        wire::read_frame(&mut stream, &mut reply)?;
        let mut r = Reader::new(&reply);
        if r.u8()? != OK {
            let why = r.str().unwrap_or("").to_owned();
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the channel agent at {address} does not serve UCX: {why}"),
            ));
        }
        let peer = r.bytes()?.to_vec();
        let ep = Ep::connect(&worker, &peer)?;
        let mut endpoint = UcxEndpoint {
            rkeys: HashMap::new(),
            ep: Some(ep),
            stream,
            address: address.to_owned(),
            blocks: HashMap::new(),
            next_op: 1,
            done: Vec::new(),
        };
        // Wire up now (a flush completes once the peer answered), so an
        // unusable path fails here, not on the first transfer.
        let flush = endpoint.live_ep()?.flush()?;
        endpoint.wait(
            flush.into_iter().collect(),
            "connection set-up",
            Some(timeout),
        )?;
        Ok(Box::new(endpoint))
    }
}

/// One connection to an agent: a TCP control stream and a UCX endpoint.
pub struct UcxEndpoint {
    // Field order is drop order: keys before the endpoint they were unpacked on.
    rkeys: HashMap<u32, RKey>,
    ep: Option<Ep>,
    stream: TcpStream,
    address: String,
    /// Token -> (channel handle, block address on the home node).
    blocks: HashMap<u64, (u32, u64)>,
    next_op: OpId,
    done: Vec<(OpId, io::Result<()>)>,
}

fn broken() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "this UCX connection failed earlier and was closed",
    )
}

impl UcxEndpoint {
    /// `e`, with the agent's address in its message.
    fn named(&self, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("{e} (channel agent at {})", self.address))
    }

    fn live_ep(&self) -> io::Result<&Ep> {
        self.ep.as_ref().ok_or_else(broken)
    }

    /// Closes the UCX endpoint forcibly: outstanding operations are
    /// cancelled, so no local buffer is touched after this returns.
    fn abandon(&mut self) {
        self.rkeys.clear();
        if let Some(ep) = self.ep.as_mut() {
            ep.set_force_close();
        }
        self.ep = None;
    }

    /// Whether the agent closed the control stream (it never sends unasked).
    fn agent_gone(&self) -> bool {
        if self.stream.set_nonblocking(true).is_err() {
            return true;
        }
        let mut b = [0u8; 1];
        let gone = match self.stream.peek(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        };
        gone || self.stream.set_nonblocking(false).is_err()
    }

    /// Progresses until every request completed; on failure (a request's
    /// error, the endpoint's peer failure, the agent closing the control
    /// stream, or `timeout`) closes the endpoint and returns the error.
    fn wait(
        &mut self,
        reqs: Vec<Request>,
        what: &str,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        let r = self.wait_inner(reqs, what, timeout);
        if r.is_err() {
            self.abandon();
        }
        r
    }

    fn wait_inner(
        &self,
        mut reqs: Vec<Request>,
        what: &str,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        let ep = self.live_ep()?;
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut idle = 0u32;
        let mut active = Instant::now();
        loop {
            let mut i = 0;
            while i < reqs.len() {
                match reqs[i].status(what) {
                    None => i += 1,
                    Some(r) => {
                        reqs.swap_remove(i);
                        r.map_err(|e| {
                            io::Error::new(
                                e.kind(),
                                format!(
                                    "UCX {what} with the channel agent at {}: {e}",
                                    self.address
                                ),
                            )
                        })?;
                    }
                }
            }
            if reqs.is_empty() {
                return Ok(());
            }
            let failure = ep.failure();
            if failure != 0 {
                return Err(crate::ucx_sys::error(
                    &format!("UCX {what} with the channel agent at {}", self.address),
                    failure,
                ));
            }
            if ep.worker().progress() {
                idle = 0;
                active = Instant::now();
                continue;
            }
            idle += 1;
            if idle % 8 == 0 {
                if self.agent_gone() {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        format!(
                            "the channel agent at {} went away during a UCX {what}",
                            self.address
                        ),
                    ));
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "UCX {what} with the channel agent at {} did not complete in time",
                            self.address
                        ),
                    ));
                }
            }
            if active.elapsed() < POLL_AFTER_ACTIVITY {
                std::thread::yield_now();
            } else {
                ep.worker().wait(1);
            }
        }
    }

    fn block(&self, desc: &RemoteDesc, local: usize, op: &str) -> io::Result<(&Ep, &RKey, u64)> {
        if local as u64 != desc.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{op}: local size {local} differs from the remote size {}",
                    desc.len
                ),
            ));
        }
        let ep = self.live_ep()?;
        let &(handle, base) = self.blocks.get(&desc.region).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{op}: no block is known for token {}", desc.region),
            )
        })?;
        let rkey = self.rkeys.get(&handle).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{op}: no UCX key for channel handle {handle}"),
            )
        })?;
        Ok((ep, rkey, base + desc.offset))
    }

    fn record(&mut self, r: io::Result<()>) -> io::Result<OpId> {
        let id = self.next_op;
        self.next_op += 1;
        let report = r
            .as_ref()
            .map(|_| ())
            .map_err(|e| io::Error::new(e.kind(), e.to_string()));
        self.done.push((id, report));
        r.map(|()| id)
    }

    /// Learns keys and block addresses from the agent's UCX extensions of
    /// the open, reserve and take replies.
    fn learn(&mut self, request: &[u8], reply: &[u8]) -> io::Result<()> {
        let (Some(&op), Some(&OK)) = (request.first(), reply.first()) else {
            return Ok(());
        };
        let handle_of = |req: &[u8]| Reader::new(&req[1..]).u32();
        let mut r = Reader::new(&reply[1..]);
        match op {
            OP_OPEN => {
                let handle = r.u32()?;
                let _ = (r.u32()?, r.u32()?, r.u64()?);
                let key = RKey::unpack(self.live_ep()?, r.bytes()?)?;
                self.rkeys.insert(handle, key);
            }
            OP_RESERVE => {
                let handle = handle_of(request)?;
                let token = r.u64()?;
                self.blocks.insert(token, (handle, r.u64()?));
            }
            OP_TAKE => {
                let handle = handle_of(request)?;
                let n = r.u32()?;
                let mut tokens = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    tokens.push(r.u64()?);
                    let _len = r.u64()?;
                }
                for token in tokens {
                    self.blocks.insert(token, (handle, r.u64()?));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl Endpoint for UcxEndpoint {
    fn call(&mut self, request: &[u8], reply: &mut Vec<u8>) -> io::Result<()> {
        if request.first() == Some(&OP_PUBLISH) {
            if let Ok(token) = Reader::new(&request[1..]).u64() {
                self.blocks.remove(&token);
            }
        }
        let address = &self.address;
        let lost = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("lost the channel agent at {address}: {e}"),
            )
        };
        wire::write_frame(&mut self.stream, request).map_err(lost)?;
        wire::read_frame(&mut self.stream, reply).map_err(lost)?;
        self.learn(request, reply)
    }

    fn notify(&mut self, message: &[u8]) -> io::Result<()> {
        if message.first() == Some(&OP_RELEASE) {
            if let Ok(token) = Reader::new(&message[1..]).u64() {
                self.blocks.remove(&token);
            }
        }
        wire::write_frame(&mut self.stream, message)
    }

    fn post_write(&mut self, src: &[IoSlice<'_>], dst: RemoteDesc) -> io::Result<OpId> {
        let total: usize = src.iter().map(|s| s.len()).sum();
        let posted = (|| {
            let (ep, rkey, mut at) = self.block(&dst, total, "post_write")?;
            let mut reqs = Vec::new();
            for s in src {
                // SAFETY: every posted put is waited for below, or cancelled
                // by `abandon` (a forced close) before this function returns,
                // so `s` outlives its use by UCX.
                if let Some(r) = unsafe { ep.put(s, at, rkey) }.map_err(|e| self.named(e))? {
                    reqs.push(r);
                }
                at += s.len() as u64;
            }
            // Remote completion before the caller publishes.
            reqs.extend(ep.flush().map_err(|e| self.named(e))?);
            Ok(reqs)
        })();
        let r = match posted {
            Ok(reqs) => self.wait(reqs, "put", None),
            Err(e) => {
                self.abandon();
                Err(e)
            }
        };
        self.record(r)
    }

    fn post_read(&mut self, dst: &mut [u8], src: RemoteDesc) -> io::Result<OpId> {
        let posted = (|| {
            let (ep, rkey, at) = self.block(&src, dst.len(), "post_read")?;
            // SAFETY: the get is waited for below, or cancelled by `abandon`
            // before this function returns, so `dst` outlives its use by UCX.
            unsafe { ep.get(dst, at, rkey) }.map_err(|e| self.named(e))
        })();
        let r = match posted {
            Ok(req) => self.wait(req.into_iter().collect(), "get", None),
            Err(e) => {
                self.abandon();
                Err(e)
            }
        };
        self.record(r)
    }

    fn poll(&mut self, done: &mut Vec<(OpId, io::Result<()>)>) -> io::Result<usize> {
        let n = self.done.len();
        done.append(&mut self.done);
        Ok(n)
    }

    fn transport(&self) -> &'static str {
        "ucx"
    }
}

/// How long a progress loop keeps polling (yielding the CPU between polls)
/// after the last event before it sleeps on the worker's event descriptor:
/// not every UCX transport signals the descriptor for every step of an
/// emulated transfer (measured here: a 64 MiB put over `sm` fell from
/// ~4 GB/s to ~0.1-0.3 GB/s in some runs when the loop slept at once).
const POLL_AFTER_ACTIVITY: Duration = Duration::from_micros(200);

/// The home side: this process's UCX worker serving peers, with its
/// progress thread. One per UCX home helper process ([`super::ucx_home`]).
pub struct Home {
    worker: Arc<Worker>,
    address: Vec<u8>,
    rounds: AtomicU64,
    paused: AtomicBool,
}

static HOME: OnceLock<Result<Arc<Home>, String>> = OnceLock::new();

/// This process's [`Home`], started on first use (UCX configured from the
/// environment: `UCX_TLS` passes through).
///
/// # Errors
/// If UCX cannot initialise here (kept and repeated).
pub fn home() -> io::Result<Arc<Home>> {
    let r = HOME.get_or_init(|| {
        let start = || -> io::Result<Arc<Home>> {
            let worker = Worker::new(None)?;
            let address = worker.address()?;
            let home = Arc::new(Home {
                worker,
                address,
                rounds: AtomicU64::new(0),
                paused: AtomicBool::new(false),
            });
            let h = Arc::clone(&home);
            std::thread::Builder::new()
                .name("rlinf-ucx-progress".into())
                .spawn(move || {
                    let mut active = Instant::now();
                    loop {
                        if h.paused.load(Ordering::Acquire) {
                            std::thread::sleep(Duration::from_millis(10));
                            continue;
                        }
                        while h.worker.progress() {
                            active = Instant::now();
                        }
                        h.rounds.fetch_add(1, Ordering::AcqRel);
                        if active.elapsed() < POLL_AFTER_ACTIVITY {
                            std::thread::yield_now();
                        } else {
                            h.worker.wait(10);
                        }
                    }
                })?;
            Ok(home)
        };
        start().map_err(|e| e.to_string())
    });
    match r {
        Ok(h) => Ok(Arc::clone(h)),
        Err(e) => Err(io::Error::other(e.clone())),
    }
}

impl Home {
    /// The worker address peers connect to.
    pub fn address(&self) -> &[u8] {
        &self.address
    }

    /// Registers `len` bytes at `base`; returns the region and its packed key.
    ///
    /// # Safety
    /// The range must stay mapped until the region is dropped.
    pub unsafe fn register(&self, base: *mut u8, len: usize) -> io::Result<(MemRegion, Vec<u8>)> {
        // SAFETY: forwarded from the caller.
        let region = unsafe { MemRegion::new(&self.worker, base, len) }?;
        let key = region.packed_key()?;
        Ok((region, key))
    }

    /// Waits until the progress thread has run two full rounds (progress
    /// until idle) since this call, so whatever a dead peer had sent before
    /// its sockets closed has been applied. Bounded by one second.
    pub fn quiesce(&self) {
        let start = self.rounds.load(Ordering::Acquire);
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.rounds.load(Ordering::Acquire) < start + 2 && Instant::now() < deadline {
            self.worker.signal();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Stops progressing the worker for good (after [`Self::quiesce`]): over
    /// emulated transports no peer's put or get completes after this.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::Release);
        self.worker.signal();
    }
}
