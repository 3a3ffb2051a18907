//! The per-node channel agent: serves channels of this node to other nodes.
//!
//! One thread accepts connections; each connection gets a thread that runs
//! control requests against local channels and emulates the transport's
//! one-sided operations: a remote write is `recv`-ed straight into the
//! reserved arena block, a remote read is `send`-ed straight from the leased
//! block. When a connection ends, its unpublished reservations are withdrawn
//! and its leases released (by `Drop`), so a dead remote peer never wedges a
//! lane or leaks memory.
//!
//! With the `ucx` feature, a connection that says hello (`OP_UCX_HELLO`) gets
//! its payloads moved by UCX instead, through a helper process of its own
//! (`transport::ucx_home`): the agent has the helper attach and register
//! each channel the connection opens and tells the peer where each reserved
//! or leased block lives in the helper's mapping. UCX aborts the process it
//! runs in when a peer dies mid-transfer over tcp; in the helper, that ends
//! only that connection. The helper command: [`set_ucx_home_helper`], or
//! the environment variable [`UCX_HOME_HELPER_ENV`], which wins (the Python
//! binding sets `python -m rlinf.core.ucx_home` by itself).
//!
//! Every connection authenticates first ([`crate::auth`]): until the peer has
//! proved it holds the run's secret, the agent reads no frame. A peer that does
//! not complete the handshake within [`AgentOptions::handshake_timeout`] is
//! dropped, and connections beyond [`AgentOptions::max_connections`] are
//! closed at once. Each refusal is logged to stderr once per peer address.
//!
//! Plain and TLS clients share the port ([`crate::tls`]): the agent peeks at
//! a connection's first byte, and a TLS ClientHello gets the TLS handshake
//! (with the `tls` feature) before the challenge-response, which then runs
//! inside TLS. A TLS connection is served exactly like a plain one, except
//! that it cannot say the UCX hello (UCX would move its payloads outside TLS).

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::auth::{self, Refusal, Secret};
use crate::channel::{Channel, ChannelError, ChannelOptions, Lease, PendingPut};
use crate::protocol::*;
use crate::tls::{self, ServerIdentity, Stream};
use crate::transport::tcp::{OP_READ, OP_WRITE};
use crate::wire::{self, Reader, Writer};

/// The environment variable naming the UCX home helper command: a program
/// path, then arguments, separated by whitespace (e.g. the cargo binary
/// `rlinf-ucx-home`). Wins over [`set_ucx_home_helper`].
pub const UCX_HOME_HELPER_ENV: &str = "RLINF_UCX_HOME_HELPER";

static UCX_HOME_HELPER: Mutex<Option<Vec<OsString>>> = Mutex::new(None);

/// Sets this process's UCX home helper command (program, then arguments):
/// a program that runs `transport::ucx_home::serve_stdio` (the cargo binary
/// `rlinf-ucx-home`, or `python -m rlinf.core.ucx_home`).
pub fn set_ucx_home_helper(command: Vec<OsString>) {
    *UCX_HOME_HELPER
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Some(command);
}

/// The UCX home helper command, if one is configured.
pub fn ucx_home_helper() -> Option<Vec<OsString>> {
    if let Some(v) = std::env::var_os(UCX_HOME_HELPER_ENV) {
        let cmd: Vec<OsString> = v
            .to_string_lossy()
            .split_whitespace()
            .map(OsString::from)
            .collect();
        if !cmd.is_empty() {
            return Some(cmd);
        }
    }
    UCX_HOME_HELPER
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Process ids of the UCX home helpers of live connections.
type Helpers = Arc<Mutex<Vec<u32>>>;

/// Longest wait an agent does for one request (reserve, take, wait readable):
/// clients cut blocking calls into slices of [`crate::remote::REMOTE_SLICE`],
/// so a longer (or unbounded) timeout on the wire only ever comes from a
/// broken or hostile peer, and must not pin a connection thread forever.
pub const MAX_REQUEST_WAIT: Duration = Duration::from_secs(5);

/// Most channels one connection may have open: each holds a file descriptor
/// and a mapping of its segment, so an unbounded count would let one peer
/// exhaust the process's descriptors or mappings (clients open one
/// channel per connection).
pub const MAX_SESSION_CHANNELS: usize = 256;

fn capped_wait(timeout: Option<Duration>) -> Duration {
    timeout.map_or(MAX_REQUEST_WAIT, |t| t.min(MAX_REQUEST_WAIT))
}

/// How often the accept loop checks whether the agent was stopped.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// Waits up to [`ACCEPT_POLL`] for a connection to accept; true if one may be waiting.
fn wait_acceptable(listener: &TcpListener) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: ACCEPT_POLL.as_nanos() as _,
    };
    let mut fds = [PollFd::new(listener, PollFlags::IN)];
    // An error (EINTR) counts as "maybe": accept is non-blocking.
    poll(&mut fds, Some(&timeout)).map_or(true, |n| n > 0)
}

