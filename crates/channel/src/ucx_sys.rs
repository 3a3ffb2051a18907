//! Safe wrappers over the UCX shim (`csrc/ucx_shim.c`), behind the `ucx` feature.
//!
//! What: a UCP context with one thread-safe worker ([`Worker`]), registered
//! memory ([`MemRegion`], whose packed remote key a peer unpacks), endpoints
//! to a peer worker ([`Ep`]), unpacked remote keys ([`RKey`]) and one-sided
//! put/get/flush returning [`Request`]s.
//!
//! Why a shim: UCP's parameter structs are versioned C structs; mirroring
//! them by hand is fragile and bindgen needs libclang. The shim takes plain
//! pointers and integers, so the Rust side declares nine-odd functions.
//!
//! Loading: the shim does not link libucp; [`load`] `dlopen`s it (once per
//! process, on first use of UCX: the first [`Worker::new`]), so the crate
//! runs without libucx and only UCX reports it missing, with the fix.
//!
//! Cost: every call is one indirect C call into libucp; a worker costs a few
//! milliseconds to create and holds a few file descriptors and threads-safe
//! locks (UCS_THREAD_MODE_MULTI), so processes share one per role.
//!
//! All `unsafe` of the UCX path is in this module.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::io;
use std::sync::{Arc, OnceLock};

#[repr(C)]
struct RlCtx {
    _opaque: [u8; 0],
}

#[repr(C)]
struct RlEp {
    _opaque: [u8; 0],
}

const UCS_OK: c_int = 0;
/// `UCS_INPROGRESS`: the operation is still running.
const UCS_INPROGRESS: c_int = 1;

unsafe extern "C" {
    fn rl_ucx_load(why: *mut *const c_char) -> c_int;
    fn rl_ucx_status_string(status: c_int) -> *const c_char;
    fn rl_ucx_init(tls: *const c_char, out: *mut *mut RlCtx) -> c_int;
    fn rl_ucx_destroy(c: *mut RlCtx);
    fn rl_ucx_address(c: *mut RlCtx, buf: *mut *mut c_void, len: *mut usize) -> c_int;
    fn rl_ucx_free(p: *mut c_void);
    fn rl_ucx_progress(c: *mut RlCtx) -> c_uint;
    fn rl_ucx_wait(c: *mut RlCtx, timeout_ms: c_int) -> c_int;
    fn rl_ucx_signal(c: *mut RlCtx);
    fn rl_ucx_mem_map(
        c: *mut RlCtx,
        addr: *mut c_void,
        len: usize,
        memh: *mut *mut c_void,
    ) -> c_int;
    fn rl_ucx_mem_unmap(c: *mut RlCtx, memh: *mut c_void) -> c_int;
    fn rl_ucx_rkey_pack(
        c: *mut RlCtx,
        memh: *mut c_void,
        buf: *mut *mut c_void,
        len: *mut usize,
    ) -> c_int;
    fn rl_ucx_ep_create(
        c: *mut RlCtx,
        addr: *const c_void,
        peer_errors: c_int,
        out: *mut *mut RlEp,
    ) -> c_int;
    fn rl_ucx_ep_failed(e: *const RlEp) -> c_int;
    fn rl_ucx_ep_close(c: *mut RlCtx, e: *mut RlEp, force: c_int, max_rounds: c_uint);
    fn rl_ucx_rkey_unpack(e: *mut RlEp, buf: *const c_void, rkey: *mut *mut c_void) -> c_int;
    fn rl_ucx_rkey_destroy(rkey: *mut c_void);
    fn rl_ucx_put(
        e: *mut RlEp,
        buf: *const c_void,
        len: usize,
        raddr: u64,
        rkey: *mut c_void,
        req: *mut *mut c_void,
    ) -> c_int;
    fn rl_ucx_get(
        e: *mut RlEp,
        buf: *mut c_void,
        len: usize,
        raddr: u64,
        rkey: *mut c_void,
        req: *mut *mut c_void,
    ) -> c_int;
    fn rl_ucx_flush(e: *mut RlEp, req: *mut *mut c_void) -> c_int;
    fn rl_ucx_request_status(req: *mut c_void) -> c_int;
    fn rl_ucx_request_free(req: *mut c_void);
}

