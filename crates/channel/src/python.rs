//! PyO3 bindings: the `rlinf.core._native` extension module.
//!
//! Only thin wrappers live here; all logic is in the plain-Rust modules so
//! that `cargo test` covers it without a Python interpreter. Every call that
//! may wait or copy payload bytes releases the GIL.

// Python-facing signatures mirror keyword arguments, so they are long by design.
#![allow(clippy::too_many_arguments)]

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{
    PyAttributeError, PyBufferError, PyException, PyOSError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pyo3::{create_exception, ffi};

use crate::agent::{Agent, AgentOptions};
use crate::channel::{Channel, ChannelError, ChannelOptions, Lease, parse_message};
use crate::remote::RemoteChannel;

create_exception!(
    _native,
    ChannelError_,
    PyException,
    "Base class of channel errors."
);
create_exception!(
    _native,
    ChannelClosed,
    ChannelError_,
    "The channel was closed."
);
create_exception!(
    _native,
    ChannelFull,
    ChannelError_,
    "Non-blocking put on a full channel."
);
create_exception!(
    _native,
    ChannelEmpty,
    ChannelError_,
    "Non-blocking get on an empty channel."
);
create_exception!(
    _native,
    ChannelExists,
    ChannelError_,
    "A channel with this name exists already."
);
create_exception!(
    _native,
    ChannelNotFound,
    ChannelError_,
    "No channel with this name exists."
);
create_exception!(
    _native,
    ChannelCorrupt,
    ChannelError_,
    "The channel's shared memory failed validation."
);

create_exception!(
    _native,
    ChannelAuthError,
    ChannelError_,
    "A channel agent connection failed authentication (the run's channel secret differs)."
);

/// Messages whose header is at most this long and that have no out-of-band
/// buffers are copied out and their block freed at once.
const COPY_OUT_MAX: usize = 64 << 10;

fn to_py(e: ChannelError) -> PyErr {
    let msg = e.to_string();
    match e {
        ChannelError::Closed => ChannelClosed::new_err(msg),
        ChannelError::Full => ChannelFull::new_err(msg),
        ChannelError::Empty => ChannelEmpty::new_err(msg),
        ChannelError::Timeout => PyTimeoutError::new_err(msg),
        ChannelError::Exists(_) => ChannelExists::new_err(msg),
        ChannelError::NotFound(_) => ChannelNotFound::new_err(msg),
        ChannelError::Name(_) | ChannelError::Invalid(_) => PyValueError::new_err(msg),
        ChannelError::Corrupt(_) => ChannelCorrupt::new_err(msg),
        ChannelError::Io(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            ChannelAuthError::new_err(msg)
        }
        ChannelError::Io(_) => PyOSError::new_err(msg),
    }
}

fn to_duration(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(PyValueError::new_err(format!(
            "timeout must be None or a finite number of seconds >= 0, got {t}"
        ))),
    }
}

/// What a view's bytes live in: a leased shared-memory block, or a buffer
/// received from another node.
enum Backing {
    Lease(Lease),
    Owned(Box<[u8]>),
}

impl Backing {
    fn as_ptr(&self) -> *mut u8 {
        match self {
            Backing::Lease(l) => l.as_ptr(),
            // Owned bytes are only ever reached through views, which may
            // write to them (numpy arrays are writable): hand out a mut pointer.
            Backing::Owned(b) => b.as_ptr().cast_mut(),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Lease(l) => l.bytes(),
            Backing::Owned(b) => b,
        }
    }
}

/// A writable, zero-copy view of bytes in a channel block.
///
/// Supports the buffer protocol; numpy arrays and torch tensors built on it
/// keep it (and so the block) alive. The block returns to the channel when
/// the last view of its message is garbage collected.
#[pyclass(frozen, module = "rlinf.core._native")]
struct ShmView {
    lease: Arc<Backing>,
    offset: usize,
    len: usize,
}

