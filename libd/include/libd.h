/*
 * libd — the Scad runtime library, its whole public C contract in one header.
 *
 * A compute element owns a libd_action; the action holds named transports, each described by a
 * durl ("NAME;IMPL;KEY,VALUE;..."). A transport of kind RDMA reads and writes a remote memory
 * element one-sidedly; a transport of kind RDMA_SERVER serves a memory element.
 *
 * Conventions (as in rdma-core):
 *  - calls that return int return 0 (or a non-negative value where documented) on success and a
 *    negative errno on failure; they never exit the process;
 *  - calls that return a pointer return NULL on failure; libd_last_error() then says why;
 *  - after any failure, libd_last_error() holds a one-line message for the calling thread that
 *    names what went wrong (secrets are never included).
 *
 * Error codes users meet most:
 *   -EINVAL   bad argument or malformed durl      -ENOENT   no transport of that name
 *   -EEXIST   duplicate transport name            -ENOBUFS  read/write before libd_trdma_reg
 *   -ERANGE   out of local or remote bounds       -EACCES   the grant does not allow it
 *   -ETIMEDOUT deadline passed                    -ECONNRESET / -ENOTCONN / -ECONNREFUSED peer gone
 *   -ESHUTDOWN transport terminated               -ECANCELED operation cancelled (or grant revoked)
 *   -EKEYEXPIRED the grant expired
 *   -EOPNOTSUPP the transport does not implement the call
 */
#ifndef LIBD_H
#define LIBD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libd is built with hidden visibility: these declarations are the library's only exports. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define LIBD_VERSION_MAJOR 1
#define LIBD_VERSION_MINOR 7

typedef struct libd_action libd_action;
typedef struct libd_transport libd_transport;
typedef struct libd_op libd_op;

/* ---- errors ----------------------------------------------------------------------------- */

/* A static description of a (negative or positive) errno value. */
const char *libd_strerror(int err);
/* The calling thread's last error message; "" when none. Valid until the thread's next call. */
const char *libd_last_error(void);

/* ---- action ------------------------------------------------------------------------------ */

/* Creates an action. argv holds Scad-style options as "+key" "value" pairs, e.g.
 * "+timeout_ms" "5000"; unknown options are kept and readable by transports.
 * Returns NULL on failure (libd_last_error() says why). */
libd_action *libd_action_init(const char *aid, int argc, char **argv);
/* Terminates every transport of the action and frees it. */
int libd_action_free(libd_action *action);
const char *libd_action_id(const libd_action *action);

/* Adds a transport from a durl. -EINVAL with a message naming the position for a malformed
 * durl or an unknown implementation; -EEXIST for a duplicate name. */
int libd_action_add_transport(libd_action *action, const char *durl);
/* Merges "KEY,VALUE;KEY,VALUE" into the named transport's parameters and (re)initialises it:
 * INIT -> INITD; a transport already connected reconnects lazily to the new address. */
int libd_action_config_transport(libd_action *action, const char *name, const char *config);
/* NULL (and -ENOENT in libd_last_error) if there is no transport of that name. */
libd_transport *libd_action_get_transport(libd_action *action, const char *name);
/* Writes the transport names, comma-separated, into buf. Returns the count. */
int libd_action_transport_names(const libd_action *action, char *buf, size_t cap);

/* ---- transport: identity and state machine ------------------------------------------------ */

enum libd_state {
    LIBD_STATE_INIT = 1,        /* created, waiting for its configuration */
    LIBD_STATE_INITD = 2,       /* configured, not connected */
    LIBD_STATE_READY = 4,       /* operations run */
    LIBD_STATE_ERROR = 8,       /* failed; recover() reconnects */
    LIBD_STATE_TERMINATED = 16, /* final */
};

enum libd_kind {
    LIBD_KIND_RDMA = 1,         /* client side: reg/read/write */
    LIBD_KIND_RDMA_SERVER = 2,  /* memory element side: serve */
};

const char *libd_transport_name(const libd_transport *trans);
/* The canonical implementation name, e.g. "rdma_tcp". */
const char *libd_transport_impl(const libd_transport *trans);
int libd_transport_kind(const libd_transport *trans);
const char *libd_state_name(int state);

/* Current state (a libd_state value). */
int libd_transport_state(libd_transport *trans);
/* Waits until the state is one of state_mask. Returns the state, or -ETIMEDOUT.
 * timeout_ms < 0 means the transport's own deadline (durl key timeout_ms). */
