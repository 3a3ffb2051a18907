//! The TCP transport: control frames and emulated one-sided operations over
//! one stream per endpoint.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::{Endpoint, OpId, RemoteDesc, Transport};
use crate::auth;
use crate::wire::{self, Writer};

/// Operation codes of the emulated one-sided operations on the wire.
pub const OP_WRITE: u8 = 0xF0;
/// See [`OP_WRITE`].
pub const OP_READ: u8 = 0xF1;

/// TCP, with `TCP_NODELAY` and keepalive (a dead peer is noticed by the OS).
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpTransport;

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn connect(&self, address: &str, timeout: Duration) -> io::Result<Box<dyn Endpoint>> {
        Ok(Box::new(TcpEndpoint::new(connect_stream(
            address, timeout,
        )?)?))
    }
}

/// Connects an authenticated control stream to `address` (`TCP_NODELAY`
/// set), trying each address it resolves to: the handshake of
/// [`crate::auth`] with the process's secret, within `timeout`.
///
/// # Errors
/// If no address accepts the connection, or (`PermissionDenied`) the agent and
/// this process do not share the secret.
pub fn connect_stream(address: &str, timeout: Duration) -> io::Result<TcpStream> {
    let secret = auth::process_secret()?;
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("address {address:?} resolves to nothing"),
    );
    for addr in address.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(mut stream) => {
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(timeout))?;
                auth::client_handshake(&mut stream, &secret)?;
                stream.set_read_timeout(None)?;
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// One TCP connection to an agent.
pub struct TcpEndpoint {
    stream: TcpStream,
    next_op: OpId,
    done: VecDeque<(OpId, io::Result<()>)>,
}

impl TcpEndpoint {
    /// Wraps a connected stream.
    pub fn new(stream: TcpStream) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            next_op: 1,
            done: VecDeque::new(),
        })
    }

    /// Records a finished operation for `poll` and returns its id, or its error.
    fn complete(&mut self, r: io::Result<()>) -> io::Result<OpId> {
        let id = self.next_op;
        self.next_op += 1;
        // The caller gets the error now; `poll` reports a copy of it.
        let report = r
            .as_ref()
            .map(|_| ())
            .map_err(|e| io::Error::new(e.kind(), e.to_string()));
        self.done.push_back((id, report));
        r.map(|()| id)
    }
}

fn check_sizes(op: &str, local: usize, remote: &RemoteDesc) -> io::Result<()> {
    if local as u64 == remote.len {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{op}: local size {local} differs from the remote size {}",
                remote.len
            ),
        ))
    }
}

fn one_sided_header(op: u8, desc: &RemoteDesc) -> Vec<u8> {
    Writer::new(op)
        .u64(desc.region)
        .u64(desc.offset)
        .u64(desc.len)
        .finish()
}

/// Writes all of `slices` (like `write_all`, for vectored writes).
pub fn write_all_vectored(w: &mut impl Write, slices: &[IoSlice<'_>]) -> io::Result<()> {
    for s in slices {
        // Large slices go out in one call each; the kernel handles segmentation.
        w.write_all(s)?;
    }
    Ok(())
}

impl Endpoint for TcpEndpoint {
    fn call(&mut self, request: &[u8], reply: &mut Vec<u8>) -> io::Result<()> {
        wire::write_frame(&mut self.stream, request)?;
        wire::read_frame(&mut self.stream, reply)
    }

    fn notify(&mut self, message: &[u8]) -> io::Result<()> {
        wire::write_frame(&mut self.stream, message)
    }

    fn post_write(&mut self, src: &[IoSlice<'_>], dst: RemoteDesc) -> io::Result<OpId> {
        check_sizes("post_write", src.iter().map(|s| s.len()).sum(), &dst)?;
        wire::write_frame(&mut self.stream, &one_sided_header(OP_WRITE, &dst))?;
        let r = write_all_vectored(&mut self.stream, src);
        self.complete(r)
    }

    fn post_read(&mut self, dst: &mut [u8], src: RemoteDesc) -> io::Result<OpId> {
        check_sizes("post_read", dst.len(), &src)?;
        wire::write_frame(&mut self.stream, &one_sided_header(OP_READ, &src))?;
        // The agent answers with a one-byte status, then the bytes.
        let mut status = [0u8; 1];
        self.stream.read_exact(&mut status)?;
        let r = if status[0] == 0 {
            self.stream.read_exact(dst)
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "agent refused the read (bad region or range)",
            ))
        };
        self.complete(r)
    }

    fn poll(&mut self, done: &mut Vec<(OpId, io::Result<()>)>) -> io::Result<usize> {
        let n = self.done.len();
        done.extend(self.done.drain(..));
        Ok(n)
    }
}