/// Loads UCX's runtime library (`libucp.so.0`, or the path in
/// `RLINF_UCX_LIBRARY`) and resolves the functions the shim calls. Runs once
/// per process; later calls repeat the outcome.
///
/// # Errors
/// `NotFound` naming the library, the loader's reason and the fix, when the
/// library is missing or lacks a function this build needs.
pub fn load() -> io::Result<()> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let mut why: *const c_char = std::ptr::null();
            // SAFETY: `why` is a valid out-pointer; the shim serializes the
            // load (pthread_once) and sets `why` to null or to a static
            // NUL-terminated string.
            if unsafe { rl_ucx_load(&mut why) } == 0 {
                return Ok(());
            }
            let reason = if why.is_null() {
                String::from("unknown error")
            } else {
                // SAFETY: non-null, static and NUL-terminated (see above).
                unsafe { CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            };
            Err(format!(
                "UCX's runtime library is not usable here ({reason}). Install UCX \
                 (`apt-get install libucx0`, or libucx-dev, on Debian/Ubuntu) or set \
                 RLINF_UCX_LIBRARY to the path of libucp.so; `ucx_info -d` (package \
                 ucx-utils) lists the transports UCX finds"
            ))
        })
        .clone()
        .map_err(|e| io::Error::new(io::ErrorKind::NotFound, e))
}

/// UCX's text for a status code.
pub fn status_string(status: i32) -> String {
    // SAFETY: the shim returns null before UCX is loaded, else what
    // `ucs_status_string` returns: a pointer to a static NUL-terminated
    // string for every status value (an "unknown" text for unknown ones).
    let p = unsafe { rl_ucx_status_string(status) };
    if p.is_null() {
        return format!("UCX status {status}");
    }
    // SAFETY: non-null, static and NUL-terminated (see above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// An `io::Error` for a failed UCX call: peer failures (`UCS_ERR_UNREACHABLE`,
/// `_CANCELED`, `_TIMED_OUT`, `_NOT_CONNECTED`, `_CONNECTION_RESET`,
/// `_ENDPOINT_TIMEOUT`) map to `ConnectionReset`, the rest to `Other`.
pub fn error(what: &str, status: i32) -> io::Error {
    let kind = match status {
        -6 | -16 | -20 | -24 | -25 | -80 => io::ErrorKind::ConnectionReset,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, format!("{what}: UCX: {}", status_string(status)))
}

fn check(what: &str, status: c_int) -> io::Result<()> {
    if status == UCS_OK {
        Ok(())
    } else {
        Err(error(what, status))
    }
}

/// A UCP context and its worker. Thread-safe: UCX serializes calls on it.
pub struct Worker {
    ctx: *mut RlCtx,
}

// SAFETY: the context is created with a shared-worker (`mt_workers_shared`)
// context and a `UCS_THREAD_MODE_MULTI` worker, so UCX locks internally and
// every shim function may be called from any thread.
unsafe impl Send for Worker {}
// SAFETY: as above.
unsafe impl Sync for Worker {}

impl Worker {
    /// A new context and worker. `tls` overrides `UCX_TLS` for it; `None`
    /// takes UCX's configuration from the environment.
    ///
    /// # Errors
    /// If UCX's library cannot be loaded ([`load`]) or UCX cannot initialise
    /// (no usable transport, bad `UCX_*` value).
    pub fn new(tls: Option<&str>) -> io::Result<Arc<Self>> {
        load()?;
        let tls = tls
            .map(CString::new)
            .transpose()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "UCX_TLS contains NUL"))?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: `tls` is null or a live NUL-terminated string for the call;
        // `ctx` is a valid out-pointer, written only on success.
        let st = unsafe {
            rl_ucx_init(
                tls.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                &mut ctx,
            )
        };
        check("cannot initialise UCX", st)?;
        Ok(Arc::new(Self { ctx }))
    }

    /// The worker's address, for a peer's [`Ep::connect`].
    ///
    /// # Errors
    /// On a UCX failure.
    pub fn address(&self) -> io::Result<Vec<u8>> {
        let (mut buf, mut len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: `self.ctx` is live; the out-pointers are valid.
        check("worker address", unsafe {
            rl_ucx_address(self.ctx, &mut buf, &mut len)
        })?;
        // SAFETY: on success `buf` is a malloc'ed block of `len` bytes that we
        // own; it is copied, then freed exactly once.
        let out = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec();
        // SAFETY: as above.
        unsafe { rl_ucx_free(buf) };
        Ok(out)
    }

    /// Progresses communication once; true if anything happened.
    pub fn progress(&self) -> bool {
        // SAFETY: `self.ctx` is live; the worker is thread-safe.
        unsafe { rl_ucx_progress(self.ctx) != 0 }
    }

    /// Sleeps until the worker has events or `timeout_ms` passes.
    pub fn wait(&self, timeout_ms: i32) {
        // SAFETY: `self.ctx` is live; the worker is thread-safe.
        let _ = unsafe { rl_ucx_wait(self.ctx, timeout_ms) };
    }

    /// Wakes a thread sleeping in [`Worker::wait`].
    pub fn signal(&self) {
        // SAFETY: `self.ctx` is live; the worker is thread-safe.
        unsafe { rl_ucx_signal(self.ctx) }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // SAFETY: the last reference is going; endpoints, regions and keys
        // hold an `Arc<Worker>`, so none outlives the context.
        unsafe { rl_ucx_destroy(self.ctx) }
    }
}

