//! RLinf data plane.
//!
//! This crate holds everything RLinf moves data with: the shared-memory
//! segment naming rules ([`naming`]) today, and the channel itself (lanes,
//! block arena, waiters, transports) as it lands. The core is plain Rust; the
//! Python bindings live in [`python`] behind the `python` feature, which
//! maturin enables when it builds `rlinf.core._native`.

pub mod naming;

#[cfg(feature = "python")]
mod python;

/// Version of this crate, as Cargo knows it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
