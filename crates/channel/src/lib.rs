//! RLinf data plane.
//!
//! - [`naming`]: names of the shared-memory segments (`rlinf.<namespace>.<channel>`).
//! - [`layout`]: the byte layout of a channel segment.
//! - [`channel`]: the shared-memory channel (keyed FIFO lanes over a block arena).
//! - [`encoding`]: the byte format of a message block (header, buffer table,
//!   aligned buffers) and of lane keys.
//! - [`transport`]: the node-transport contract (one-sided writes/reads) and its TCP backend.
//! - [`agent`], [`remote`], [`protocol`], [`wire`]: the per-node agent that serves
//!   channels to other nodes, its client, and their control messages.
//! - [`auth`]: the mutual challenge-response every agent connection starts with.
//! - [`tls`]: optional TLS on agent connections (feature `tls`), and the stream
//!   type (plain or TLS) the agent and the TCP transport read and write.
//! - [`spin`]: the adaptive spin-then-sleep policy of waiters.
//! - `sys` (private): audited wrappers over shm, mmap, flock, futex, liveness.
//! - `ucx_sys` (private, feature `ucx`): audited wrappers over the UCX C shim.
//!
//! The core is plain Rust; the Python bindings live in `python` behind the
//! `python` feature, which maturin enables when it builds `rlinf.core._native`.

pub mod agent;
pub mod auth;
pub mod channel;
pub mod encoding;
pub mod layout;
pub mod naming;
pub mod protocol;
pub mod remote;
pub mod spin;
mod sys;
pub mod tls;
pub mod transport;
#[cfg(rlinf_ucx)]
mod ucx_sys;
pub mod wire;

#[cfg(feature = "python")]
mod python;

pub use agent::{Agent, AgentOptions};
pub use channel::{
    Channel, ChannelError, ChannelOptions, Lease, PendingPut, Stats, cleanup_stale_segments,
    release_all_names, release_owned_names,
};
pub use remote::RemoteChannel;
pub use transport::tcp::{TcpTransport, TlsTransport};
#[cfg(rlinf_ucx)]
pub use transport::ucx::UcxTransport;

/// Version of this crate, as Cargo knows it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