/// Memory registered with a worker's context; unregistered on drop.
pub struct MemRegion {
    worker: Arc<Worker>,
    memh: *mut c_void,
}

// SAFETY: a memory handle is a context-level object; UCX locks the context.
unsafe impl Send for MemRegion {}
// SAFETY: as above.
unsafe impl Sync for MemRegion {}

impl MemRegion {
    /// Registers `len` bytes at `addr`.
    ///
    /// # Safety
    /// `addr..addr+len` must be mapped, and stay mapped until the region is
    /// dropped; peers holding its key may write anywhere in it.
    pub unsafe fn new(worker: &Arc<Worker>, addr: *mut u8, len: usize) -> io::Result<Self> {
        let mut memh = std::ptr::null_mut();
        // SAFETY: the caller guarantees the range is mapped; `memh` is a valid
        // out-pointer.
        let st = unsafe { rl_ucx_mem_map(worker.ctx, addr.cast(), len, &mut memh) };
        check("cannot register memory with UCX", st)?;
        Ok(Self {
            worker: Arc::clone(worker),
            memh,
        })
    }

    /// The packed remote key a peer unpacks with [`RKey::unpack`].
    ///
    /// # Errors
    /// On a UCX failure.
    pub fn packed_key(&self) -> io::Result<Vec<u8>> {
        let (mut buf, mut len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: context and handle are live; the out-pointers are valid.
        check("rkey pack", unsafe {
            rl_ucx_rkey_pack(self.worker.ctx, self.memh, &mut buf, &mut len)
        })?;
        // SAFETY: on success `buf` is an owned malloc'ed block of `len` bytes,
        // copied and then freed exactly once.
        let out = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec();
        // SAFETY: as above.
        unsafe { rl_ucx_free(buf) };
        Ok(out)
    }
}

impl Drop for MemRegion {
    fn drop(&mut self) {
        // SAFETY: the handle came from `rl_ucx_mem_map` on this context and
        // is unmapped exactly once.
        let _ = unsafe { rl_ucx_mem_unmap(self.worker.ctx, self.memh) };
    }
}

/// An endpoint to a peer worker. Closed on drop: gracefully (outstanding
/// operations flushed, the peer told) unless [`Ep::set_force_close`] was
/// called, then forcibly (outstanding operations cancelled).
pub struct Ep {
    worker: Arc<Worker>,
    ep: *mut RlEp,
    force: bool,
}

// SAFETY: the endpoint belongs to a `UCS_THREAD_MODE_MULTI` worker; UCX
// serializes its use. The error flag is written by UCX under the worker lock
// and read as a plain int.
unsafe impl Send for Ep {}

impl Ep {
    /// Connects to the worker whose address is `peer` (from [`Worker::address`]).
    /// Peer failures are reported by [`Ep::failure`] where the chosen UCX
    /// transports support that (tcp, RDMA); otherwise (UCX's shared-memory
    /// transports) the endpoint is made without, and the caller must watch
    /// the peer another way.
    ///
    /// # Errors
    /// If the address is malformed or no transport reaches it.
    pub fn connect(worker: &Arc<Worker>, peer: &[u8]) -> io::Result<Self> {
        let mut ep = std::ptr::null_mut();
        // SAFETY: `peer` is a live buffer for the call (UCX copies what it
        // needs); `ep` is a valid out-pointer.
        let mut st = unsafe { rl_ucx_ep_create(worker.ctx, peer.as_ptr().cast(), 1, &mut ep) };
        if st != UCS_OK {
            // SAFETY: as above.
            st = unsafe { rl_ucx_ep_create(worker.ctx, peer.as_ptr().cast(), 0, &mut ep) };
        }
        check("cannot create a UCX endpoint", st)?;
        Ok(Self {
            worker: Arc::clone(worker),
            ep,
            force: false,
        })
    }

    /// Makes the drop cancel outstanding operations instead of flushing them
    /// (for an endpoint whose peer failed or whose transfer was abandoned).
    pub fn set_force_close(&mut self) {
        self.force = true;
    }

    /// The peer-failure status UCX reported (0 while healthy).
    pub fn failure(&self) -> i32 {
        // SAFETY: `self.ep` is live until drop.
        unsafe { rl_ucx_ep_failed(self.ep) }
    }