#[pymethods]
impl ShmView {
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("view is null"));
        }
        let me = slf.get();
        // SAFETY: offset+len was validated against the message (and the
        // message against its block) when the view was made; the pointer stays
        // valid while `slf` (stored in view.obj) keeps the lease alive. `view`
        // is a valid Py_buffer to fill, per the buffer protocol.
        unsafe {
            (*view).buf = me.lease.as_ptr().add(me.offset).cast::<c_void>();
            (*view).len = me.len as isize;
            (*view).readonly = 0;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                c"B".as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                &mut (*view).len
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.len
    }

    fn __repr__(&self) -> String {
        format!("<ShmView {} bytes>", self.len)
    }
}

/// Builds `(header, [buffer views])` for one taken message.
fn message_to_py(py: Python<'_>, backing: Backing) -> PyResult<Py<PyTuple>> {
    let layout = parse_message(backing.bytes()).map_err(to_py)?;
    let (hoff, hlen) = layout.header;
    if layout.buffers.is_empty() && hlen <= COPY_OUT_MAX {
        let header = PyBytes::new(py, &backing.bytes()[hoff..hoff + hlen]);
        drop(backing); // frees the block now
        return Ok(PyTuple::new(py, [header.into_any(), PyList::empty(py).into_any()])?.unbind());
    }
    let backing = Arc::new(backing);
    let header = Py::new(
        py,
        ShmView {
            lease: Arc::clone(&backing),
            offset: hoff,
            len: hlen,
        },
    )?;
    let views = layout
        .buffers
        .iter()
        .map(|&(offset, len)| {
            Py::new(
                py,
                ShmView {
                    lease: Arc::clone(&backing),
                    offset,
                    len,
                },
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(PyTuple::new(
        py,
        [
            header.into_any(),
            PyList::new(py, views)?.into_any().unbind(),
        ],
    )?
    .unbind())
}

/// Borrows the bytes of `header` and `buffers` (C-contiguous buffer objects).
struct Borrowed {
    header: PyUntypedBuffer,
    buffers: Vec<PyUntypedBuffer>,
}

impl Borrowed {
    fn new(header: &Bound<'_, PyAny>, buffers: &[Bound<'_, PyAny>]) -> PyResult<Self> {
        let header = PyUntypedBuffer::get(header)?;
        let buffers = buffers
            .iter()
            .map(PyUntypedBuffer::get)
            .collect::<PyResult<Vec<_>>>()?;
        for (i, b) in std::iter::once(&header).chain(buffers.iter()).enumerate() {
            if !b.is_c_contiguous() {
                return Err(PyValueError::new_err(format!(
                    "buffer {i} is not C-contiguous"
                )));
            }
        }
        Ok(Self { header, buffers })
    }

    fn slices(&self) -> (&[u8], Vec<&[u8]>) {
        // SAFETY: each PyUntypedBuffer pins its exporter's memory while `self`
        // lives, and the regions are C-contiguous bytes.
        let as_slice = |b: &PyUntypedBuffer| unsafe {
            std::slice::from_raw_parts(b.buf_ptr() as *const u8, b.len_bytes())
        };
        (
            as_slice(&self.header),
            self.buffers.iter().map(as_slice).collect(),
        )
    }
}

/// The channel a [`ChannelCore`] drives: a local segment or one on another node.
enum Core {
    /// A shared-memory segment of this node.
    Local(Channel),
    /// A channel of another node, reached through its agent over TCP.
    Remote(RemoteChannel),
}

impl Core {
    fn put_msg(
        &self,
        lane: u32,
        header: &[u8],
        buffers: &[&[u8]],
        weight: i64,
        timeout: Option<Duration>,
        nonblocking: bool,
    ) -> crate::channel::Result<()> {
        match self {
            Core::Local(ch) => ch.put(lane, header, buffers, weight, timeout, nonblocking),
            Core::Remote(ch) => ch.put(lane, header, buffers, weight, timeout, nonblocking),
        }
    }

    /// One message (`target == 0`) or a weighted batch.
    fn take_msgs(
        &self,
        lane: u32,
        target: i64,
        timeout: Option<Duration>,
        nonblocking: bool,
    ) -> crate::channel::Result<Vec<Backing>> {
        match self {
            Core::Local(ch) => {
                let leases = if target == 0 {
                    vec![ch.get(lane, timeout, nonblocking)?]
                } else {
                    ch.get_batch(lane, target, timeout)?
                };
                Ok(leases.into_iter().map(Backing::Lease).collect())
            }
            Core::Remote(ch) => Ok(ch
                .take(lane, target, timeout, nonblocking)?
                .into_iter()
                .map(|i| Backing::Owned(i.into_boxed_slice()))
                .collect()),
        }
    }

    /// The backend, for error messages.
    fn describe(&self) -> String {
        match self {
            Core::Local(ch) => format!("a local shared-memory channel ({})", ch.segment_name()),
            Core::Remote(ch) => format!(
                "a remote channel reached through the agent at {} over {}",
                ch.address(),
                ch.transport()
            ),
        }
    }
}

/// Native handle on one channel: a shared-memory segment of this node
/// (`create`, `attach`) or a channel of another node reached through its
/// agent over TCP (`connect_remote`). Both offer the same methods, except
/// `segment_name` (local only).
#[pyclass(frozen, module = "rlinf.core._native")]
struct ChannelCore {
    core: Core,
}

#[pymethods]
impl ChannelCore {
    /// Creates the segment `rlinf.<namespace>.<name>`. With `owned`, this
    /// process keeps its name until it ends or calls `release_owned_names`
    /// (`Channel::create_owned`); without, its last holder removes it.
    #[staticmethod]
    #[pyo3(signature = (namespace, name, max_lanes, lane_capacity, max_blocks, arena_bytes, user_tag=0, owned=false))]
    fn create(
        py: Python<'_>,
        namespace: &str,
        name: &str,
        max_lanes: u32,
        lane_capacity: u32,
        max_blocks: u32,
        arena_bytes: u64,
        user_tag: u32,
        owned: bool,
    ) -> PyResult<Self> {
        let opts = ChannelOptions {
            max_lanes,
            lane_capacity,
            max_blocks,
            arena_bytes,
            user_tag,
        };
        let ch = py
            .detach(|| {
                if owned {
                    Channel::create_owned(namespace, name, opts)
                } else {
                    Channel::create(namespace, name, opts)
                }
            })
            .map_err(to_py)?;
        Ok(Self {
            core: Core::Local(ch),
        })
    }

    /// Attaches to an existing segment of this node.
    #[staticmethod]
    fn attach(py: Python<'_>, namespace: &str, name: &str) -> PyResult<Self> {
        let ch = py
            .detach(|| Channel::attach(namespace, name))
            .map_err(to_py)?;
        Ok(Self {
            core: Core::Local(ch),
        })
    }

    /// Connects to channel `name` served by the agent at `address` (another
    /// node); with `create`, creates it there (the sizes are then used).
    #[staticmethod]
    #[pyo3(signature = (address, namespace, name, create=false, max_lanes=64, lane_capacity=4096, max_blocks=4096, arena_bytes=1<<30, user_tag=0))]
    fn connect_remote(
        py: Python<'_>,
        address: &str,
        namespace: &str,
        name: &str,
        create: bool,
        max_lanes: u32,
        lane_capacity: u32,
        max_blocks: u32,
        arena_bytes: u64,
        user_tag: u32,
    ) -> PyResult<Self> {
        let opts = create.then_some(ChannelOptions {
            max_lanes,
            lane_capacity,
            max_blocks,
            arena_bytes,
            user_tag,
        });
        let transport = crate::transport::from_env().map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidInput => PyValueError::new_err(e.to_string()),
            _ => PyOSError::new_err(e.to_string()),
        })?;
        let ch = py
            .detach(|| RemoteChannel::connect(transport, address, namespace, name, opts))
            .map_err(to_py)?;
        Ok(Self {
            core: Core::Remote(ch),
        })
    }

    /// The transport moving payloads: `"shm"` for a local channel, else what
    /// `RLINF_CHANNEL_TRANSPORT` selected (`"tcp"`, `"ucx"`), `"tcp+tls"` with
    /// `RLINF_CHANNEL_TLS=1`.
    #[getter]
    fn transport(&self) -> &'static str {
        match &self.core {
            Core::Local(_) => "shm",
            Core::Remote(ch) => ch.transport(),
        }
    }

    /// Whether the channel is reached through another node's agent.
    #[getter]
    fn remote(&self) -> bool {
        matches!(self.core, Core::Remote(_))
    }

    /// The lane index for an encoded key (created on first use).
    fn lane(&self, py: Python<'_>, key: &[u8]) -> PyResult<u32> {
        match &self.core {
            Core::Local(ch) => ch.lane(key),
            Core::Remote(ch) => py.detach(|| ch.lane(key)),
        }
        .map_err(to_py)
    }

    /// Puts `header` plus out-of-band `buffers` (C-contiguous buffer objects).
    #[pyo3(signature = (lane, header, buffers, weight=0, timeout=None, nonblocking=false))]
    fn put(
        &self,
        py: Python<'_>,
        lane: u32,
        header: &Bound<'_, PyAny>,
        buffers: Vec<Bound<'_, PyAny>>,
        weight: i64,
        timeout: Option<f64>,
        nonblocking: bool,
    ) -> PyResult<()> {
        let timeout = to_duration(timeout)?;
        let borrowed = Borrowed::new(header, &buffers)?;
        let (header_bytes, slices) = borrowed.slices();
        let core = &self.core;
        py.detach(|| core.put_msg(lane, header_bytes, &slices, weight, timeout, nonblocking))
            .map_err(to_py)
    }

    /// Takes one message: `(header, [views])`; header is bytes for small
    /// messages without buffers, else a view.
    #[pyo3(signature = (lane, timeout=None, nonblocking=false))]
    fn get(
        &self,
        py: Python<'_>,
        lane: u32,
        timeout: Option<f64>,
        nonblocking: bool,
    ) -> PyResult<Py<PyTuple>> {
        let timeout = to_duration(timeout)?;
        let core = &self.core;
        let mut items = py
            .detach(|| core.take_msgs(lane, 0, timeout, nonblocking))
            .map_err(to_py)?;
        let item = items
            .pop()
            .ok_or_else(|| ChannelEmpty::new_err("no item was returned"))?;
        message_to_py(py, item)
    }

    /// Takes messages whose weights sum to `target` (see `Channel.get_batch`).
    #[pyo3(signature = (lane, target, timeout=None))]
    fn get_batch(
        &self,
        py: Python<'_>,
        lane: u32,
        target: i64,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyList>> {
        if target <= 0 {
            return Err(PyValueError::new_err(format!(
                "target_weight must be positive, got {target}"
            )));
        }
        let timeout = to_duration(timeout)?;
        let core = &self.core;
        let items = py
            .detach(|| core.take_msgs(lane, target, timeout, false))
            .map_err(to_py)?;
        let items = items
            .into_iter()
            .map(|b| message_to_py(py, b))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PyList::new(py, items)?.unbind())
    }

    /// Waits until the lane has a published item; False on timeout.
    fn wait_readable(&self, py: Python<'_>, lane: u32, timeout: f64) -> PyResult<bool> {
        let timeout = to_duration(Some(timeout))?.unwrap_or_default();
        py.detach(|| match &self.core {
            Core::Local(ch) => ch.wait_readable(lane, timeout),
            Core::Remote(ch) => ch.wait_readable(lane, timeout),
        })
        .map_err(to_py)
    }

    /// Items in the lane.
    fn qsize(&self, py: Python<'_>, lane: u32) -> PyResult<u64> {
        match &self.core {
            Core::Local(ch) => ch.qsize(lane),
            Core::Remote(ch) => py.detach(|| ch.qsize(lane)),
        }
        .map_err(to_py)
    }

    /// Closes the channel for every process; wakes all waiters. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        match &self.core {
            Core::Local(ch) => {
                ch.close();
                Ok(())
            }
            Core::Remote(ch) => py.detach(|| ch.close()).map_err(to_py),
        }
    }

    /// Whether the channel was closed.
    #[getter]
    fn closed(&self, py: Python<'_>) -> PyResult<bool> {
        match &self.core {
            Core::Local(ch) => Ok(ch.is_closed()),
            Core::Remote(ch) => py.detach(|| ch.is_closed()).map_err(to_py),
        }
    }

    /// Frees blocks held by dead processes; returns how many.
    fn reclaim(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| match &self.core {
            Core::Local(ch) => ch.reclaim(),
            Core::Remote(ch) => ch.reclaim(),
        })
        .map_err(to_py)
    }

    /// Arena and lane counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = match &self.core {
            Core::Local(ch) => ch.stats(),
            Core::Remote(ch) => py.detach(|| ch.stats()),
        }
        .map_err(to_py)?;
        stats_dict(py, &s)
    }

    /// The shared-memory segment's name (local channels only: a remote
    /// channel's segment is on its home node; AttributeError there).
    #[getter]
    fn segment_name(&self) -> PyResult<&str> {
        match &self.core {
            Core::Local(ch) => Ok(ch.segment_name()),
            Core::Remote(_) => Err(PyAttributeError::new_err(format!(
                "ChannelCore.segment_name is only available on a local shared-memory channel; \
                 this is {}",
                self.core.describe()
            ))),
        }
    }

    /// The creator's tag (the Python layer's `maxsize`).
    #[getter]
    fn user_tag(&self) -> u32 {
        match &self.core {
            Core::Local(ch) => ch.user_tag(),
            Core::Remote(ch) => ch.user_tag(),
        }
    }

    /// Items per lane.
    #[getter]
    fn lane_capacity(&self) -> u32 {
        match &self.core {
            Core::Local(ch) => ch.lane_capacity(),
            Core::Remote(ch) => ch.lane_capacity(),
        }
    }

    /// Arena size (on the home node for a remote channel).
    #[getter]
    fn arena_size(&self) -> u64 {
        match &self.core {
            Core::Local(ch) => ch.arena_size(),
            Core::Remote(ch) => ch.arena_size(),
        }
    }

    fn __repr__(&self) -> String {
        format!("<ChannelCore: {}>", self.core.describe())
    }
}

