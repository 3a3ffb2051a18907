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
use pyo3::exceptions::{PyBufferError, PyException, PyOSError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pyo3::{create_exception, ffi};

use crate::channel::{Channel, ChannelError, ChannelOptions, Lease, parse_message};

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

/// A writable, zero-copy view of bytes in a channel block.
///
/// Supports the buffer protocol; numpy arrays and torch tensors built on it
/// keep it (and so the block) alive. The block returns to the channel when
/// the last view of its message is garbage collected.
#[pyclass(frozen, module = "rlinf.core._native")]
struct ShmView {
    lease: Arc<Lease>,
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
fn message_to_py(py: Python<'_>, lease: Lease) -> PyResult<Py<PyTuple>> {
    let layout = parse_message(lease.bytes()).map_err(to_py)?;
    let (hoff, hlen) = layout.header;
    if layout.buffers.is_empty() && hlen <= COPY_OUT_MAX {
        let header = PyBytes::new(py, &lease.bytes()[hoff..hoff + hlen]);
        drop(lease); // frees the block now
        return Ok(PyTuple::new(py, [header.into_any(), PyList::empty(py).into_any()])?.unbind());
    }
    let lease = Arc::new(lease);
    let header = Py::new(
        py,
        ShmView {
            lease: Arc::clone(&lease),
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
                    lease: Arc::clone(&lease),
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

/// Native handle on one shared-memory channel segment.
#[pyclass(frozen, module = "rlinf.core._native")]
struct ChannelCore {
    ch: Channel,
}

#[pymethods]
impl ChannelCore {
    /// Creates the segment `rlinf.<namespace>.<name>`.
    #[staticmethod]
    #[pyo3(signature = (namespace, name, max_lanes, lane_capacity, max_blocks, arena_bytes, user_tag=0))]
    fn create(
        py: Python<'_>,
        namespace: &str,
        name: &str,
        max_lanes: u32,
        lane_capacity: u32,
        max_blocks: u32,
        arena_bytes: u64,
        user_tag: u32,
    ) -> PyResult<Self> {
        let opts = ChannelOptions {
            max_lanes,
            lane_capacity,
            max_blocks,
            arena_bytes,
            user_tag,
        };
        let ch = py
            .detach(|| Channel::create(namespace, name, opts))
            .map_err(to_py)?;
        Ok(Self { ch })
    }

    /// Attaches to an existing segment.
    #[staticmethod]
    fn attach(py: Python<'_>, namespace: &str, name: &str) -> PyResult<Self> {
        let ch = py
            .detach(|| Channel::attach(namespace, name))
            .map_err(to_py)?;
        Ok(Self { ch })
    }

    /// The lane index for an encoded key (created on first use).
    fn lane(&self, key: &[u8]) -> PyResult<u32> {
        self.ch.lane(key).map_err(to_py)
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
        let header = PyUntypedBuffer::get(header)?;
        let bufs = buffers
            .iter()
            .map(PyUntypedBuffer::get)
            .collect::<PyResult<Vec<_>>>()?;
        for (i, b) in std::iter::once(&header).chain(bufs.iter()).enumerate() {
            if !b.is_c_contiguous() {
                return Err(PyValueError::new_err(format!(
                    "buffer {i} is not C-contiguous"
                )));
            }
        }
        // SAFETY: each PyUntypedBuffer pins its exporter's memory until it is
        // dropped (after this call), and the regions are C-contiguous bytes.
        let as_slice = |b: &PyUntypedBuffer| unsafe {
            std::slice::from_raw_parts(b.buf_ptr() as *const u8, b.len_bytes())
        };
        let header_bytes = as_slice(&header);
        let slices: Vec<&[u8]> = bufs.iter().map(as_slice).collect();
        let ch = &self.ch;
        py.detach(|| ch.put(lane, header_bytes, &slices, weight, timeout, nonblocking))
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
        let ch = &self.ch;
        let lease = py
            .detach(|| ch.get(lane, timeout, nonblocking))
            .map_err(to_py)?;
        message_to_py(py, lease)
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
        let timeout = to_duration(timeout)?;
        let ch = &self.ch;
        let leases = py
            .detach(|| ch.get_batch(lane, target, timeout))
            .map_err(to_py)?;
        let items = leases
            .into_iter()
            .map(|l| message_to_py(py, l))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PyList::new(py, items)?.unbind())
    }

    /// Waits until the lane has a published item; False on timeout.
    fn wait_readable(&self, py: Python<'_>, lane: u32, timeout: f64) -> PyResult<bool> {
        let timeout = to_duration(Some(timeout))?.unwrap_or_default();
        let ch = &self.ch;
        py.detach(|| ch.wait_readable(lane, timeout)).map_err(to_py)
    }

    /// Items in the lane.
    fn qsize(&self, lane: u32) -> PyResult<u64> {
        self.ch.qsize(lane).map_err(to_py)
    }

    /// Closes the channel for every process; wakes all waiters. Idempotent.
    fn close(&self) {
        self.ch.close();
    }

    /// Whether the channel was closed.
    #[getter]
    fn closed(&self) -> bool {
        self.ch.is_closed()
    }

    /// Frees blocks held by dead processes; returns how many.
    fn reclaim(&self, py: Python<'_>) -> PyResult<usize> {
        let ch = &self.ch;
        py.detach(|| ch.reclaim()).map_err(to_py)
    }

    /// Arena and lane counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.ch.stats().map_err(to_py)?;
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

    #[getter]
    fn segment_name(&self) -> &str {
        self.ch.segment_name()
    }

    #[getter]
    fn user_tag(&self) -> u32 {
        self.ch.user_tag()
    }

    #[getter]
    fn lane_capacity(&self) -> u32 {
        self.ch.lane_capacity()
    }

    #[getter]
    fn arena_size(&self) -> u64 {
        self.ch.arena_size()
    }
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

/// Removes segments (of `namespace`, or all) that no live process holds.
#[pyfunction]
#[pyo3(signature = (namespace=None))]
fn cleanup_stale_segments(namespace: Option<&str>) -> PyResult<Vec<String>> {
    crate::channel::cleanup_stale_segments(namespace).map_err(to_py)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(segment_name, m)?)?;
    m.add_function(wrap_pyfunction!(parse_segment_name, m)?)?;
    m.add_function(wrap_pyfunction!(cleanup_stale_segments, m)?)?;
    m.add("SEGMENT_PREFIX", crate::naming::SEGMENT_PREFIX)?;
    m.add_class::<ChannelCore>()?;
    m.add_class::<ShmView>()?;
    m.add("ChannelError", py.get_type::<ChannelError_>())?;
    m.add("ChannelClosed", py.get_type::<ChannelClosed>())?;
    m.add("ChannelFull", py.get_type::<ChannelFull>())?;
    m.add("ChannelEmpty", py.get_type::<ChannelEmpty>())?;
    m.add("ChannelExists", py.get_type::<ChannelExists>())?;
    m.add("ChannelNotFound", py.get_type::<ChannelNotFound>())?;
    m.add("ChannelCorrupt", py.get_type::<ChannelCorrupt>())?;
    Ok(())
}
