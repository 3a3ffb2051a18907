/*
 * A small C shim over UCP (UCX's protocol layer) for the channel's `ucx`
 * transport (src/ucx_sys.rs wraps it). It exists so that Rust never lays out
 * UCX's parameter structs itself (they change between UCX releases and need
 * bindgen/libclang to mirror): every function here takes plain pointers and
 * integers and returns a `ucs_status_t` (0 = OK, 1 = in progress, < 0 = error).
 *
 * UCX is loaded at RUN time: the shim is compiled against UCX's headers but
 * does not link libucp. rl_ucx_load() dlopen()s libucp.so.0 (or the path in
 * RLINF_UCX_LIBRARY) and resolves every UCP/UCS function this file calls into
 * the table `ucx` below; that table is the only way this file reaches UCX
 * (every call is `ucx.NAME(...)`), so a process without libucx imports and
 * runs the extension, and only the UCX transport reports the missing library.
 * Every other rl_ucx_* function may be called only after rl_ucx_load()
 * returned 0 (the Rust side guarantees it: all of them hang off a Worker,
 * which is created after a successful load).
 *
 * One `rl_ctx` is a UCP context plus one worker, both thread-safe
 * (UCS_THREAD_MODE_MULTI, shared-worker context), with RMA and wakeup.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

/* ---- The run-time binding: one table, filled once by rl_ucx_load. ---- */

/* Each entry has the exact type of the header's declaration (typeof), so a
 * mismatch between this table and UCX's API is a compile error. */
#define RL_UCX_FUNCS(X)                                                        \
    X(ucs_status_string)                                                       \
    X(ucs_log_push_handler)                                                    \
    X(ucp_config_read)                                                         \
    X(ucp_config_modify)                                                       \
    X(ucp_config_release)                                                      \
    X(ucp_init_version)                                                        \
    X(ucp_cleanup)                                                             \
    X(ucp_worker_create)                                                       \
    X(ucp_worker_destroy)                                                      \
    X(ucp_worker_get_efd)                                                      \
    X(ucp_worker_get_address)                                                  \
    X(ucp_worker_release_address)                                              \
    X(ucp_worker_progress)                                                     \
    X(ucp_worker_arm)                                                          \
    X(ucp_worker_signal)                                                       \
    X(ucp_mem_map)                                                             \
    X(ucp_mem_unmap)                                                           \
    X(ucp_rkey_pack)                                                           \
    X(ucp_rkey_buffer_release)                                                 \
    X(ucp_ep_create)                                                           \
    X(ucp_ep_close_nbx)                                                        \
    X(ucp_ep_rkey_unpack)                                                      \
    X(ucp_rkey_destroy)                                                        \
    X(ucp_put_nbx)                                                             \
    X(ucp_get_nbx)                                                             \
    X(ucp_ep_flush_nbx)                                                        \
    X(ucp_request_check_status)                                                \
    X(ucp_request_free)

static struct {
#define RL_FIELD(name) __typeof__(&name) name;
    RL_UCX_FUNCS(RL_FIELD)
#undef RL_FIELD
} ucx;

#define RL_DEFAULT_LIBRARY "libucp.so.0"

static pthread_once_t rl_load_once = PTHREAD_ONCE_INIT;
static char rl_load_error[1024]; /* empty after a successful load */

/* Set on a thread while it tries an endpoint with peer-failure handling
 * (rl_ucx_ep_create): UCX's wireup then logs an ERROR ("no active messages
 * transport to ...: sysv/memory - no peer failure handler, ...") when no
 * transport supports it (shared memory), although the shim handles that by
 * retrying without. rl_log_filter drops exactly those lines. */
static __thread int rl_quiet_wireup;

static ucs_log_func_rc_t rl_log_filter(const char *file, unsigned line, const char *function,
                                       ucs_log_level_t level,
                                       const ucs_log_component_config_t *comp_conf,
                                       const char *message, va_list ap) {
    (void)line; (void)function; (void)level; (void)comp_conf; (void)message; (void)ap;
    if (rl_quiet_wireup && file != NULL && strstr(file, "select.c") != NULL) {
        return UCS_LOG_FUNC_RC_STOP;
    }
    return UCS_LOG_FUNC_RC_CONTINUE;
}

