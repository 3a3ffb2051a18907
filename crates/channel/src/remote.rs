//! A channel on another node, reached through its agent over a [`Transport`].
//!
//! Same operations as [`crate::Channel`]; payloads move with the transport's
//! one-sided operations (a put writes the message image straight into the
//! reserved remote block; a get reads the leased block into local memory).
//! Blocking calls are cut into slices of at most [`REMOTE_SLICE`], so the
//! agent never blocks on behalf of a peer that has gone away.

use std::io::IoSlice;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::channel::{
    ChannelError, ChannelOptions, Piece, Result, Stats, message_pieces, message_size,
};
use crate::protocol::*;
use crate::transport::{Endpoint, RemoteDesc, Transport, wait_op};
use crate::wire::{Reader, Writer};

/// Longest single blocking request sent to an agent.
pub const REMOTE_SLICE: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
static ZEROS: [u8; 64] = [0; 64];

struct Conn {
    ep: Box<dyn Endpoint>,
    handle: u32,
    reply: Vec<u8>,
}

impl Conn {
    /// Sends `request`, returns a reader positioned after an OK status.
    fn call(&mut self, request: &[u8]) -> Result<Reader<'_>> {
        self.ep.call(request, &mut self.reply)?;
        let mut r = Reader::new(&self.reply);
        let status = r.u8()?;
        if status != OK {
            let msg = r.str().unwrap_or("").to_owned();
            return Err(error_from_code(status, &msg));
        }
        Ok(r)
    }
}

/// A handle on a channel served by an agent on another node.
pub struct RemoteChannel {
    address: String,
    namespace: String,
    name: String,
    transport: Arc<dyn Transport>,
    idle: Mutex<Vec<Conn>>,
    lane_capacity: u32,
    user_tag: u32,
    arena_size: u64,
    moved_by: &'static str,
}

fn open(
    transport: &dyn Transport,
    address: &str,
    namespace: &str,
    name: &str,
    create: Option<ChannelOptions>,
) -> Result<(Conn, u32, u32, u64)> {
    let ep = transport.connect(address, CONNECT_TIMEOUT).map_err(|e| {
        ChannelError::Io(std::io::Error::new(
            e.kind(),
            format!(
                "cannot reach the channel agent at {address} over {}: {e}",
                transport.name()
            ),
        ))
    })?;
    let mut conn = Conn {
        ep,
        handle: 0,
        reply: Vec::new(),
    };
    let o = create.unwrap_or_default();
    let req = Writer::new(OP_OPEN)
        .bytes(namespace.as_bytes())
        .bytes(name.as_bytes())
        .u8(create.is_some() as u8)
        .u32(o.max_lanes)
        .u32(o.lane_capacity)
        .u32(o.max_blocks)
        .u64(o.arena_bytes)
        .u32(o.user_tag)
        .finish();
    let mut r = conn.call(&req)?;
    let (handle, cap, tag, arena) = (r.u32()?, r.u32()?, r.u32()?, r.u64()?);
    conn.handle = handle;
    Ok((conn, cap, tag, arena))
}

impl RemoteChannel {
    /// Connects to (or, with `create`, creates) channel `name` at the agent `address`.
    ///
    /// # Errors
    /// If the agent cannot be reached, or as [`crate::Channel::attach`] /
    /// [`crate::Channel::create`] on the home node.
    pub fn connect(
        transport: Arc<dyn Transport>,
        address: &str,
        namespace: &str,
        name: &str,
        create: Option<ChannelOptions>,
    ) -> Result<Self> {
        let (conn, lane_capacity, user_tag, arena_size) =
            open(&*transport, address, namespace, name, create)?;
        let moved_by = conn.ep.transport();
        Ok(Self {
            moved_by,
            address: address.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            transport,
            idle: Mutex::new(vec![conn]),
            lane_capacity,
            user_tag,
            arena_size,
        })
    }