    /// The worker this endpoint progresses on.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    /// Posts a put of `src` to `raddr` under `rkey`.
    ///
    /// # Safety
    /// `src` must stay valid and unchanged until the returned request
    /// completes, or until this endpoint is dropped (which cancels it).
    pub unsafe fn put(&self, src: &[u8], raddr: u64, rkey: &RKey) -> io::Result<Option<Request>> {
        let mut req = std::ptr::null_mut();
        // SAFETY: the caller keeps `src` alive as required; `rkey` was
        // unpacked on this endpoint and is live.
        let st = unsafe {
            rl_ucx_put(
                self.ep,
                src.as_ptr().cast(),
                src.len(),
                raddr,
                rkey.rkey,
                &mut req,
            )
        };
        Request::from_status("UCX put", st, req)
    }

    /// Posts a get of `dst.len()` bytes at `raddr` into `dst`.
    ///
    /// # Safety
    /// `dst` must stay valid and otherwise unaccessed until the returned
    /// request completes, or until this endpoint is dropped.
    pub unsafe fn get(
        &self,
        dst: &mut [u8],
        raddr: u64,
        rkey: &RKey,
    ) -> io::Result<Option<Request>> {
        let mut req = std::ptr::null_mut();
        // SAFETY: as for `put`, with `dst` writable.
        let st = unsafe {
            rl_ucx_get(
                self.ep,
                dst.as_mut_ptr().cast(),
                dst.len(),
                raddr,
                rkey.rkey,
                &mut req,
            )
        };
        Request::from_status("UCX get", st, req)
    }

    /// Posts a flush: completes when every put posted before it has landed
    /// in the peer's memory.
    ///
    /// # Errors
    /// If the endpoint has failed.
    pub fn flush(&self) -> io::Result<Option<Request>> {
        let mut req = std::ptr::null_mut();
        // SAFETY: `self.ep` is live; `req` is a valid out-pointer.
        let st = unsafe { rl_ucx_flush(self.ep, &mut req) };
        Request::from_status("UCX flush", st, req)
    }
}

impl Drop for Ep {
    fn drop(&mut self) {
        // SAFETY: `self.ep` is live and closed exactly once; the shim frees it.
        // Keys unpacked on it are dropped before (the owner orders fields).
        unsafe { rl_ucx_ep_close(self.worker.ctx, self.ep, c_int::from(self.force), 100_000) }
    }
}

/// A peer's remote key, unpacked on one endpoint. Must be dropped before
/// that endpoint.
pub struct RKey {
    rkey: *mut c_void,
}

// SAFETY: an rkey is immutable after unpacking; UCX only reads it.
unsafe impl Send for RKey {}

impl RKey {
    /// Unpacks a key packed by [`MemRegion::packed_key`] on the peer.
    ///
    /// # Errors
    /// If the buffer is not a key UCX understands for this endpoint.
    pub fn unpack(ep: &Ep, packed: &[u8]) -> io::Result<Self> {
        let mut rkey = std::ptr::null_mut();
        // SAFETY: `packed` is live for the call; UCX copies it; `rkey` is a
        // valid out-pointer.
        let st = unsafe { rl_ucx_rkey_unpack(ep.ep, packed.as_ptr().cast(), &mut rkey) };
        check("cannot unpack the home node's UCX key", st)?;
        Ok(Self { rkey })
    }
}

impl Drop for RKey {
    fn drop(&mut self) {
        // SAFETY: unpacked by `rl_ucx_rkey_unpack`, destroyed exactly once.
        unsafe { rl_ucx_rkey_destroy(self.rkey) }
    }
}

/// An outstanding UCX operation; freed on drop (UCX then lets it finish or
/// be cancelled on its own).
pub struct Request {
    req: *mut c_void,
}

// SAFETY: requests of a MULTI-mode worker may be checked from any thread.
unsafe impl Send for Request {}

impl Request {
    fn from_status(what: &str, st: c_int, req: *mut c_void) -> io::Result<Option<Self>> {
        match st {
            UCS_OK => Ok(None),
            UCS_INPROGRESS => Ok(Some(Self { req })),
            e => Err(error(what, e)),
        }
    }

    /// `None` while running, else the outcome.
    pub fn status(&self, what: &str) -> Option<io::Result<()>> {
        // SAFETY: `self.req` is a live request until drop.
        match unsafe { rl_ucx_request_status(self.req) } {
            UCS_INPROGRESS => None,
            st => Some(check(what, st)),
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        // SAFETY: a request returned by an nbx call, freed exactly once.
        unsafe { rl_ucx_request_free(self.req) }
    }
}