static void rl_ucx_load_once(void) {
    const char *path = getenv("RLINF_UCX_LIBRARY");
    if (path == NULL || path[0] == '\0') path = RL_DEFAULT_LIBRARY;
    /* RTLD_LOCAL: UCX's symbols stay out of the global namespace. Never
     * dlclose'd: UCX keeps threads and hooks for the life of the process. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *why = dlerror();
        snprintf(rl_load_error, sizeof(rl_load_error), "cannot load %s: %s", path,
                 why != NULL ? why : "unknown error");
        return;
    }
    /* dlsym on libucp's handle also searches its dependencies (libucs). */
#define RL_RESOLVE(name)                                                               \
    do {                                                                               \
        void *sym = dlsym(lib, #name);                                                 \
        if (sym == NULL) {                                                             \
            snprintf(rl_load_error, sizeof(rl_load_error),                             \
                     "%s has no symbol %s (UCX too old? this build needs UCX >= 1.10)", \
                     path, #name);                                                     \
            memset(&ucx, 0, sizeof(ucx));                                              \
            return;                                                                    \
        }                                                                              \
        memcpy(&ucx.name, &sym, sizeof(sym));                                          \
    } while (0);
    RL_UCX_FUNCS(RL_RESOLVE)
#undef RL_RESOLVE
    /* Once, before any UCX context exists; handlers run last-pushed first. */
    ucx.ucs_log_push_handler(rl_log_filter);
    rl_load_error[0] = '\0';
}

/* Loads UCX once per process (later calls repeat the first outcome): 0 on
 * success, else -1 with a NUL-terminated reason in *why (static storage). */
int rl_ucx_load(const char **why) {
    (void)pthread_once(&rl_load_once, rl_ucx_load_once);
    if (ucx.ucp_request_free == NULL) {
        *why = rl_load_error;
        return -1;
    }
    *why = NULL;
    return 0;
}

/* ---- UCP through the table. ---- */

typedef struct rl_ctx {
    ucp_context_h context;
    ucp_worker_h worker;
    int efd;
} rl_ctx;

typedef struct rl_ep {
    ucp_ep_h ep;
    volatile int failed; /* set by the error handler: a ucs_status_t, 0 while healthy */
} rl_ep;

/* NULL before a successful load. */
const char *rl_ucx_status_string(int status) {
    if (ucx.ucs_status_string == NULL) return NULL;
    return ucx.ucs_status_string((ucs_status_t)status);
}

/* `tls`: NULL to take UCX_TLS (and the other UCX_* variables) from the
 * environment, else a UCX_TLS value that overrides it for this context. */
int rl_ucx_init(const char *tls, rl_ctx **out) {
    ucp_config_t *config = NULL;
    ucs_status_t st = ucx.ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) return st;
    if (tls != NULL) {
        st = ucx.ucp_config_modify(config, "TLS", tls);
        if (st != UCS_OK) { ucx.ucp_config_release(config); return st; }
    }
    rl_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL) { ucx.ucp_config_release(config); return UCS_ERR_NO_MEMORY; }
    ucp_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;
    st = ucx.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &c->context);
    ucx.ucp_config_release(config);
    if (st != UCS_OK) { free(c); return st; }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    st = ucx.ucp_worker_create(c->context, &wp, &c->worker);
    if (st != UCS_OK) { ucx.ucp_cleanup(c->context); free(c); return st; }
    st = ucx.ucp_worker_get_efd(c->worker, &c->efd);
    if (st != UCS_OK) {
        ucx.ucp_worker_destroy(c->worker);
        ucx.ucp_cleanup(c->context);
        free(c);
        return st;
    }
    *out = c;
    return UCS_OK;
}

void rl_ucx_destroy(rl_ctx *c) {
    ucx.ucp_worker_destroy(c->worker);
    ucx.ucp_cleanup(c->context);
    free(c);
}

/* Copies the worker's address into a malloc'ed buffer (free with rl_ucx_free). */
int rl_ucx_address(rl_ctx *c, void **buf, size_t *len) {
    ucp_address_t *addr = NULL;
    size_t n = 0;
    ucs_status_t st = ucx.ucp_worker_get_address(c->worker, &addr, &n);
    if (st != UCS_OK) return st;
    void *copy = malloc(n);
    if (copy == NULL) { ucx.ucp_worker_release_address(c->worker, addr); return UCS_ERR_NO_MEMORY; }
    memcpy(copy, addr, n);
    ucx.ucp_worker_release_address(c->worker, addr);
    *buf = copy;
    *len = n;
    return UCS_OK;
}

void rl_ucx_free(void *p) { free(p); }

/* Progresses the worker once; returns nonzero if something happened. */
unsigned rl_ucx_progress(rl_ctx *c) { return ucx.ucp_worker_progress(c->worker); }

/* Sleeps until the worker has events or `timeout_ms` passes: 1 if events may
 * be pending (progress now), 0 on timeout, < 0 on error. */
int rl_ucx_wait(rl_ctx *c, int timeout_ms) {
    ucs_status_t st = ucx.ucp_worker_arm(c->worker);
    if (st == UCS_ERR_BUSY) return 1;
    if (st != UCS_OK) return st;
    struct pollfd p = {.fd = c->efd, .events = POLLIN, .revents = 0};
    int r = poll(&p, 1, timeout_ms);
    return r > 0 ? 1 : 0;
}

/* Wakes a thread blocked in rl_ucx_wait. */
void rl_ucx_signal(rl_ctx *c) { (void)ucx.ucp_worker_signal(c->worker); }

int rl_ucx_mem_map(rl_ctx *c, void *addr, size_t len, void **memh) {
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = addr;
    mp.length = len;
    ucp_mem_h h = NULL;
    ucs_status_t st = ucx.ucp_mem_map(c->context, &mp, &h);
    if (st == UCS_OK) *memh = h;
    return st;
}

