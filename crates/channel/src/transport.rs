//! Node transports: how a process on another node reaches a channel's home node.
//!
//! The contract is shaped for one-sided transfers, so that an RDMA backend
//! (verbs or UCX) drops in without touching the channel protocol:
//!
//! 1. **Control messages** ([`Endpoint::call`]) negotiate: "reserve room for a
//!    message of N bytes", "take the next item". The home node answers with
//!    a [`RemoteDesc`] naming registered memory (an arena block) and a token.
//! 2. **One-sided operations** move the payload: [`Endpoint::post_write`] puts
//!    local bytes straight into the remote block, [`Endpoint::post_read`]
//!    pulls a remote block into local memory; [`Endpoint::poll`] reports
//!    completions. With RDMA these are `ibv_post_send` WRITE/READ on memory
//!    the agent registered; no CPU on the home node touches the bytes.
//! 3. A final control message publishes the item or releases the block.
//!
//! [`tcp::TcpTransport`] implements the contract over TCP: the home node's
//! agent emulates the one-sided operations by `recv`-ing directly into the
//! arena block (writes) and `send`-ing straight from it (reads), so payload
//! bytes are copied once on each side and never staged in a heap buffer.

use std::io::{self, IoSlice};
use std::time::Duration;

pub mod tcp;

/// Remote memory: a registered region (for the channel agent, one block held
/// by this connection, named by its token), an offset and a length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteDesc {
    /// Registered region (RDMA: the rkey's region; TCP: the reservation or lease token).
    pub region: u64,
    /// Byte offset inside the region.
    pub offset: u64,
    /// Number of bytes.
    pub len: u64,
}

/// Identifies a posted one-sided operation.
pub type OpId = u64;

/// A connection to a peer node's agent.
pub trait Endpoint: Send {
    /// Sends a control request and waits for its reply.
    fn call(&mut self, request: &[u8], reply: &mut Vec<u8>) -> io::Result<()>;

    /// Sends a control message that has no reply.
    fn notify(&mut self, message: &[u8]) -> io::Result<()>;

    /// Posts a write of the concatenation of `src` into `dst`.
    ///
    /// The source memory must stay valid and unchanged until [`Endpoint::poll`]
    /// reports the operation (TCP completes it before returning).
    fn post_write(&mut self, src: &[IoSlice<'_>], dst: RemoteDesc) -> io::Result<OpId>;

    /// Posts a read of `src` into `dst` (`dst.len() == src.len`), with the same
    /// validity rule as [`Endpoint::post_write`].
    fn post_read(&mut self, dst: &mut [u8], src: RemoteDesc) -> io::Result<OpId>;

    /// Moves finished operations into `done`; returns how many.
    fn poll(&mut self, done: &mut Vec<(OpId, io::Result<()>)>) -> io::Result<usize>;
}

/// A way to reach other nodes.
pub trait Transport: Send + Sync {
    /// Short name (`"tcp"`, later `"verbs"`, `"ucx"`).
    fn name(&self) -> &'static str;

    /// Connects to the agent at `address`, giving up after `timeout`.
    fn connect(&self, address: &str, timeout: Duration) -> io::Result<Box<dyn Endpoint>>;
}

/// Waits for operation `op` to complete on `ep`.
pub fn wait_op(ep: &mut dyn Endpoint, op: OpId) -> io::Result<()> {
    let mut done = Vec::new();
    loop {
        ep.poll(&mut done)?;
        if let Some(i) = done.iter().position(|(id, _)| *id == op) {
            return done.swap_remove(i).1;
        }
        std::thread::yield_now();
    }
}