int libd_transport_wait_state(libd_transport *trans, unsigned state_mask, int timeout_ms);
/* Waits until the state-change counter differs from *seq, then stores the new counter in *seq
 * and returns the state. Start with *seq = 0. No change is ever missed between two calls. */
int libd_transport_wait_change(libd_transport *trans, uint64_t *seq, int timeout_ms);

int libd_transport_init(libd_transport *trans);      /* INIT -> INITD */
/* INITD -> READY. Connecting checks the grant with the memory element, so besides the network's
 * errors (-ECONNREFUSED, -ETIMEDOUT, -EHOSTUNREACH, ...) it returns the element's refusal:
 * -EACCES (unknown, revoked or expired grant, wrong secret, another client's grant), -EPERM or
 * -EOPNOTSUPP (a grant this transport cannot serve; the message says which). A transport whose
 * first operation connects it (lazily) reports the same through that operation. */
int libd_transport_connect(libd_transport *trans);
int libd_transport_recover(libd_transport *trans);   /* ERROR -> READY (reconnects) */
int libd_transport_terminate(libd_transport *trans); /* any -> TERMINATED */

/* The transport's last error message (why it is in ERROR), "" if none. */
int libd_transport_error(libd_transport *trans, char *buf, size_t cap);
/* The out-of-band message a transport publishes for the control plane to relay to its peer
 * (for a server: where and how to reach it). Returns its length, -ENODATA if none yet;
 * -ERANGE if cap is too small (then *needed, if given, holds the size). */
int libd_transport_get_message(libd_transport *trans, char *buf, size_t cap, size_t *needed);
/* What the transport can do (since 1.3), once it is INITD: LIBD_CAP_* bits (>= 0), or -EINVAL.
 * Read it once instead of probing: a binding that sees no LIBD_CAP_NOWAIT skips the *_nowait
 * forms. LIBD_CAP_DIRECT may appear at connect (verbs in polling mode). */
#define LIBD_CAP_NOWAIT (1u << 0)       /* transfers are copies made in the calling thread (shm, local) */
#define LIBD_CAP_DIRECT (1u << 1)       /* a blocking one-segment transfer completes in the calling thread */
#define LIBD_CAP_NOTIFY (1u << 2)       /* libd_trdma_notify reaches the memory's owner */
#define LIBD_CAP_LAZY_CONNECT (1u << 3) /* an operation may connect its transport without waiting for the verdict */
#define LIBD_CAP_SERVER (1u << 4)       /* a memory element server: the libd_trdma_server_* calls */
int libd_transport_caps(libd_transport *trans);
/* Transport-specific control knobs (e.g. the fake transport's faults). -EOPNOTSUPP if unknown. */
int libd_transport_set(libd_transport *trans, const char *key, const char *value);

/* Counters. Latency histogram bucket i counts operations whose latency was in
 * [2^i, 2^(i+1)) nanoseconds; one operation in 64 is timed (the first always), the counts of
 * operations and bytes are exact. */
#define LIBD_HIST_BUCKETS 40
typedef struct libd_stats {
    uint64_t read_ops, write_ops;
    uint64_t read_bytes, write_bytes;
    uint64_t errors;
    uint64_t latency_ns_hist[LIBD_HIST_BUCKETS];
} libd_stats;
int libd_transport_stats(libd_transport *trans, libd_stats *out);
/* Time the transport's operations took, in nanoseconds (since 1.2): the timed operations' sum
 * scaled to all that succeeded (exact while every one is timed, then an estimate from the one in
 * 64 that is). What a platform reports as time spent in transfers. */
int libd_transport_busy_ns(libd_transport *trans, uint64_t *ns);
/* Median (p=0.5) or any percentile of the latency histogram, in nanoseconds (bucket midpoint). */
uint64_t libd_stats_percentile_ns(const libd_stats *stats, double p);

/* ---- rdma interface (client side) --------------------------------------------------------- */

enum libd_rights { LIBD_RIGHT_READ = 1, LIBD_RIGHT_WRITE = 2 };

/* A list of the caller's buffers (since 1.4): where each is and its bytes. */
typedef struct libd_range {
    void *base;
    uint64_t size;
} libd_range;
#define LIBD_MAX_RANGES 1024