/// The per-node channel agent: serves this node's channels to other nodes
/// over TCP. Runs on background threads of this process until `stop()`.
#[pyclass(module = "rlinf.core._native")]
struct ChannelAgent {
    agent: Option<Agent>,
    address: String,
}

const _: () = assert!(
    crate::agent::DEFAULT_MAX_CONNECTIONS == 1024,
    "ChannelAgent's max_connections default must equal agent::DEFAULT_MAX_CONNECTIONS"
);

#[pymethods]
impl ChannelAgent {
    /// Starts listening on `bind` (`"127.0.0.1:0"` picks a free port; give the
    /// node's cluster address, `"10.0.0.5:0"`, to serve other hosts). Peers must
    /// hold this process's channel secret (`set_channel_secret`, else
    /// `RLINF_CHANNEL_SECRET`); at most `max_connections` are served at once, and
    /// one that has not authenticated after `handshake_timeout` seconds is closed.
    /// Plain and TLS clients (`RLINF_CHANNEL_TLS=1`) are served on the same port.
    #[new]
    // A literal default, so that Python's signature shows it (pyo3 renders a
    // path as `...`); the assertion below keeps it equal to the agent's.
    #[pyo3(signature = (bind="127.0.0.1:0", *, max_connections=1024, handshake_timeout=5.0))]
    fn new(
        py: Python<'_>,
        bind: &str,
        max_connections: usize,
        handshake_timeout: f64,
    ) -> PyResult<Self> {
        if max_connections == 0 {
            return Err(PyValueError::new_err(
                "max_connections must be at least 1 (got 0)",
            ));
        }
        let handshake_timeout = match to_duration(Some(handshake_timeout))? {
            Some(t) if !t.is_zero() => t,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "handshake_timeout must be a positive number of seconds (got {handshake_timeout})"
                )));
            }
        };
        if crate::agent::ucx_home_helper().is_none() {
            // UCX connections get a helper process each: this interpreter
            // running `rlinf.core.ucx_home` (no configuration needed). An
            // embedded interpreter without `sys.executable` gets none (a UCX
            // hello then fails with a clear error; TCP works).
            let exe: Option<String> = py.import("sys")?.getattr("executable")?.extract().ok();
            if let Some(exe) = exe.filter(|e| !e.is_empty()) {
                crate::agent::set_ucx_home_helper(vec![
                    exe.into(),
                    "-m".into(),
                    "rlinf.core.ucx_home".into(),
                ]);
            }
        }
        let options = AgentOptions {
            secret: None,
            max_connections,
            handshake_timeout,
        };
        let agent = py
            .detach(|| Agent::start_with(bind, options))
            .map_err(|e| {
                PyOSError::new_err(format!("cannot start the channel agent on {bind}: {e}"))
            })?;
        let address = agent.address().to_owned();
        Ok(Self {
            agent: Some(agent),
            address,
        })
    }

    /// The `host:port` to give to remote `Channel.connect(..., address=...)`.
    #[getter]
    fn address(&self) -> &str {
        &self.address
    }

    /// Stops accepting connections (idempotent).
    fn stop(&mut self, py: Python<'_>) {
        if let Some(mut a) = self.agent.take() {
            py.detach(|| a.stop());
        }
    }
}