int rl_ucx_mem_unmap(rl_ctx *c, void *memh) { return ucx.ucp_mem_unmap(c->context, (ucp_mem_h)memh); }

/* Packs the remote key of `memh` into a malloc'ed copy (free with rl_ucx_free). */
int rl_ucx_rkey_pack(rl_ctx *c, void *memh, void **buf, size_t *len) {
    void *packed = NULL;
    size_t n = 0;
    ucs_status_t st = ucx.ucp_rkey_pack(c->context, (ucp_mem_h)memh, &packed, &n);
    if (st != UCS_OK) return st;
    void *copy = malloc(n);
    if (copy == NULL) { ucx.ucp_rkey_buffer_release(packed); return UCS_ERR_NO_MEMORY; }
    memcpy(copy, packed, n);
    ucx.ucp_rkey_buffer_release(packed);
    *buf = copy;
    *len = n;
    return UCS_OK;
}

static void rl_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    (void)ep;
    ((rl_ep *)arg)->failed = status < 0 ? status : UCS_ERR_CONNECTION_RESET;
}

/* An endpoint to the worker whose address is `addr`. With `peer_errors`,
 * peer failure is reported (rl_ucx_ep_failed) instead of aborting the
 * process; not every transport supports that (UCX 1.13's shared-memory ones
 * do not), so callers retry without it. */
int rl_ucx_ep_create(rl_ctx *c, const void *addr, int peer_errors, rl_ep **out) {
    rl_ep *e = calloc(1, sizeof(*e));
    if (e == NULL) return UCS_ERR_NO_MEMORY;
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = (const ucp_address_t *)addr;
    if (peer_errors) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = rl_ep_error;
        ep.err_handler.arg = e;
    }
    rl_quiet_wireup = peer_errors;
    ucs_status_t st = ucx.ucp_ep_create(c->worker, &ep, &e->ep);
    rl_quiet_wireup = 0;
    if (st != UCS_OK) { free(e); return st; }
    *out = e;
    return UCS_OK;
}

int rl_ucx_ep_failed(const rl_ep *e) { return e->failed; }

/* Closes the endpoint and frees it, progressing at most `max_rounds`. With
 * `force`, outstanding operations are cancelled (complete with an error) and
 * the peer is not told; without, they are flushed first and the peer removes
 * its side of the connection (UCX 1.13 can abort the peer's process on an
 * assertion when its reverse endpoint later finds the worker gone, so a
 * healthy endpoint is always closed this way). */
void rl_ucx_ep_close(rl_ctx *c, rl_ep *e, int force, unsigned max_rounds) {
    ucp_request_param_t p;
    memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void *req = ucx.ucp_ep_close_nbx(e->ep, &p);
    if (UCS_PTR_IS_PTR(req)) {
        unsigned i;
        for (i = 0; i < max_rounds && ucx.ucp_request_check_status(req) == UCS_INPROGRESS; i++) {
            ucx.ucp_worker_progress(c->worker);
        }
        ucx.ucp_request_free(req);
    }
    free(e);
}

int rl_ucx_rkey_unpack(rl_ep *e, const void *buf, void **rkey) {
    ucp_rkey_h k = NULL;
    ucs_status_t st = ucx.ucp_ep_rkey_unpack(e->ep, buf, &k);
    if (st == UCS_OK) *rkey = k;
    return st;
}

void rl_ucx_rkey_destroy(void *rkey) { ucx.ucp_rkey_destroy((ucp_rkey_h)rkey); }

/* Turns a UCP nbx return value into a status and an optional request. */
static int rl_request(ucs_status_ptr_t r, void **req) {
    *req = NULL;
    if (r == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
    *req = r;
    return UCS_INPROGRESS;
}

int rl_ucx_put(rl_ep *e, const void *buf, size_t len, uint64_t raddr, void *rkey, void **req) {
    ucp_request_param_t p;
    memset(&p, 0, sizeof(p));
    return rl_request(ucx.ucp_put_nbx(e->ep, buf, len, raddr, (ucp_rkey_h)rkey, &p), req);
}

int rl_ucx_get(rl_ep *e, void *buf, size_t len, uint64_t raddr, void *rkey, void **req) {
    ucp_request_param_t p;
    memset(&p, 0, sizeof(p));
    return rl_request(ucx.ucp_get_nbx(e->ep, buf, len, raddr, (ucp_rkey_h)rkey, &p), req);
}

/* Remote completion of every put posted on `e` so far. */
int rl_ucx_flush(rl_ep *e, void **req) {
    ucp_request_param_t p;
    memset(&p, 0, sizeof(p));
    return rl_request(ucx.ucp_ep_flush_nbx(e->ep, &p), req);
}

int rl_ucx_request_status(void *req) { return ucx.ucp_request_check_status(req); }

void rl_ucx_request_free(void *req) { ucx.ucp_request_free(req); }
