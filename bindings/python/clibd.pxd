# The C API of libd (libd/include/libd.h), declared for Cython. Every call that can block or take
# a lock is declared nogil, so the binding can release the GIL around it.
from libc.stdint cimport uint32_t, uint64_t

cdef extern from "libd.h" nogil:
    ctypedef struct libd_action:
        pass
    ctypedef struct libd_transport:
        pass
    ctypedef struct libd_op:
        pass

    enum:
        LIBD_STATE_INIT
        LIBD_STATE_INITD
        LIBD_STATE_READY
        LIBD_STATE_ERROR
        LIBD_STATE_TERMINATED
        LIBD_KIND_RDMA
        LIBD_KIND_RDMA_SERVER
        LIBD_RIGHT_READ
        LIBD_RIGHT_WRITE
        LIBD_HIST_BUCKETS
        LIBD_CAP_NOWAIT
        LIBD_CAP_DIRECT
        LIBD_CAP_NOTIFY
        LIBD_CAP_LAZY_CONNECT
        LIBD_CAP_SERVER
        LIBD_WORD_LAST

    const char *libd_strerror(int err)
    const char *libd_last_error()

    libd_action *libd_action_init(const char *aid, int argc, char **argv)
    int libd_action_free(libd_action *action)
    const char *libd_action_id(const libd_action *action)
    int libd_action_add_transport(libd_action *action, const char *durl)
    int libd_action_config_transport(libd_action *action, const char *name, const char *config)
    libd_transport *libd_action_get_transport(libd_action *action, const char *name)
    int libd_action_transport_names(const libd_action *action, char *buf, size_t cap)

    const char *libd_transport_name(const libd_transport *trans)
    const char *libd_transport_impl(const libd_transport *trans)
    int libd_transport_kind(const libd_transport *trans)
    const char *libd_state_name(int state)
    int libd_transport_state(libd_transport *trans)
    int libd_transport_wait_state(libd_transport *trans, unsigned state_mask, int timeout_ms)
    int libd_transport_wait_change(libd_transport *trans, uint64_t *seq, int timeout_ms)
    int libd_transport_init(libd_transport *trans)
    int libd_transport_connect(libd_transport *trans)
    int libd_transport_recover(libd_transport *trans)
    int libd_transport_terminate(libd_transport *trans)
    int libd_transport_error(libd_transport *trans, char *buf, size_t cap)
    int libd_transport_get_message(libd_transport *trans, char *buf, size_t cap, size_t *needed)
    int libd_transport_set(libd_transport *trans, const char *key, const char *value)
    int libd_transport_caps(libd_transport *trans)

    ctypedef struct libd_stats:
        uint64_t read_ops, write_ops
        uint64_t read_bytes, write_bytes
        uint64_t errors
        uint64_t latency_ns_hist[40]
    int libd_transport_busy_ns(libd_transport *trans, uint64_t *ns)
    int libd_transport_stats(libd_transport *trans, libd_stats *out)
    uint64_t libd_stats_percentile_ns(const libd_stats *stats, double p)

    int libd_trdma_reg(libd_transport *trans, size_t size, void **buf)
    ctypedef struct libd_range:
        void *base
        uint64_t size
    int libd_trdma_reg_ranges(libd_transport *trans, const libd_range *ranges, int n)
    int libd_trdma_map(libd_transport *trans, void **addr, uint64_t *size)
    int libd_trdma_remote(libd_transport *trans, uint64_t *size, unsigned *rights)
    int libd_trdma_read(libd_transport *trans, size_t size, uint64_t raddr, void *buf)
    int libd_trdma_write(libd_transport *trans, size_t size, uint64_t raddr, const void *buf)

    int libd_trdma_read_nowait(libd_transport *trans, size_t size, uint64_t raddr, void *buf)
    int libd_trdma_write_nowait(libd_transport *trans, size_t size, uint64_t raddr, const void *buf)

    ctypedef struct libd_iov:
        size_t size
        uint64_t raddr
        void *buf
    int libd_trdma_readv(libd_transport *trans, const libd_iov *iov, int iovcnt)
    int libd_trdma_writev(libd_transport *trans, const libd_iov *iov, int iovcnt)
    int libd_trdma_read_async(libd_transport *trans, size_t size, uint64_t raddr, void *buf, libd_op **op)
    int libd_trdma_write_async(libd_transport *trans, size_t size, uint64_t raddr, const void *buf, libd_op **op)
    int libd_trdma_readv_async(libd_transport *trans, const libd_iov *iov, int iovcnt, libd_op **op)
    int libd_trdma_writev_async(libd_transport *trans, const libd_iov *iov, int iovcnt, libd_op **op)
    int libd_op_poll(libd_op *op)
    int libd_op_wait(libd_op *op, int timeout_ms)
    int libd_op_cancel(libd_op *op)
    int libd_op_free(libd_op *op)
    int libd_op_watch(libd_op *op, int fd)

    int libd_trdma_server_serve(libd_transport *trans)
    int libd_trdma_server_stop(libd_transport *trans)
    int libd_trdma_server_grant(libd_transport *trans, const char *client, uint64_t offset,
                                uint64_t length, unsigned rights, char *out, size_t cap)
    int libd_trdma_server_revoke(libd_transport *trans, const char *grant_id)
    int libd_trdma_server_run(libd_transport *trans)

    int libd_trdma_server_expose(libd_transport *trans, const char *element, void *base, uint64_t size)
    int libd_trdma_server_expose_ranges(libd_transport *trans, const char *element, const libd_range *ranges, int n)
    int libd_trdma_server_withdraw(libd_transport *trans, const char *element)
    ctypedef struct libd_grant_spec:
        const char *element
        const char *client
        uint64_t offset
        uint64_t length
        unsigned rights
        uint64_t ttl_ms
    int libd_trdma_server_grant_ex(libd_transport *trans, const libd_grant_spec *spec, char *out, size_t cap)
    int libd_trdma_server_wait_notify(libd_transport *trans, const char *grant_id, uint64_t *value, int *status,
                                      int timeout_ms)
    int libd_trdma_server_watch_notify(libd_transport *trans, const char *grant_id, int fd)
    int libd_trdma_server_unwatch_notify(libd_transport *trans, const char *grant_id, int fd)
    int libd_trdma_server_progress(libd_transport *trans, uint32_t lease_us)
    int libd_trdma_server_prefetch(libd_transport *trans, const char *element)
    int libd_trdma_notify(libd_transport *trans, uint64_t value, int status)
    int libd_trdma_notify_last(libd_transport *trans, uint64_t value, int status)
    int libd_trdma_read_async_notify(libd_transport *trans, size_t size, uint64_t raddr, void *buf, uint64_t value,
                                     unsigned flags, libd_op **op)
    int libd_trdma_write_async_notify(libd_transport *trans, size_t size, uint64_t raddr, const void *buf,
                                      uint64_t value, unsigned flags, libd_op **op)
    int libd_trdma_read_async_last(libd_transport *trans, size_t size, uint64_t raddr, void *buf, libd_op **op)
    int libd_trdma_write_async_last(libd_transport *trans, size_t size, uint64_t raddr, const void *buf,
                                    libd_op **op)