fn stats_dict<'py>(py: Python<'py>, s: &crate::channel::Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("blocks", s.blocks)?;
    d.set_item("free_blocks", s.free_blocks)?;
    d.set_item("leased_blocks", s.leased_blocks)?;
    d.set_item("queued_blocks", s.queued_blocks)?;
    d.set_item("writing_blocks", s.writing_blocks)?;
    d.set_item("lanes", s.lanes)?;
    d.set_item("arena_used", s.arena_used)?;
    d.set_item("arena_size", s.arena_size)?;
    Ok(d)
}

/// Version of the native extension (the `rlinf-channel` crate).
#[pyfunction]
fn version() -> &'static str {
    crate::VERSION
}

/// Shared-memory segment name for `channel` in run `namespace`.
///
/// Raises ValueError naming the bad part, character and fix.
#[pyfunction]
fn segment_name(namespace: &str, channel: &str) -> PyResult<String> {
    crate::naming::segment_name(namespace, channel)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Splits a segment name into `(namespace, channel)`, or returns None for
/// names RLinf did not build.
#[pyfunction]
fn parse_segment_name(name: &str) -> Option<(String, String)> {
    crate::naming::parse_segment_name(name).map(|(n, c)| (n.to_owned(), c.to_owned()))
}

/// Removes segments (of `namespace`, or all) that no live process holds and
/// no live creator keeps.
#[pyfunction]
#[pyo3(signature = (namespace=None))]
fn cleanup_stale_segments(namespace: Option<&str>) -> PyResult<Vec<String>> {
    crate::channel::cleanup_stale_segments(namespace).map_err(to_py)
}

/// Gives up the names this process created (owned) and unlinks the names of
/// this process's channels that no other process holds (registered with
/// `atexit` by `rlinf.core.channel`). Returns the number of names removed.
#[pyfunction]
fn release_all_names(py: Python<'_>) -> usize {
    py.detach(crate::channel::release_all_names)
}

/// Gives up the names of the channels this process created owned (of
/// `namespace`, or all): each goes now if nobody holds it, else with its last
/// holder. Returns the number of names removed now.
#[pyfunction]
#[pyo3(signature = (namespace=None))]
fn release_owned_names(py: Python<'_>, namespace: Option<&str>) -> usize {
    py.detach(|| crate::channel::release_owned_names(namespace))
}

/// Counters of how this process's channel waits went (spins, sleeps, skips).
#[pyfunction]
fn wait_stats() -> std::collections::HashMap<&'static str, u64> {
    crate::spin::stats().into_iter().collect()
}

