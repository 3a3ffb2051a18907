//! The TCP transport: control frames and emulated one-sided operations over
//! one stream per endpoint.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::{Endpoint, OpId, RemoteDesc, Transport};
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
        let mut last = io::Error::new(
            io::ErrorKind::NotFound,
            format!("address {address:?} resolves to nothing"),
        );
        for addr in address.to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(stream) => return Ok(Box::new(TcpEndpoint::new(stream)?)),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
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

    fn complete(&mut self, r: io::Result<()>) -> OpId {
        let id = self.next_op;
        self.next_op += 1;
        self.done.push_back((id, r));
        id
    }
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
        let total: usize = src.iter().map(|s| s.len()).sum();
        if total as u64 != dst.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "post_write: source and destination sizes differ",
            ));
        }
        let header = Writer::new(OP_WRITE)
            .u64(dst.region)
            .u64(dst.offset)
            .u64(dst.len)
            .finish();
        wire::write_frame(&mut self.stream, &header)?;
        let r = write_all_vectored(&mut self.stream, src);
        let failed = r
            .as_ref()
            .err()
            .map(|e| io::Error::new(e.kind(), e.to_string()));
        let id = self.complete(r);
        match failed {
            Some(e) => Err(e),
            None => Ok(id),
        }
    }

    fn post_read(&mut self, dst: &mut [u8], src: RemoteDesc) -> io::Result<OpId> {
        if dst.len() as u64 != src.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "post_read: source and destination sizes differ",
            ));
        }
        let request = Writer::new(OP_READ)
            .u64(src.region)
            .u64(src.offset)
            .u64(src.len)
            .finish();
        wire::write_frame(&mut self.stream, &request)?;
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
        let failed = r
            .as_ref()
            .err()
            .map(|e| io::Error::new(e.kind(), e.to_string()));
        let id = self.complete(r);
        match failed {
            Some(e) => Err(e),
            None => Ok(id),
        }
    }

    fn poll(&mut self, done: &mut Vec<(OpId, io::Result<()>)>) -> io::Result<usize> {
        let n = self.done.len();
        done.extend(self.done.drain(..));
        Ok(n)
    }
}