/// Default of [`AgentOptions::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// How an agent admits connections.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The secret peers must prove they hold (None: [`auth::process_secret`]).
    pub secret: Option<Arc<Secret>>,
    /// Live connections served at most; further ones are closed at once.
    pub max_connections: usize,
    /// How long a new connection may take to authenticate.
    pub handshake_timeout: Duration,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            secret: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: auth::DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

/// What the accept loop shares with the connection threads.
struct Admission {
    secret: Arc<Secret>,
    max_connections: usize,
    handshake_timeout: Duration,
    live: AtomicUsize,
    /// Peers whose refusal was already logged (one line per peer address).
    logged: Mutex<HashSet<IpAddr>>,
    helpers: Helpers,
    /// The certificate TLS clients get, made on the first one.
    tls: ServerIdentity,
}

impl Admission {
    fn log_once(&self, peer: Option<IpAddr>, what: &str) {
        let first = peer.is_none_or(|ip| {
            self.logged
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(ip)
        });
        if first {
            let who = peer.map_or_else(|| "?".to_owned(), |ip| ip.to_string());
            eprintln!(
                "rlinf channel agent: refused a connection from {who}: {what} \
                 (logged once per peer address)"
            );
        }
    }
}

/// A running agent. Dropping it stops accepting; live connections end when
/// their peers disconnect.
pub struct Agent {
    address: String,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    admission: Arc<Admission>,
}

impl Agent {
    /// Starts an agent listening on `bind` (e.g. `"127.0.0.1:0"` for any free
    /// port) with default [`AgentOptions`] (the process's secret).
    ///
    /// # Errors
    /// If the address cannot be bound or the process has no usable secret.
    pub fn start(bind: &str) -> io::Result<Self> {
        Self::start_with(bind, AgentOptions::default())
    }

    /// Starts an agent listening on `bind` with `options`.
    ///
    /// # Errors
    /// If the address cannot be bound, `max_connections` is 0, or no secret is
    /// given and the process has no usable one.
    pub fn start_with(bind: &str, options: AgentOptions) -> io::Result<Self> {
        if options.max_connections == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "AgentOptions::max_connections must be at least 1",
            ));
        }
        let secret = match options.secret {
            Some(secret) => secret,
            None => auth::process_secret()?,
        };
        let listener = TcpListener::bind(bind)?;
        let address = listener.local_addr()?.to_string();
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let admission = Arc::new(Admission {
            secret,
            max_connections: options.max_connections,
            handshake_timeout: options.handshake_timeout,
            live: AtomicUsize::new(0),
            logged: Mutex::new(HashSet::new()),
            helpers: Helpers::default(),
            tls: ServerIdentity::default(),
        });
        let admission2 = Arc::clone(&admission);
        let accept = std::thread::Builder::new()
            .name("rlinf-agent".into())
            .spawn(move || {
                while !stop2.load(Ordering::Acquire) {
                    // Wake at once for a connection, and every ACCEPT_POLL to see `stop`.
                    if !wait_acceptable(&listener) {
                        continue;
                    }
                    match listener.accept() {
                        Ok((stream, peer)) => admit(stream, peer.ip(), &admission2),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(_) => std::thread::sleep(ACCEPT_POLL),
                    }
                }
            })?;
        Ok(Self {
            address,
            stop,
            accept: Some(accept),
            admission,
        })
    }

    /// Connections being served (authenticating or authenticated).
    pub fn live_connections(&self) -> usize {
        self.admission.live.load(Ordering::Acquire)
    }

    /// Process ids of the UCX home helpers of this agent's live UCX
    /// connections (one each).
    pub fn ucx_helper_pids(&self) -> Vec<u32> {
        self.admission
            .helpers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The `host:port` the agent listens on.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Stops accepting connections (idempotent).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Per-connection state.
#[derive(Default)]
struct Session {
    /// Taken by `end_session` before the rest drops.
    #[cfg(rlinf_ucx)]
    ucx: Option<UcxSession>,
    /// A clone of the control stream (closed when the UCX helper dies).
    #[cfg(rlinf_ucx)]
    control: Option<TcpStream>,
    /// Whether the connection is TLS (it may then not say the UCX hello).
    encrypted: bool,
    helpers: Helpers,
    channels: Vec<Channel>,
    pending: HashMap<u64, PendingPut>,
    poisoned: HashMap<u64, String>,
    leases: HashMap<u64, Lease>,
    next_token: u64,
}

impl Session {
    fn channel(&self, handle: u32) -> Result<&Channel, ChannelError> {
        self.channels
            .get(handle as usize)
            .ok_or_else(|| ChannelError::Invalid(format!("unknown channel handle {handle}")))
    }

    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }
}