/* Registers a local buffer for I/O. *buf == NULL: the library allocates size bytes (zeroed,
 * page-aligned) and stores the pointer in *buf; otherwise the caller's buffer is registered.
 * Registering again replaces the previous registration (a buffer allocated by the library is
 * freed). Allocated buffers live until the next reg or until the transport is terminated. */
int libd_trdma_reg(libd_transport *trans, size_t size, void **buf);
/* Registers n (1..LIBD_MAX_RANGES) buffers of the caller for I/O at once (since 1.4): each
 * transfer's buffer must lie inside one of them. Replaces the previous registration, as
 * libd_trdma_reg does. verbs registers one buffer only (-EOPNOTSUPP for n > 1). */
int libd_trdma_reg_ranges(libd_transport *trans, const libd_range *ranges, int n);
/* The remote region this transport may reach: bytes and rights of the grant. */
int libd_trdma_remote(libd_transport *trans, uint64_t *size, unsigned *rights);

/* One-sided transfers. raddr is an offset in the remote memory element; buf must lie inside the
 * registered local buffer. Block until done or until the transport's deadline. */
int libd_trdma_read(libd_transport *trans, size_t size, uint64_t raddr, void *buf);
int libd_trdma_write(libd_transport *trans, size_t size, uint64_t raddr, const void *buf);

/* The grant's memory mapped into the caller (since 1.4), as UCX's ucp_rkey_ptr offers on shared
 * memory: shm over a memory element's pages (not lent memory) maps them again, read-only under a
 * read-only grant, and *addr, *size describe the whole element (a shm grant is always whole).
 * The mapping is the caller's: munmap(*addr, *size) ends it; it outlives the transport. It sees
 * every later write to the element, by anyone. Connects first if the transport is not READY.
 * -EOPNOTSUPP on transports that move bytes on request (tcp, verbs, lent memory). */
int libd_trdma_map(libd_transport *trans, void **addr, uint64_t *size);

/* Non-blocking forms: move the data only if that can finish in the calling thread without
 * waiting — the transport is READY, nothing else holds it, and its engine copies in place (shm,
 * local). Otherwise return -EAGAIN having done nothing, and the caller uses the blocking form.
 * Bindings use them to skip a thread hand-off (Python's GIL) that would cost more than the copy. */
int libd_trdma_read_nowait(libd_transport *trans, size_t size, uint64_t raddr, void *buf);
int libd_trdma_write_nowait(libd_transport *trans, size_t size, uint64_t raddr, const void *buf);

/* Scatter/gather: each entry moves size bytes between buf and raddr. */
typedef struct libd_iov {
    size_t size;
    uint64_t raddr;
    void *buf;
} libd_iov;
int libd_trdma_readv(libd_transport *trans, const libd_iov *iov, int iovcnt);
int libd_trdma_writev(libd_transport *trans, const libd_iov *iov, int iovcnt);

/* Asynchronous forms. On success *op is a handle the caller must libd_op_free(). */
int libd_trdma_read_async(libd_transport *trans, size_t size, uint64_t raddr, void *buf,
                          libd_op **op);
int libd_trdma_write_async(libd_transport *trans, size_t size, uint64_t raddr, const void *buf,
                           libd_op **op);
int libd_trdma_readv_async(libd_transport *trans, const libd_iov *iov, int iovcnt, libd_op **op);
int libd_trdma_writev_async(libd_transport *trans, const libd_iov *iov, int iovcnt, libd_op **op);

/* 0 when done, -EINPROGRESS while running, a negative errno if it failed. Over tcp a caller that
 * polls in a loop runs the process's shared client loop itself meanwhile (its thread parked for
 * 200 µs after each call, so that the answers polled for wake no thread); libd_op_watch with an
 * fd, before the caller sleeps, gives the loop back at once. */
int libd_op_poll(libd_op *op);
/* Waits up to timeout_ms (< 0: forever — the transport's deadline still ends it). Returns as
 * libd_op_poll; -ETIMEDOUT if the wait itself timed out (the operation goes on). */
int libd_op_wait(libd_op *op, int timeout_ms);
/* Cancels: once it returns, the library no longer touches the operation's buffers. The
 * operation ends with -ECANCELED unless it had already finished. */