/// Why the UCX transport cannot be used in this process (the build lacks it,
/// or UCX's runtime library `libucp.so.0` does not load), or `None` when it
/// can. Loads the library on first call.
#[pyfunction]
fn ucx_unavailable_reason(py: Python<'_>) -> Option<String> {
    py.detach(crate::transport::ucx_unavailable)
}

/// Runs the UCX home helper of one channel-agent connection on this
/// process's stdin/stdout until stdin ends; returns the exit code. Started
/// by the agent as `python -m rlinf.core.ucx_home`, not called by users.
#[pyfunction]
fn ucx_home_main(py: Python<'_>) -> i32 {
    #[cfg(rlinf_ucx)]
    return py.detach(crate::transport::ucx_home::serve_stdio);
    #[cfg(not(rlinf_ucx))]
    {
        let _ = py;
        eprintln!("rlinf.core.ucx_home: this build has no UCX support");
        1
    }
}

/// Sets the secret this process's channel agents and remote connections use
/// (wins over `RLINF_CHANNEL_SECRET`); at least 16 bytes.
#[pyfunction]
fn set_channel_secret(secret: &str) -> PyResult<()> {
    let secret = crate::auth::Secret::new(secret.as_bytes().to_vec())
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    crate::auth::set_process_secret(secret);
    Ok(())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(segment_name, m)?)?;
    m.add_function(wrap_pyfunction!(parse_segment_name, m)?)?;
    m.add_function(wrap_pyfunction!(cleanup_stale_segments, m)?)?;
    m.add_function(wrap_pyfunction!(release_all_names, m)?)?;
    m.add_function(wrap_pyfunction!(release_owned_names, m)?)?;
    m.add_function(wrap_pyfunction!(wait_stats, m)?)?;
    m.add_function(wrap_pyfunction!(ucx_unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(ucx_home_main, m)?)?;
    m.add_function(wrap_pyfunction!(set_channel_secret, m)?)?;
    m.add("CHANNEL_SECRET_ENV", crate::auth::SECRET_ENV)?;
    m.add("SEGMENT_PREFIX", crate::naming::SEGMENT_PREFIX)?;
    m.add("UCX_COMPILED", crate::transport::UCX_COMPILED)?;
    m.add("TLS_COMPILED", crate::tls::TLS_COMPILED)?;
    m.add_class::<ChannelCore>()?;
    m.add_class::<ShmView>()?;
    m.add_class::<ChannelAgent>()?;
    m.add("ChannelError", py.get_type::<ChannelError_>())?;
    m.add("ChannelClosed", py.get_type::<ChannelClosed>())?;
    m.add("ChannelFull", py.get_type::<ChannelFull>())?;
    m.add("ChannelEmpty", py.get_type::<ChannelEmpty>())?;
    m.add("ChannelExists", py.get_type::<ChannelExists>())?;
    m.add("ChannelNotFound", py.get_type::<ChannelNotFound>())?;
    m.add("ChannelCorrupt", py.get_type::<ChannelCorrupt>())?;
    m.add("ChannelAuthError", py.get_type::<ChannelAuthError>())?;
    Ok(())
}