/// A connection's UCX state: its helper process, and per opened channel
/// (indexed like `Session::channels`) the channel's mapping base here and in
/// the helper.
#[cfg(rlinf_ucx)]
struct UcxSession {
    helper: crate::transport::ucx_home::HomeHelper,
    bases: Vec<(u64, u64)>,
}

impl Session {
    /// Whether payloads of this connection move by UCX (replies carry keys
    /// and block addresses).
    fn ucx(&self) -> bool {
        #[cfg(rlinf_ucx)]
        return self.ucx.is_some();
        #[cfg(not(rlinf_ucx))]
        false
    }

    /// The address, in the UCX helper's mapping, of `ptr` in channel
    /// `handle`'s mapping here (`ptr` itself without UCX).
    fn remote_address(&self, handle: u32, ptr: *const u8) -> u64 {
        #[cfg(rlinf_ucx)]
        if let Some((here, there)) = self.ucx.as_ref().and_then(|u| u.bases.get(handle as usize)) {
            return ptr as u64 - here + there;
        }
        let _ = handle;
        ptr as u64
    }
}

/// Ends a connection. With UCX: the helper stops UCX first (drained, or
/// killed), then the session drops (withdrawing unpublished puts, releasing
/// leases, letting go of the channels), then the helper lets go of its
/// mappings and exits, so that no late write lands in a withdrawn block and
/// the last holder of a segment is the helper, even if this process dies.
fn end_session(s: Session) {
    #[cfg(rlinf_ucx)]
    let (s, ucx) = {
        let mut s = s;
        let ucx = s.ucx.take().map(|mut u| {
            u.helper.quiesce();
            u
        });
        (s, ucx)
    };
    let helpers = Arc::clone(&s.helpers);
    drop(s);
    #[cfg(rlinf_ucx)]
    if let Some(mut u) = ucx {
        u.helper.end();
        let pid = u.helper.pid();
        helpers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&p| p != pid);
    }
    let _ = helpers;
}