int libd_op_cancel(libd_op *op);
/* Frees the handle, cancelling the operation first if it is still running. */
int libd_op_free(libd_op *op);
/* Waiting in an event loop instead of a thread (since 1.2): libd writes to fd (the caller's
 * eventfd; 8 bytes holding 1) once the operation has completed, at once if it already has.
 * fd < 0 stops it; once that returns no write to the old fd can come any more. */
int libd_op_watch(libd_op *op, int fd);

/* ---- rdma_server interface (memory element side) ------------------------------------------ */

/* Starts serving in the background and returns. The message (libd_transport_get_message) then
 * holds the address clients use. */
int libd_trdma_server_serve(libd_transport *trans);
/* Stops serving: connections are closed, grants revoked. */
int libd_trdma_server_stop(libd_transport *trans);
/* Grants client `client` access to [offset, offset+length) with `rights` (LIBD_RIGHT_*).
 * Writes into out the configuration string the client passes to libd_action_config_transport
 * (it carries the grant's secret: hand it only to that client). Returns its length. */
int libd_trdma_server_grant(libd_transport *trans, const char *client, uint64_t offset,
                            uint64_t length, unsigned rights, char *out, size_t cap);
/* Revokes a grant at once (by the id in its configuration string): its connections close. */
int libd_trdma_server_revoke(libd_transport *trans, const char *grant_id);
/* Scad's call: serve and block until the transport is stopped or terminated. Returns 0 then,
 * also when it was stopped before this call began (so a thread that calls run and one that calls
 * stop need no ordering between them). */
int libd_trdma_server_run(libd_transport *trans);

/* ---- lent memory and completion notifications (since 1.1) ---------------------------------
 *
 * A process serves its own memory in place (nothing is copied) and learns when the peer it
 * granted it to is done, without polling and without a message of its own:
 *
 *   owner:   serve a server transport with size,0; expose(buf); grant_ex(element, ttl) -> config;
 *            relay config; wait_notify(grant) -> the holder's value and status; revoke; withdraw
 *   holder:  config_transport(config); read/write ...; libd_trdma_notify(value, 0)
 *
 * The notification rides the holder's control connection to the owner (tcp: its data connection;
 * shm: its unix socket; verbs: its idle tcp control connection), sent after the holder's own
 * transfers completed, so it never overtakes data. On one host (shm) lent memory is reached by
 * cross-memory attach (process_vm_readv/writev): same user only, as the kernel's ptrace rule says. */

/* Serves [base, base+size) of the caller as memory element `element` of a serving server
 * transport. The caller keeps the memory valid until libd_trdma_server_withdraw returns.
 * -ENOTCONN not serving; -EEXIST name taken; -EINVAL NULL base or size 0. */
int libd_trdma_server_expose(libd_transport *trans, const char *element, void *base, uint64_t size);
/* Serves n (1..LIBD_MAX_RANGES) buffers of the caller as one element, in place (as NIXL lends a
 * list of descriptors with one blob): its offsets run through the ranges in order (range i starts
 * where range i-1 ends), and a grant on it opens those bytes and nothing between them. A grant on
 * it covers the whole element, and one transfer moves within one range (a holder names each
 * range with its own libd_iov entry; crossing is refused with -EINVAL). Served over tcp and shm;
 * verbs refuses it with -EOPNOTSUPP (one remote key reaches one range: lend each on its own).
 * -EEXIST, -EINVAL (a range of size 0 or no address, n out of bounds), -ENOTCONN. */
int libd_trdma_server_expose_ranges(libd_transport *trans, const char *element, const libd_range *ranges, int n);
/* Stops serving an element: its grants are revoked and their connections closed; tcp and verbs
 * peers can no longer reach the memory once it returns. A shm peer attached to lent memory
 * finishes the single transfer it may be running, then fails (-ECONNRESET). -ENOENT unknown. */
int libd_trdma_server_withdraw(libd_transport *trans, const char *element);

typedef struct libd_grant_spec {
    const char *element;  /* NULL or "": the transport's own element */
    const char *client;   /* the action id allowed to use it, or "*" */
    uint64_t offset;      /* range inside the element */
    uint64_t length;      /* 0: to the element's end */
    unsigned rights;      /* LIBD_RIGHT_READ and/or LIBD_RIGHT_WRITE */
    uint64_t ttl_ms;      /* 0: until revoked; else revoked (connections closed) after ttl_ms */
} libd_grant_spec;
/* As libd_trdma_server_grant, on any element and with an expiry. Returns the config's length.
 * -ENOENT no such element; -ERANGE range outside it; -EINVAL bad client or rights. */
