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
//! its payloads moved by UCX instead: the agent registers each channel it
//! opens for that connection with this process's UCX worker and tells the
//! peer where each reserved or leased block lives (see `transport::ucx`).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::channel::{Channel, ChannelError, ChannelOptions, Lease, PendingPut};
use crate::protocol::*;
use crate::transport::tcp::{OP_READ, OP_WRITE};
use crate::wire::{self, Reader, Writer};

/// A running agent. Dropping it stops accepting; live connections end when
/// their peers disconnect.
pub struct Agent {
    address: String,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Agent {
    /// Starts an agent listening on `bind` (e.g. `"127.0.0.1:0"` for any free port).
    ///
    /// # Errors
    /// If the address cannot be bound.
    pub fn start(bind: &str) -> io::Result<Self> {
        let listener = TcpListener::bind(bind)?;
        let address = listener.local_addr()?.to_string();
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let accept = std::thread::Builder::new()
            .name("rlinf-agent".into())
            .spawn(move || {
                while !stop2.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let _ = std::thread::Builder::new()
                                .name("rlinf-agent-conn".into())
                                .spawn(move || serve(stream));
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })?;
        Ok(Self {
            address,
            stop,
            accept: Some(accept),
        })
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
    // First field: dropped (unregistered) before the channels it maps.
    #[cfg(rlinf_ucx)]
    ucx: Option<UcxSession>,
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

/// A connection's UCX state: the home worker and one registered region per
/// opened channel (indexed like `Session::channels`).
#[cfg(rlinf_ucx)]
struct UcxSession {
    home: Arc<crate::transport::ucx::Home>,
    regions: Vec<crate::ucx_sys::MemRegion>,
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

    /// Ends UCX use: unregisters the regions, then lets the progress thread
    /// apply whatever the peer had already sent, so no late write lands in a
    /// block after it is withdrawn (which happens when the session drops).
    fn end_ucx(&mut self) {
        #[cfg(rlinf_ucx)]
        if let Some(u) = self.ucx.take() {
            drop(u.regions);
            u.home.quiesce();
        }
    }
}

#[cfg(rlinf_ucx)]
fn ucx_hello(s: &mut Session) -> Result<Vec<u8>, ChannelError> {
    if !s.channels.is_empty() || s.ucx.is_some() {
        return Err(ChannelError::Invalid(
            "UCX hello must be the first message of a connection".into(),
        ));
    }
    let home = crate::transport::ucx::home()
        .map_err(|e| ChannelError::Invalid(format!("UCX cannot start on the home node: {e}")))?;
    let reply = Writer::new(OK).bytes(home.address()).finish();
    s.ucx = Some(UcxSession {
        home,
        regions: Vec::new(),
    });
    Ok(reply)
}

#[cfg(not(rlinf_ucx))]
fn ucx_hello(_: &mut Session) -> Result<Vec<u8>, ChannelError> {
    Err(ChannelError::Invalid(
        "this channel agent was built without UCX support (the `ucx` cargo feature)".into(),
    ))
}

/// Registers a newly opened channel's mapping; returns its packed key.
#[cfg(rlinf_ucx)]
fn ucx_register(s: &mut Session, ch: &Channel) -> Result<Option<Vec<u8>>, ChannelError> {
    let Some(u) = s.ucx.as_mut() else {
        return Ok(None);
    };
    let (base, len) = ch.mapped_region();
    // SAFETY: the region is dropped before the channel handle that keeps the
    // mapping alive: `end_ucx` runs before the session's channels drop, and
    // `ucx` is the session's first field.
    let (region, key) = unsafe { u.home.register(base, len) }
        .map_err(|e| ChannelError::Invalid(format!("cannot register the channel with UCX: {e}")))?;
    u.regions.push(region);
    Ok(Some(key))
}

#[cfg(not(rlinf_ucx))]
fn ucx_register(_: &mut Session, _: &Channel) -> Result<Option<Vec<u8>>, ChannelError> {
    Ok(None)
}

fn serve(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut session = Session::default();
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
    session.end_ucx();
    // Dropping the session withdraws unpublished puts and releases leases.
}

fn one_sided_write(stream: &mut TcpStream, frame: &[u8], s: &mut Session) -> io::Result<()> {
    let mut r = Reader::new(&frame[1..]);
    let (token, offset, len) = (r.u64()?, r.u64()?, r.u64()?);
    let target = s.pending.get_mut(&token).and_then(|p| {
        let end = offset.checked_add(len)?;
        (end <= p.len() as u64).then(|| &mut p.block_mut()[offset as usize..end as usize])
    });
    match target {
        Some(dst) => stream.read_exact(dst), // payload lands directly in the arena block
        None => {
            s.poisoned.insert(
                token,
                format!("write to token {token} at {offset}+{len} is out of range"),
            );
            io::copy(&mut stream.take(len), &mut io::sink()).map(|_| ())
        }
    }
}

fn one_sided_read(stream: &mut TcpStream, frame: &[u8], s: &Session) -> io::Result<()> {
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
        OP_UCX_HELLO => ucx_hello(s)?,
        OP_OPEN => {
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
            let key = ucx_register(s, &ch)?;
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
            let ch = s.channel(r.u32()?)?.clone();
            let (lane, total, weight) = (r.u32()?, r.u64()?, r.i64()?);
            let (timeout, nonblocking) = (timeout_from_ms(r.i64()?), r.u8()? != 0);
            let mut pending = ch.reserve_put(lane, total, weight, timeout, nonblocking)?;
            let token = s.token();
            let mut reply = Writer::new(OK).u64(token);
            if s.ucx() {
                reply = reply.u64(pending.block_mut().as_mut_ptr() as u64);
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
            let ch = s.channel(r.u32()?)?.clone();
            let (lane, target) = (r.u32()?, r.i64()?);
            let (timeout, nonblocking) = (timeout_from_ms(r.i64()?), r.u8()? != 0);
            let leases = if target == 0 {
                vec![ch.get(lane, timeout, nonblocking)?]
            } else {
                ch.get_batch(lane, target, timeout)?
            };
            let mut w = Writer::new(OK).u32(leases.len() as u32);
            let addresses: Vec<u64> = leases.iter().map(|l| l.as_ptr() as u64).collect();
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
            let timeout = timeout_from_ms(r.i64()?).unwrap_or(Duration::ZERO);
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