#[cfg(rlinf_ucx)]
fn ucx_hello(s: &mut Session) -> Result<Vec<u8>, ChannelError> {
    if !s.channels.is_empty() || s.ucx.is_some() {
        return Err(ChannelError::Invalid(
            "UCX hello must be the first message of a connection".into(),
        ));
    }
    let command = ucx_home_helper().ok_or_else(|| {
        ChannelError::Invalid(format!(
            "no UCX home helper is configured on the home node (set {UCX_HOME_HELPER_ENV} \
             or call agent::set_ucx_home_helper)"
        ))
    })?;
    let control = s.control.as_ref().and_then(|c| c.try_clone().ok());
    let on_death = move |status: String| {
        let peer = control
            .as_ref()
            .and_then(|c| c.peer_addr().ok())
            .map_or_else(|| "?".to_owned(), |a| a.to_string());
        eprintln!(
            "rlinf channel agent: the UCX home helper of the connection from {peer} died \
             ({status}); ending that connection"
        );
        if let Some(c) = control {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    };
    let helper = crate::transport::ucx_home::HomeHelper::spawn(&command, on_death)
        .map_err(|e| ChannelError::Invalid(format!("UCX cannot start on the home node: {e}")))?;
    let reply = Writer::new(OK).bytes(helper.address()).finish();
    s.helpers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(helper.pid());
    s.ucx = Some(UcxSession {
        helper,
        bases: Vec::new(),
    });
    Ok(reply)
}

#[cfg(not(rlinf_ucx))]
fn ucx_hello(_: &mut Session) -> Result<Vec<u8>, ChannelError> {
    Err(ChannelError::Invalid(
        "this channel agent was built without UCX support (the `ucx` cargo feature)".into(),
    ))
}

/// Has the helper attach and register a newly opened channel; returns its
/// packed key.
#[cfg(rlinf_ucx)]
fn ucx_register(
    s: &mut Session,
    ch: &Channel,
    ns: &str,
    name: &str,
) -> Result<Option<Vec<u8>>, ChannelError> {
    let Some(u) = s.ucx.as_mut() else {
        return Ok(None);
    };
    let (base, key) = u
        .helper
        .attach(ns, name)
        .map_err(|e| ChannelError::Invalid(format!("cannot register the channel with UCX: {e}")))?;
    u.bases.push((ch.mapped_region().0 as u64, base));
    Ok(Some(key))
}

#[cfg(not(rlinf_ucx))]
fn ucx_register(
    _: &mut Session,
    _: &Channel,
    _: &str,
    _: &str,
) -> Result<Option<Vec<u8>>, ChannelError> {
    Ok(None)
}

/// Counts a new connection in and serves it on a thread of its own, or closes
/// it at once when `max_connections` are live.
fn admit(stream: TcpStream, peer: IpAddr, admission: &Arc<Admission>) {
    let live = admission.live.fetch_add(1, Ordering::AcqRel);
    if live >= admission.max_connections {
        admission.live.fetch_sub(1, Ordering::AcqRel);
        admission.log_once(
            Some(peer),
            &format!(
                "{} connections are live, the most this agent serves",
                admission.max_connections
            ),
        );
        return; // dropping the stream closes it
    }
    let admission = Arc::clone(admission);
    let spawned = std::thread::Builder::new()
        .name("rlinf-agent-conn".into())
        .spawn({
            let admission = Arc::clone(&admission);
            move || {
                authenticate_then_serve(stream, peer, &admission);
                admission.live.fetch_sub(1, Ordering::AcqRel);
            }
        });
    if spawned.is_err() {
        admission.live.fetch_sub(1, Ordering::AcqRel);
    }
}

fn authenticate_then_serve(stream: TcpStream, peer: IpAddr, admission: &Admission) {
    let _ = stream.set_nodelay(true);
    match authenticate(stream, admission) {
        Ok(stream) => serve(stream, Arc::clone(&admission.helpers)),
        Err(Refusal::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
            // The peer hung up during the handshake (a client that rejected our
            // proof, or a port probe): refused, nothing was served.
            admission.log_once(Some(peer), "closed before authenticating");
        }
        Err(why) => admission.log_once(Some(peer), &why.to_string()),
    }
}

/// Runs the handshake: TLS first if the peer's first byte opens a TLS
/// ClientHello, then the challenge-response (bound to TLS if any).
fn authenticate(mut stream: TcpStream, admission: &Admission) -> Result<Stream, Refusal> {
    let timeout = admission.handshake_timeout;
    stream.set_read_timeout(Some(timeout))?;
    let mut first = [0u8; 1];
    if stream.peek(&mut first)? == 0 {
        return Err(Refusal::Io(io::ErrorKind::UnexpectedEof.into()));
    }
    if first[0] == tls::CLIENT_HELLO_FIRST_BYTE {
        return tls::accept(stream, &admission.tls, &admission.secret, timeout);
    }
    auth::agent_handshake(&mut stream, &admission.secret, timeout)?;
    Ok(Stream::Plain(stream))
}

fn serve(stream: Stream, helpers: Helpers) {
    let mut session = Session {
        helpers,
        #[cfg(rlinf_ucx)]
        control: stream.tcp().try_clone().ok(),
        encrypted: stream.is_tls(),
        ..Session::default()
    };
    let mut stream = stream;
    let mut frame = Vec::new();
    while wire::read_frame(&mut stream, &mut frame).is_ok() {
        let result = match frame.first().copied() {
            Some(OP_WRITE) => one_sided_write(&mut stream, &frame, &mut session),
            Some(OP_READ) => one_sided_read(&mut stream, &frame, &session),
            Some(OP_RELEASE) => {
                if let Ok(token) = Reader::new(&frame[1..]).u64() {
                    session.leases.remove(&token);
                }
                Ok(())
            }
            _ => {
                let reply = match handle(&frame, &mut session) {
                    Ok(reply) => reply,
                    Err(e) => Writer::new(error_code(&e))
                        .bytes(e.to_string().as_bytes())
                        .finish(),
                };
                wire::write_frame(&mut stream, &reply)
            }
        };
        if result.is_err() {
            break;
        }
    }
    end_session(session);
}

fn one_sided_write(stream: &mut Stream, frame: &[u8], s: &mut Session) -> io::Result<()> {
    let mut r = Reader::new(&frame[1..]);
    let (token, offset, len) = (r.u64()?, r.u64()?, r.u64()?);
    let target = s.pending.get_mut(&token).and_then(|p| {
        let end = offset.checked_add(len)?;
        (end <= p.len() as u64).then(|| &mut p.block_mut()[offset as usize..end as usize])
    });
    match target {
        Some(dst) => stream.read_exact(dst), // payload lands directly in the arena block
        None => {
            // Only a reservation is poisoned (its publish then fails): a
            // token nobody holds records nothing, so a stray write neither
            // poisons the reservation that later gets that token nor grows
            // this map.
            if s.pending.contains_key(&token) {
                s.poisoned.insert(
                    token,
                    format!("write to token {token} at {offset}+{len} is out of range"),
                );
            }
            io::copy(&mut stream.take(len), &mut io::sink()).map(|_| ())
        }
    }
}

fn one_sided_read(stream: &mut Stream, frame: &[u8], s: &Session) -> io::Result<()> {
    let mut r = Reader::new(&frame[1..]);
    let (token, offset, len) = (r.u64()?, r.u64()?, r.u64()?);
    let src = s.leases.get(&token).and_then(|l| {
        let end = offset.checked_add(len)?;
        (end <= l.len() as u64).then(|| &l.bytes()[offset as usize..end as usize])
    });
    match src {
        Some(bytes) => {
            stream.write_all(&[OK])?;
            stream.write_all(bytes) // straight from the shared block
        }
        None => stream.write_all(&[1]),
    }
}

fn handle(frame: &[u8], s: &mut Session) -> Result<Vec<u8>, ChannelError> {
    let mut r = Reader::new(frame);
    let op = r.u8()?;
    Ok(match op {
        OP_UCX_HELLO if s.encrypted => return Err(ChannelError::Invalid(tls::UCX_OVER_TLS.into())),
        OP_UCX_HELLO => ucx_hello(s)?,
        OP_OPEN => {
            if s.channels.len() >= MAX_SESSION_CHANNELS {
                return Err(ChannelError::Invalid(format!(
                    "a connection may open at most {MAX_SESSION_CHANNELS} channels"
                )));
            }
            let (ns, name, create) = (r.str()?.to_owned(), r.str()?.to_owned(), r.u8()? != 0);
            let opts = ChannelOptions {
                max_lanes: r.u32()?,
                lane_capacity: r.u32()?,
                max_blocks: r.u32()?,
                arena_bytes: r.u64()?,
                user_tag: r.u32()?,
            };
            let ch = if create {
                Channel::create(&ns, &name, opts)?
            } else {
                Channel::attach(&ns, &name)?
            };
            let key = ucx_register(s, &ch, &ns, &name)?;
            let mut reply = Writer::new(OK)
                .u32(s.channels.len() as u32)
                .u32(ch.lane_capacity())
                .u32(ch.user_tag())
                .u64(ch.arena_size());
            if let Some(key) = key {
                reply = reply.bytes(&key);
            }
            s.channels.push(ch);
            reply.finish()
        }
        OP_LANE => {
            let ch = s.channel(r.u32()?)?;
            Writer::new(OK).u32(ch.lane(r.bytes()?)?).finish()
        }
        OP_RESERVE => {
            let handle = r.u32()?;
            let ch = s.channel(handle)?.clone();
            let (lane, total, weight) = (r.u32()?, r.u64()?, r.i64()?);
            let (timeout, nonblocking) = (capped_wait(timeout_from_ms(r.i64()?)), r.u8()? != 0);
            let mut pending = ch.reserve_put(lane, total, weight, Some(timeout), nonblocking)?;
            let token = s.token();
            let mut reply = Writer::new(OK).u64(token);
            if s.ucx() {
                reply = reply.u64(s.remote_address(handle, pending.block_mut().as_mut_ptr()));
            }
            s.pending.insert(token, pending);
            reply.finish()
        }
        OP_PUBLISH => {
            let token = r.u64()?;
            let pending = s.pending.remove(&token).ok_or_else(|| {
                ChannelError::Invalid(format!("no reservation with token {token}"))
            })?;
            if let Some(why) = s.poisoned.remove(&token) {
                drop(pending); // withdrawn
                return Err(ChannelError::Invalid(why));
            }
            pending.publish();
            Writer::new(OK).finish()
        }
        OP_TAKE => {
            let handle = r.u32()?;
            let ch = s.channel(handle)?.clone();
            let (lane, target) = (r.u32()?, r.i64()?);
            let (timeout, nonblocking) = (capped_wait(timeout_from_ms(r.i64()?)), r.u8()? != 0);
            let leases = if target == 0 {
                vec![ch.get(lane, Some(timeout), nonblocking)?]
            } else {
                ch.get_batch(lane, target, Some(timeout))?
            };
            let mut w = Writer::new(OK).u32(leases.len() as u32);
            let addresses: Vec<u64> = leases
                .iter()
                .map(|l| s.remote_address(handle, l.as_ptr()))
                .collect();
            for lease in leases {
                let token = s.token();
                w = w.u64(token).u64(lease.len() as u64);
                s.leases.insert(token, lease);
            }
            if s.ucx() {
                for a in addresses {
                    w = w.u64(a);
                }
            }
            w.finish()
        }
        OP_QSIZE => {
            let ch = s.channel(r.u32()?)?;
            Writer::new(OK).u64(ch.qsize(r.u32()?)?).finish()
        }
        OP_CLOSE => {
            s.channel(r.u32()?)?.close();
            Writer::new(OK).finish()
        }
        OP_CLOSED => Writer::new(OK)
            .u8(s.channel(r.u32()?)?.is_closed() as u8)
            .finish(),
        OP_RECLAIM => Writer::new(OK)
            .u64(s.channel(r.u32()?)?.reclaim()? as u64)
            .finish(),
        OP_WAIT_READABLE => {
            let ch = s.channel(r.u32()?)?;
            let lane = r.u32()?;
            let timeout =
                timeout_from_ms(r.i64()?).map_or(Duration::ZERO, |t| t.min(MAX_REQUEST_WAIT));
            Writer::new(OK)
                .u8(ch.wait_readable(lane, timeout)? as u8)
                .finish()
        }
        OP_STATS => {
            let st = s.channel(r.u32()?)?.stats()?;
            Writer::new(OK)
                .u32(st.blocks)
                .u32(st.free_blocks)
                .u32(st.leased_blocks)
                .u32(st.queued_blocks)
                .u32(st.writing_blocks)
                .u32(st.lanes)
                .u64(st.arena_used)
                .u64(st.arena_size)
                .finish()
        }
        other => return Err(ChannelError::Invalid(format!("unknown operation {other}"))),
    })
}