int libd_trdma_server_grant_ex(libd_transport *trans, const libd_grant_spec *spec, char *out, size_t cap);
/* Owner side: takes the oldest notification a holder of `grant_id` sent, waiting up to
 * timeout_ms (< 0: until one of the ends below). 0 with *value and *status (0: done; < 0: the
 * holder gave up with that errno). Otherwise:
 *   -ETIMEDOUT    nothing within timeout_ms (the grant stays; wait again or revoke)
 *   -ECONNRESET   a holder's connection closed without a notification (died or gave up);
 *                 reported once per such connection
 *   -EKEYEXPIRED  the grant expired (libd_trdma_server_revoke still frees its record)
 *   -ECANCELED    the grant was revoked, or the server stopped, while waiting
 *   -ENOENT       no such grant */
int libd_trdma_server_wait_notify(libd_transport *trans, const char *grant_id, uint64_t *value, int *status,
                                  int timeout_ms);
/* ---- hosting memory elements (since 1.2) --------------------------------------------------
 *
 * A server transport is also the door for a process that hosts memory for others (a host
 * agent's pool, a standalone memory server): elements of its own (zero-filled memory, freed when
 * withdrawn), a capacity over them (the `capacity` key, a size such as 8GiB: add_element past it
 * is -ENOSPC), grants with a chosen id and secret (to honour, after a restart, configurations
 * handed out before it) and a summary of what it serves. Keys of the server transports:
 *   size      bytes of the transport's own element (0: none)
 *   host, port   tcp listener (tcp_server, verbs_server; default 127.0.0.1 and an ephemeral port)
 *   path      unix socket for shm clients (shm_server: required; the others: optional)
 *   capacity  most bytes of elements at once (default: no limit; lent memory does not count)
 *   dev, port_num, gid_index, mw, cm   verbs_server: device selection (see docs/c-api.md) */

/* Adds element `element` of `size` zero-filled bytes to a serving server transport; clients reach
 * it through grants (libd_trdma_server_grant_ex with spec->element). libd_trdma_server_withdraw
 * removes it. -ENOTCONN not serving; -EEXIST name taken; -EINVAL size 0 or a bad name;
 * -ENOSPC past the capacity; -ENOMEM the memory could not be had. */
int libd_trdma_server_add_element(libd_transport *trans, const char *element, uint64_t size);

/* Asks for an element's pages ahead of its writers (since 1.6), as ibv_advise_mr's PREFETCH_WRITE
 * advice does for an on-demand-paging region: a thread of the server's allocates them (zero-filled,
 * as the element's memory always is), a MiB at a time from the start, while the caller goes
 * on; a page already written is left as it is. A large first write into new memory otherwise
 * pays for every page as it goes (2.5-2.8 GB/s against 4.5-4.9 for a rewrite on the VM this was
 * measured on). The pages count against nothing more than the element's size already does; they
 * are the server's from then on, written or not, until the element is withdrawn. Returns at once:
 * 0 asked; -ENOENT no such element; -EOPNOTSUPP lent memory (its pages are the lender's); -EINVAL
 * no name; -EAGAIN no thread could be started; -ENOTCONN not serving. */
int libd_trdma_server_prefetch(libd_transport *trans, const char *element);

typedef struct libd_server_attr {
    uint64_t used_bytes;     /* bytes of the elements added (lent memory is not counted) */
    uint64_t capacity;       /* the capacity key; UINT64_MAX when there is none */
    uint64_t connections;    /* client connections open now */
    int verbs;               /* 1 when RDMA verbs clients are served */
    char verbs_device[256];  /* the device, port and GID served, and the rdma_cm listener's state */
} libd_server_attr;
/* What a serving server transport serves now. -ENOTCONN not serving. */
int libd_trdma_server_query(libd_transport *trans, libd_server_attr *attr);

/* As libd_trdma_server_grant_ex, with the grant's id (letters, digits, '-', '_'; up to 64) and
 * secret (32..256 hex digits) given rather than made: a restarted server honours again the
 * configurations it handed out. -EEXIST the id is in use. */
int libd_trdma_server_grant_as(libd_transport *trans, const libd_grant_spec *spec, const char *grant_id,
                               const char *secret, char *out, size_t cap);

