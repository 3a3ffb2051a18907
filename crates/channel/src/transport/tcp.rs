//! The TCP transport: control frames and emulated one-sided operations over
//! one stream per endpoint, plain or (feature `tls`) encrypted with TLS.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::{Endpoint, OpId, RemoteDesc, Transport};
use crate::auth;
use crate::tls::{self, Stream};
use crate::wire::{self, Writer};

/// Operation codes of the emulated one-sided operations on the wire.
pub const OP_WRITE: u8 = 0xF0;
/// See [`OP_WRITE`].
pub const OP_READ: u8 = 0xF1;

/// TCP, with `TCP_NODELAY` and keepalive (a dead peer is noticed by the OS);
/// encrypted with TLS when [`tls::TLS_ENV`] asks for it at connect.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpTransport;

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn connect(&self, address: &str, timeout: Duration) -> io::Result<Box<dyn Endpoint>> {
        let stream = connect_secured(address, timeout, tls::requested()?)?;
        Ok(Box::new(TcpEndpoint::new(stream)?))
    }
}

/// TCP with TLS on every connection, whatever [`tls::TLS_ENV`] says (an
/// error if this build lacks the `tls` feature).
#[derive(Debug, Default, Clone, Copy)]
pub struct TlsTransport;

impl Transport for TlsTransport {
    fn name(&self) -> &'static str {
        "tcp+tls"
    }

    fn connect(&self, address: &str, timeout: Duration) -> io::Result<Box<dyn Endpoint>> {
        let stream = connect_secured(address, timeout, true)?;
        Ok(Box::new(TcpEndpoint::new(stream)?))
    }
}

/// Opens a TCP connection to `address` (`TCP_NODELAY` set), trying each
/// address it resolves to.
fn dial(address: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("address {address:?} resolves to nothing"),
    );
    for addr in address.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Connects an authenticated plain control stream to `address`
/// (`TCP_NODELAY` set), trying each address it resolves to: the handshake
/// of [`crate::auth`] with the process's secret, within `timeout`.
///
/// # Errors
/// If no address accepts the connection, or (`PermissionDenied`) the agent and
/// this process do not share the secret.
pub fn connect_stream(address: &str, timeout: Duration) -> io::Result<TcpStream> {
    let secret = auth::process_secret()?;
    let mut stream = dial(address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    auth::client_handshake(&mut stream, &secret)?;
    stream.set_read_timeout(None)?;
    Ok(stream)
}

/// Connects an authenticated control stream to `address`: plain as
/// [`connect_stream`], or with `tls` a TLS connection whose handshake of
/// [`crate::auth`] runs inside TLS, bound to it ([`tls::connect`]).
///
/// # Errors
/// As [`connect_stream`]; with `tls`, also if TLS fails or this build lacks it.
pub fn connect_secured(address: &str, timeout: Duration, tls: bool) -> io::Result<Stream> {
    if !tls {
        return connect_stream(address, timeout).map(Stream::Plain);
    }
    let secret = auth::process_secret()?;
    let stream = dial(address, timeout)?;
    let peer = stream
        .peer_addr()
        .map_or_else(|_| address.to_owned(), |a| a.to_string());
    tls::connect(stream, &peer, &secret, timeout)
}

/// One TCP connection to an agent, plain or TLS.
pub struct TcpEndpoint {
    stream: Stream,
    next_op: OpId,
    done: VecDeque<(OpId, io::Result<()>)>,
}

impl TcpEndpoint {
    /// Wraps a connected stream (a `TcpStream`, or a [`Stream`]).
    pub fn new(stream: impl Into<Stream>) -> io::Result<Self> {
        let stream = stream.into();
        stream.tcp().set_nodelay(true)?;
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

    fn transport(&self) -> &'static str {
        if self.stream.is_tls() {
            "tcp+tls"
        } else {
            "tcp"
        }
    }
}
