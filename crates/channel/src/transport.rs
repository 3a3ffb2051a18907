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
//! [`select`] picks the transport from `RLINF_CHANNEL_TRANSPORT`
//! (`auto`, `tcp`, `ucx`); `ucx` exists when the crate is built with the
//! `ucx` feature on a machine with UCX's headers (see [`ucx`]), and works
//! where UCX's runtime library loads ([`ucx_unavailable`]). TCP connections
//! are encrypted with TLS when `RLINF_CHANNEL_TLS=1` ([`crate::tls`]), which
//! rules UCX out.
//!
//! [`tcp::TcpTransport`] implements the contract over TCP: the home node's
//! agent emulates the one-sided operations by `recv`-ing directly into the
//! arena block (writes) and `send`-ing straight from it (reads), so payload
//! bytes are copied once on each side and never staged in a heap buffer.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

pub mod tcp;
#[cfg(rlinf_ucx)]
pub mod ucx;
#[cfg(rlinf_ucx)]
pub mod ucx_home;

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

    /// Name of the transport that moves this endpoint's payloads.
    fn transport(&self) -> &'static str {
        "tcp"
    }
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

/// Environment variable choosing the node transport: `auto` (default), `tcp`, `ucx`.
pub const TRANSPORT_ENV: &str = "RLINF_CHANNEL_TRANSPORT";

/// The values [`TRANSPORT_ENV`] accepts.
pub const TRANSPORT_CHOICES: &str = "auto, tcp, ucx";

/// Whether this build includes the UCX transport (the `ucx` cargo feature,
/// built where UCX's headers were found). UCX itself is loaded at run time:
/// see [`ucx_unavailable`].
pub const UCX_COMPILED: bool = cfg!(rlinf_ucx);

/// Why the UCX transport cannot be used in this process, or `None` when it
/// can: the build lacks it, or UCX's runtime library (`libucp.so.0`, or
/// `$RLINF_UCX_LIBRARY`) does not load. Loads the library on first call.
pub fn ucx_unavailable() -> Option<String> {
    #[cfg(rlinf_ucx)]
    return crate::ucx_sys::load().err().map(|e| e.to_string());
    #[cfg(not(rlinf_ucx))]
    Some(NO_UCX_BUILD.to_owned())
}

#[cfg(not(rlinf_ucx))]
const NO_UCX_BUILD: &str = "this build of rlinf-channel has no UCX support: it was built \
     without the `ucx` cargo feature, or where UCX's headers were missing (install \
     libucx-dev and rebuild; see docs/channel.md)";

/// The transport named by `value` (a [`TRANSPORT_ENV`] value; `None` or empty
/// means `auto`).
///
/// - `tcp`: [`tcp::TcpTransport`].
/// - `ucx`: the UCX transport; an error if this build lacks it, UCX's
///   library is missing here, or UCX cannot initialise (`UCX_TLS` and other
///   `UCX_*` variables pass through).
/// - `auto`: UCX when compiled in, usable here, served by the agent *and*
///   this host has an RDMA device ([`rdma_device_present`]); else TCP (per
///   connection), silently. Without RDMA hardware UCX would run over TCP or
///   shared memory, where our own TCP backend is faster (docs/channel.md) and
///   UCX (1.13, and 1.22.0 still) can abort a home whose peer dies
///   mid-transfer over tcp: choose `ucx` explicitly to use it there.
///
/// # Errors
/// An invalid value (the error names the variable, the value and the
/// choices), or `ucx` where UCX is unavailable.
pub fn select(value: Option<&str>) -> io::Result<Arc<dyn Transport>> {
    match value.map(str::trim).unwrap_or("") {
        "" | "auto" => Ok(Arc::new(Auto::new())),
        "tcp" => Ok(Arc::new(tcp::TcpTransport)),
        "ucx" => ucx_selected(),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{TRANSPORT_ENV}={other:?} is not a transport; choose one of {TRANSPORT_CHOICES}"
            ),
        )),
    }
}

/// [`select`] applied to the environment, after checking
/// [`crate::tls::TLS_ENV`]: with TLS asked for, `auto` always picks TCP (with
/// TLS), and `ucx` is an error naming both variables.
///
/// # Errors
/// As [`select`] and [`crate::tls::parse`], or `ucx` with TLS.
pub fn from_env() -> io::Result<Arc<dyn Transport>> {
    let value = std::env::var(TRANSPORT_ENV).ok();
    select_with_tls(value.as_deref(), crate::tls::requested()?)
}

/// [`select`] for a client that asks for TLS (`tls`) or not.
///
/// # Errors
/// As [`select`], or `ucx` with `tls` (the error names both variables).
pub fn select_with_tls(value: Option<&str>, tls: bool) -> io::Result<Arc<dyn Transport>> {
    if tls && value.map(str::trim) == Some("ucx") {
        return Err(ucx_with_tls());
    }
    select(value)
}

