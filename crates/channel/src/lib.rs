//! RLinf data plane.
//!
//! - [`naming`]: names of the shared-memory segments (`rlinf.<namespace>.<channel>`).
//! - [`layout`]: the byte layout of a channel segment.
//! - [`channel`]: the shared-memory channel (keyed FIFO lanes over a block arena).
//! - `sys` (private): audited wrappers over shm, mmap, flock, futex, liveness.
//!
//! The core is plain Rust; the Python bindings live in `python` behind the
//! `python` feature, which maturin enables when it builds `rlinf.core._native`.

pub mod channel;
pub mod layout;
pub mod naming;
mod sys;

#[cfg(feature = "python")]
mod python;

pub use channel::{Channel, ChannelError, ChannelOptions, Lease, Stats, cleanup_stale_segments};

/// Version of this crate, as Cargo knows it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