    /// Runs `f` on an idle connection (opening one if none is idle). A
    /// connection that failed with an I/O error is dropped, not reused.
    fn with_conn<T>(&self, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        let idle = self
            .idle
            .lock()
            .map_err(|_| ChannelError::Invalid("connection pool poisoned".into()))?
            .pop();
        let mut conn = match idle {
            Some(c) => c,
            None => {
                open(
                    &*self.transport,
                    &self.address,
                    &self.namespace,
                    &self.name,
                    None,
                )?
                .0
            }
        };
        let r = f(&mut conn);
        if !matches!(r, Err(ChannelError::Io(_))) {
            if let Ok(mut pool) = self.idle.lock() {
                pool.push(conn);
            }
        }
        r
    }

    /// Repeats a blocking request in slices until done or past `timeout`.
    fn sliced<T>(
        &self,
        timeout: Option<Duration>,
        mut f: impl FnMut(Duration) -> Result<T>,
    ) -> Result<T> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let slice = deadline.map_or(REMOTE_SLICE, |d| {
                d.saturating_duration_since(Instant::now())
                    .min(REMOTE_SLICE)
            });
            match f(slice) {
                Err(ChannelError::Timeout) if deadline.is_none_or(|d| Instant::now() < d) => {
                    continue;
                }
                other => return other,
            }
        }
    }

    /// The transport that moved the first connection's payloads (`"tcp"`,
    /// `"ucx"`); with `auto`, what it picked.
    pub fn transport(&self) -> &'static str {
        self.moved_by
    }

    /// The agent's address (`host:port`).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Items per lane.
    pub fn lane_capacity(&self) -> u32 {
        self.lane_capacity
    }

    /// The creator's tag (the Python layer's `maxsize`).
    pub fn user_tag(&self) -> u32 {
        self.user_tag
    }

    /// Arena size on the home node.
    pub fn arena_size(&self) -> u64 {
        self.arena_size
    }

    /// Lane for `key`, created on first use.
    ///
    /// # Errors
    /// As [`crate::Channel::lane`], or on transport failure.
    pub fn lane(&self, key: &[u8]) -> Result<u32> {
        self.with_conn(|c| {
            let req = Writer::new(OP_LANE).u32(c.handle).bytes(key).finish();
            Ok(c.call(&req)?.u32()?)
        })
    }

    /// Puts a message; see [`crate::Channel::put`].
    ///
    /// # Errors
    /// As [`crate::Channel::put`], or on transport failure.
    pub fn put(
        &self,
        lane: u32,
        header: &[u8],
        buffers: &[&[u8]],
        weight: i64,
        timeout: Option<Duration>,
        nonblocking: bool,
    ) -> Result<()> {
        let lens: Vec<usize> = buffers.iter().map(|b| b.len()).collect();
        let total = message_size(header.len(), &lens);
        let mut table = Vec::new();
        let pieces = message_pieces(header, buffers, &mut table);
        let slices: Vec<IoSlice<'_>> = pieces
            .iter()
            .filter_map(|p| match *p {
                Piece::Bytes(b) if !b.is_empty() => Some(IoSlice::new(b)),
                Piece::Zeros(n) if n > 0 => Some(IoSlice::new(&ZEROS[..n])),
                _ => None,
            })
            .collect();
        self.with_conn(|c| {
            let token = self.sliced(timeout, |slice| {
                let req = Writer::new(OP_RESERVE)
                    .u32(c.handle)
                    .u32(lane)
                    .u64(total)
                    .i64(weight)
                    .i64(if nonblocking {
                        0
                    } else {
                        timeout_ms(Some(slice))
                    })
                    .u8(nonblocking as u8)
                    .finish();
                Ok(c.call(&req)?.u64()?)
            })?;
            let op = c.ep.post_write(
                &slices,
                RemoteDesc {
                    region: token,
                    offset: 0,
                    len: total,
                },
            )?;
            wait_op(&mut *c.ep, op)?;
            c.call(&Writer::new(OP_PUBLISH).u64(token).finish())?;
            Ok(())
        })
    }

    /// Takes one message (`target == 0`) or a weighted batch; returns the
    /// message images (parse them with [`crate::channel::parse_message`]).
    ///
    /// # Errors
    /// As [`crate::Channel::get`] / [`crate::Channel::get_batch`].
    pub fn take(
        &self,
        lane: u32,
        target: i64,
        timeout: Option<Duration>,
        nonblocking: bool,
    ) -> Result<Vec<Vec<u8>>> {
        self.with_conn(|c| {
            let items: Vec<(u64, u64)> = self.sliced(timeout, |slice| {
                let req = Writer::new(OP_TAKE)
                    .u32(c.handle)
                    .u32(lane)
                    .i64(target)
                    .i64(if nonblocking {
                        0
                    } else {
                        timeout_ms(Some(slice))
                    })
                    .u8(nonblocking as u8)
                    .finish();
                let mut r = c.call(&req)?;
                let n = r.u32()?;
                (0..n).map(|_| Ok((r.u64()?, r.u64()?))).collect()
            })?;
            let mut out = Vec::with_capacity(items.len());
            for (token, len) in items {
                let mut buf = vec![0u8; len as usize];
                let op = c.ep.post_read(
                    &mut buf,
                    RemoteDesc {
                        region: token,
                        offset: 0,
                        len,
                    },
                )?;
                wait_op(&mut *c.ep, op)?;
                c.ep.notify(&Writer::new(OP_RELEASE).u64(token).finish())?;
                out.push(buf);
            }
            Ok(out)
        })
    }

    /// Waits until the lane has a published item; false on timeout.
    ///
    /// # Errors
    /// As [`crate::Channel::wait_readable`].
    pub fn wait_readable(&self, lane: u32, timeout: Duration) -> Result<bool> {
        self.with_conn(|c| {
            let req = Writer::new(OP_WAIT_READABLE)
                .u32(c.handle)
                .u32(lane)
                .i64(timeout_ms(Some(timeout)))
                .finish();
            Ok(c.call(&req)?.u8()? != 0)
        })
    }

    fn simple(&self, op: u8, lane: Option<u32>) -> Result<Vec<u8>> {
        self.with_conn(|c| {
            let mut w = Writer::new(op).u32(c.handle);
            if let Some(l) = lane {
                w = w.u32(l);
            }
            c.call(&w.finish())?;
            Ok(c.reply[1..].to_vec())
        })
    }

    /// Items in a lane.
    ///
    /// # Errors
    /// On transport failure or a bad lane.
    pub fn qsize(&self, lane: u32) -> Result<u64> {
        Ok(Reader::new(&self.simple(OP_QSIZE, Some(lane))?).u64()?)
    }

    /// Closes the channel for everyone.
    ///
    /// # Errors
    /// On transport failure.
    pub fn close(&self) -> Result<()> {
        self.simple(OP_CLOSE, None).map(|_| ())
    }

    /// Whether the channel is closed.
    ///
    /// # Errors
    /// On transport failure.
    pub fn is_closed(&self) -> Result<bool> {
        Ok(Reader::new(&self.simple(OP_CLOSED, None)?).u8()? != 0)
    }

    /// Reclaims blocks of dead processes on the home node.
    ///
    /// # Errors
    /// On transport failure.
    pub fn reclaim(&self) -> Result<usize> {
        Ok(Reader::new(&self.simple(OP_RECLAIM, None)?).u64()? as usize)
    }

    /// Arena counters of the home node.
    ///
    /// # Errors
    /// On transport failure.
    pub fn stats(&self) -> Result<Stats> {
        let b = self.simple(OP_STATS, None)?;
        let mut r = Reader::new(&b);
        Ok(Stats {
            blocks: r.u32()?,
            free_blocks: r.u32()?,
            leased_blocks: r.u32()?,
            queued_blocks: r.u32()?,
            writing_blocks: r.u32()?,
            lanes: r.u32()?,
            arena_used: r.u64()?,
            arena_size: r.u64()?,
        })
    }
}