/// The error of a client asking for both UCX and TLS.
pub(crate) fn ucx_with_tls() -> io::Error {
    use crate::tls::TLS_ENV;
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{TRANSPORT_ENV}=ucx and {TLS_ENV}=1 cannot be combined: UCX moves payloads \
             outside the TLS stream, so they would travel unencrypted; unset {TLS_ENV} to use \
             UCX, or set {TRANSPORT_ENV}=tcp (or auto) to keep TLS"
        ),
    )
}

#[cfg(rlinf_ucx)]
fn ucx_selected() -> io::Result<Arc<dyn Transport>> {
    let t = ucx::UcxTransport::new();
    t.worker().map_err(|e| {
        // A missing library's error already names the fix and `ucx_info -d`.
        let hint = if e.kind() == io::ErrorKind::NotFound {
            ""
        } else {
            " (check `ucx_info -d`)"
        };
        io::Error::new(
            e.kind(),
            format!("{TRANSPORT_ENV}=ucx, but UCX cannot start here: {e}{hint}"),
        )
    })?;
    Ok(Arc::new(t))
}

#[cfg(not(rlinf_ucx))]
fn ucx_selected() -> io::Result<Arc<dyn Transport>> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{TRANSPORT_ENV}=ucx, but {NO_UCX_BUILD}"),
    ))
}

/// Where the kernel lists RDMA devices (InfiniBand, RoCE and iWARP adapters,
/// soft-RoCE included).
const RDMA_SYSFS: &str = "/sys/class/infiniband";

/// Whether this host has an RDMA device: an entry under `/sys/class/infiniband`.
/// `auto` uses UCX only then (see [`select`]).
pub fn rdma_device_present() -> bool {
    std::fs::read_dir(RDMA_SYSFS).is_ok_and(|mut d| d.next().is_some())
}

/// `auto`: UCX where this host has RDMA hardware and UCX works for a
/// connection, else TCP.
struct Auto {
    #[cfg(rlinf_ucx)]
    ucx: Option<ucx::UcxTransport>,
}

impl Auto {
    fn new() -> Self {
        Self {
            #[cfg(rlinf_ucx)]
            ucx: rdma_device_present().then(ucx::UcxTransport::new),
        }
    }
}

impl Transport for Auto {
    fn name(&self) -> &'static str {
        #[cfg(rlinf_ucx)]
        if self.ucx.is_some() {
            return "auto (ucx or tcp)";
        }
        "tcp"
    }

    fn connect(&self, address: &str, timeout: Duration) -> io::Result<Box<dyn Endpoint>> {
        // With TLS, payloads must stay inside the TLS stream: TCP only.
        #[cfg(rlinf_ucx)]
        if let Some(ucx) = self.ucx.as_ref().filter(|u| u.worker().is_ok()) {
            if !crate::tls::requested()? {
                match ucx.connect(address, timeout) {
                    Ok(ep) => return Ok(ep),
                    // The agent itself is unreachable: TCP would fail the same way.
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionRefused
                                | io::ErrorKind::NotFound
                                | io::ErrorKind::AddrNotAvailable
                        ) =>
                    {
                        return Err(e);
                    }
                    Err(_) => {} // no UCX path to this agent: fall back to TCP
                }
            }
        }
        tcp::TcpTransport.connect(address, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ucx_with_tls_names_both_variables() {
        let err = select_with_tls(Some(" ucx "), true).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let msg = err.to_string();
        for part in [
            "RLINF_CHANNEL_TRANSPORT=ucx",
            "RLINF_CHANNEL_TLS=1",
            "outside the TLS stream",
        ] {
            assert!(msg.contains(part), "{msg}");
        }
        assert_eq!(select_with_tls(Some("tcp"), true).unwrap().name(), "tcp");
        assert!(select_with_tls(None, true).is_ok());
    }

    #[test]
    fn select_names_the_variable_value_and_choices() {
        let err = select(Some("rdma")).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let msg = err.to_string();
        for part in [TRANSPORT_ENV, "\"rdma\"", TRANSPORT_CHOICES] {
            assert!(msg.contains(part), "{msg}");
        }
        assert_eq!(select(Some("tcp")).unwrap().name(), "tcp");
        assert!(select(None).is_ok() && select(Some(" auto ")).is_ok());
        match select(Some("ucx")) {
            Ok(t) => assert!(UCX_COMPILED && t.name() == "ucx" && ucx_unavailable().is_none()),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains(TRANSPORT_ENV), "{msg}");
                if UCX_COMPILED {
                    // Built with UCX, but it cannot start here.
                    assert!(msg.contains("UCX cannot start here"), "{msg}");
                } else {
                    assert!(msg.contains("no UCX support"), "{msg}");
                    assert!(ucx_unavailable().is_some_and(|w| w.contains("libucx-dev")));
                }
            }
        }
    }
}