/* 1 when this host has an RDMA device with an active port that verbs_server could serve, else 0. */
int libd_verbs_available(void);

/* The owner's side of libd_op_watch (since 1.2): libd writes to fd (the caller's eventfd) whenever
 * something wait_notify would return happens to grant_id: a notification, a holder lost, the
 * grant's expiry or revocation, the server stopping. Then wait_notify(grant_id, ..., 0) takes it.
 * Several descriptors may watch one grant. unwatch: once it returns no write to fd can come any
 * more. -ENOENT no such grant (revoked already). */
int libd_trdma_server_watch_notify(libd_transport *trans, const char *grant_id, int fd);
int libd_trdma_server_unwatch_notify(libd_transport *trans, const char *grant_id, int fd);
/* Holder side: tells the owner this holder finished (status 0) or gave up (a negative errno),
 * carrying a 64-bit value of the caller's choice. Call it after the transfers it covers have
 * completed. It has no answer: 0 once the frame is handed to the connection, in order behind
 * the transfers. Connects first if the transport is not READY (as a transfer would).
 * -ECONNRESET / -ENOTCONN the owner is gone; -EINVAL status > 0; -EOPNOTSUPP local/fake. */
int libd_trdma_notify(libd_transport *trans, uint64_t value, int status);
/* The holder's last word (since 1.2): as libd_trdma_notify, and the holder is done with the grant
 * — on a shared connection (share,1) the grant is let go of in the same write, so the owner, woken
 * by the word, finds nobody holding it. The transport moves no more data afterwards (terminate it). */
int libd_trdma_notify_last(libd_transport *trans, uint64_t value, int status);
/* A transfer and the holder's word right behind it (since 1.7): as libd_trdma_read_async (write)
 * followed by libd_trdma_notify(trans, value, 0), except that where one connection carries both
 * (tcp) the request and the word leave in one write and reach the owner's server in one read. The
 * owner hears the word once its memory has been served (the server takes a connection's frames in
 * order). On success *op is set, as libd_trdma_read_async sets it; if the transfer started and the
 * word could not be queued, *op is set too and the word's error is returned (the transfer runs).
 * flags: LIBD_WORD_LAST for the holder's last word (the grant let go of in the same write). */
#define LIBD_WORD_LAST 1u  /* the word is the holder's last (libd_trdma_notify_last) */
int libd_trdma_read_async_notify(libd_transport *trans, size_t size, uint64_t raddr, void *buf, uint64_t value,
                                 unsigned flags, libd_op **op);
int libd_trdma_write_async_notify(libd_transport *trans, size_t size, uint64_t raddr, const void *buf,
                                  uint64_t value, unsigned flags, libd_op **op);
/* The holder's last transfer (since 1.7): as libd_trdma_read_async (write), and the holder is done
 * with the grant once it has been answered — on a shared connection (share,1) the grant is let go
 * of right behind the request, in the same write, as libd_trdma_notify_last lets go of it behind
 * the word. The operation completes as any other; the transport moves no more data (terminate it
 * once the operation is over). Errors as libd_trdma_read_async_notify's. */
int libd_trdma_read_async_last(libd_transport *trans, size_t size, uint64_t raddr, void *buf, libd_op **op);
int libd_trdma_write_async_last(libd_transport *trans, size_t size, uint64_t raddr, const void *buf, libd_op **op);

/* An owner that polls for a holder's word drives the server itself (since 1.5), as an application
 * drives UCX's worker with ucp_worker_progress: each call runs the server's loop once, without
 * blocking, on the calling thread, so a holder's requests and word are served there and no thread
 * is woken for them. While a transfer is part way on one of its connections (a large WRITE's payload
 * arriving, a READ's answer not all handed to the kernel) the call runs the loop on until none is,
 * no bytes have moved for 50 µs, 500 µs have passed (lease_us if less), or the lease was released.
 * The call leases the loop for lease_us (from its end): the server's own thread stays parked
 * until the lease lapses or lease_us 0 gives it back (do that before sleeping). Returns 1 when the
 * loop ran here, 0 when it was only asked for (the first call of a lease: call again) or released;
 * -ENOTCONN not serving; -EINVAL lease_us above 1000000. */
int libd_trdma_server_progress(libd_transport *trans, uint32_t lease_us);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* LIBD_H */
