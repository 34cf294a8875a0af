# Included by disagg.pyx: one grant's transfer, set up and started in one call.

cdef enum:
    _EINVAL = 22  # errno.EINVAL on Linux
    _ECANCELED = 125  # errno.ECANCELED on Linux
    _ETIMEDOUT = 110  # errno.ETIMEDOUT on Linux

cdef class GrantTransfer(Operation):
    """One local memory moved to or from the memory of one grant, with one transfer, on a
    transport of its own: an action with one transport, the memory registered, the transfer
    started. What an active scad.connect operation of one descriptor is made of; begin_transfer()
    makes it in one call with the GIL released once, where the general objects (LibdAction,
    LibdTransportRDMA, Operation) take a Python call and a wrapper each.

    It is the operation (its done(), status, wait(), watch(), cancel(), await), with its action
    and transport: notify() to the memory's owner; terminate() lets go of the grant and the
    registration (the transfer's outcome stays readable)."""
    cdef clibd.libd_action *_action
    cdef clibd.libd_transport *_t
    cdef readonly bint told  # the holder's word went with the transfer (begin_transfer's word_when_done)

    def __cinit__(self):
        self._action = NULL
        self._t = NULL

    def __dealloc__(self):
        # The transfer first (libd cancels it if it still runs: once that returns libd touches
        # none of the memory `_keep` holds), then the action; Operation's own finds nothing left.
        if self._op != NULL:
            with nogil:
                clibd.libd_op_free(self._op)
            self._op = NULL
        self._release()

    cdef void _release(self):
        cdef clibd.libd_action *a = self._action
        self._action = NULL
        self._t = NULL
        if a != NULL:
            with nogil:
                clibd.libd_action_free(a)

    cdef clibd.libd_transport *_tr(self) except NULL:
        if self._t == NULL:
            raise ConnectionError(_errno.ESHUTDOWN, "the transfer's transport was terminated")
        return self._t

    def notify(self, uint64_t value, int status=0, bint last=False):
        """The holder's word to the memory's owner (LibdTransportRDMA.notify)."""
        _notify(self._tr(), value, status, last)

    def terminate(self):
        """Lets go of the grant and the registration (the action freed). Idempotent."""
        self._release()


cdef int _grant_transport(const char *aid, const char *durl, size_t size, void **p, clibd.libd_action **a,
                          clibd.libd_transport **t, const char **what) noexcept nogil:
    """What begin_transfer and read_once start with: an action named `aid` (*a; NULL if it could
    not be made), its transport d0 from `durl` (*t), reaching memory, and the caller's memory
    [*p, *p+size) registered on it. 0, or the negative errno of the step that failed (*what
    names it where the general objects' messages would)."""
    cdef int rc = 0
    a[0] = clibd.libd_action_init(aid, 0, NULL)
    if a[0] == NULL:
        return -_EINVAL
    rc = clibd.libd_action_add_transport(a[0], durl)
    if rc != 0:
        return rc
    t[0] = clibd.libd_action_get_transport(a[0], "d0")
    if t[0] == NULL or clibd.libd_transport_kind(t[0]) != clibd.LIBD_KIND_RDMA:
        what[0] = "the durl must name a transport d0 that reaches memory"
        return -_EINVAL
    rc = clibd.libd_trdma_reg(t[0], size, p)
    if rc != 0:
        what[0] = "reg_memory"
    return rc


def begin_transfer(aid, durl, uint64_t address, size_t size, bint write, keep, bint word_with_request=False,
                   uint64_t value=0, bint word_when_done=False, uint64_t raddr=0, bint verdict=True, bint last=False):
    """Starts one transfer between local memory [address, address+size) (`keep` owns it and is
    held as long as the transfer may touch it) and offset `raddr` of the memory a durl's grant opens,
    on a transport of its own (named by the durl, in an action named `aid`), and takes the
    owner's verdict on the grant (LibdTransportRDMA.remote): a refusal is raised here
    (PermissionError), as an owner out of reach is (ConnectionError). verdict=False: not waited
    for (the transfer fails if the owner refuses; its wait says so). word_with_request: the
    holder's word (notify(value, 0)) is queued right behind the request, and over tcp both leave
    in one write (the owner's server tells the owner once its memory has been served). word_when_done: if the transfer
    completed as it started (shm's copies do) and succeeded, the holder's last word
    (notify(value, 0, last=True)) goes at once, with nothing of the caller's in between; `told`
    says whether it went (a word that could not go is left to the caller, who learns why when
    it sends it). last: the transfer is the holder's last (the word, if it goes with the request,
    is its last word): over a shared tcp connection the grant is let go of right behind the
    request, in the same write, so that terminate sends nothing (the transfer still completes;
    nothing more moves on it). Returns the GrantTransfer."""
    if size == 0 or address == 0:
        raise ValueError("begin_transfer: address and size must be non-zero")
    baid, bdurl = _b(aid), _b(durl)
    cdef const char *caid = baid
    cdef const char *cdurl = bdurl
    cdef GrantTransfer g = GrantTransfer.__new__(GrantTransfer)
    cdef clibd.libd_transport *t = NULL
    cdef clibd.libd_op *op = NULL
    cdef void *p = <void *><size_t>address
    cdef uint64_t rsize = 0
    cdef unsigned rights = 0
    cdef int rc = 0
    cdef unsigned flags = 0
    cdef bint made = True
    cdef const char *what = NULL  # what failed, as the general objects' messages name it
    g._keep = keep  # before the transfer starts: the memory outlives it whatever happens next
    with nogil:
        rc = _grant_transport(caid, cdurl, size, &p, &g._action, &t, &what)
        made = g._action != NULL
        if rc == 0:
            if word_with_request:  # the request and the word in one write, where one connection carries both
                flags = clibd.LIBD_WORD_LAST if last else 0
                if write:
                    rc = clibd.libd_trdma_write_async_notify(t, size, raddr, p, value, flags, &op)
                else:
                    rc = clibd.libd_trdma_read_async_notify(t, size, raddr, p, value, flags, &op)
                if rc != 0 and op != NULL:
                    what = "notify"  # the transfer started; its word could not be queued
            elif last:  # the request and the grant's release in one write
                if write:
                    rc = clibd.libd_trdma_write_async_last(t, size, raddr, p, &op)
                else:
                    rc = clibd.libd_trdma_read_async_last(t, size, raddr, p, &op)
                if rc != 0 and op != NULL:
                    what = "let_go"
            elif write:
                rc = clibd.libd_trdma_write_async(t, size, raddr, p, &op)
            else:
                rc = clibd.libd_trdma_read_async(t, size, raddr, p, &op)
        if rc == 0 and verdict:
            what = NULL
            rc = clibd.libd_trdma_remote(t, &rsize, &rights)
        if rc == 0 and word_when_done and clibd.libd_op_poll(op) == 0:
            g.told = clibd.libd_trdma_notify_last(t, value, 0) == 0
    g._t = t
    g._op = op
    if rc < 0:
        # The message is this thread's libd error, read before anything else calls libd.
        if not made:
            err = ValueError(_last_error() or "the action could not be made")
        else:
            err = _error(rc, what.decode() if what != NULL else "")
        g._t = NULL
        if op != NULL:
            with nogil:
                clibd.libd_op_free(op)  # cancelled if it still runs
            g._op = NULL
        g._release()
        raise err
    return g


cdef class TransferSlot:
    """Where read_once shows the transfer it runs, so that another thread can stop it: cancel()
    cancels the one under way (once it returns, libd touches none of its memory) and fails a
    read_once that has not started its transfer yet. For a receive that an abort must reach
    while it waits in libd."""
    cdef PyThread_type_lock _lock  # taken without the GIL: cancel() may come while read_once waits
    cdef clibd.libd_op *_op
    cdef bint _cancelled

    def __cinit__(self):
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError("TransferSlot: no lock")

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)

    @property
    def cancelled(self):
        """Whether cancel() was called."""
        return self._cancelled

    @property
    def running(self):
        """Whether a transfer is under way through it (read_once between its start and its end)."""
        return self._op != NULL

    def cancel(self):
        """Cancels the transfer under way, and any that read_once would start through this slot
        from now on. True if one was under way and is cancelled now."""
        cdef int rc = 0
        with nogil:
            PyThread_acquire_lock(self._lock, WAIT_LOCK)
            self._cancelled = True
            if self._op != NULL:
                rc = clibd.libd_op_cancel(self._op)
            PyThread_release_lock(self._lock)
        return rc == -_ECANCELED


def read_once(aid, durl, uint64_t address, size_t size, uint64_t raddr, double busy_poll_us, double timeout,
              TransferSlot slot not None):
    """One read of `size` bytes at offset `raddr` of the memory a durl's grant opens (transport
    d0, in an action named `aid`) into local memory at `address`, on a transport of its own, from
    start to finish in one call: started with the grant let go of behind the request (as
    begin_transfer(last=True) starts it; the owner's verdict not waited for), polled for up to
    busy_poll_us, then waited for up to `timeout` seconds, and freed. The caller keeps the local
    memory alive (it waits here). Raises what it failed with, as Operation.wait does: TimeoutError
    if it had not finished within `timeout` (it is cancelled then: the memory is not written
    after this returns), CancelledError if `slot` was cancelled. For a receive of one buffer,
    where every Python step costs more than the read's own set-up."""
    if size == 0 or address == 0:
        raise ValueError("read_once: address and size must be non-zero")
    baid, bdurl = _b(aid), _b(durl)
    cdef const char *caid = baid
    cdef const char *cdurl = bdurl
    cdef clibd.libd_action *a = NULL
    cdef clibd.libd_transport *t = NULL
    cdef clibd.libd_op *op = NULL
    cdef void *p = <void *><size_t>address
    cdef int ms = max(0, <int>(min(timeout, 2e6) * 1000))
    cdef int rc = 0
    cdef bint made = True
    cdef const char *what = NULL  # what failed, as begin_transfer's messages name it
    err = None
    with nogil:
        rc = _grant_transport(caid, cdurl, size, &p, &a, &t, &what)
        made = a != NULL
        if rc == 0:
            PyThread_acquire_lock(slot._lock, WAIT_LOCK)
            if slot._cancelled:
                rc = -_ECANCELED
            else:
                rc = clibd.libd_trdma_read_async_last(t, size, raddr, p, &op)
                if rc != 0 and op != NULL:
                    what = "let_go"  # the read started; the grant's release could not be queued
                slot._op = op
            PyThread_release_lock(slot._lock)
    try:
        if rc == 0:
            rc = _poll_op_for(op, busy_poll_us)
            if rc == -EINPROGRESS:
                with nogil:
                    rc = clibd.libd_op_wait(op, ms)
                if rc == -_ETIMEDOUT and clibd.libd_op_poll(op) != -EINPROGRESS:
                    rc = clibd.libd_op_poll(op)  # it finished as the wait ran out: its own outcome
                elif rc == -_ETIMEDOUT:
                    err = TimeoutError(_ETIMEDOUT, f"the read did not finish within {timeout} s and was cancelled")
        if rc == -_ECANCELED and op == NULL:  # the slot was cancelled before the read could start
            err = CancelledError("read_once: its slot was cancelled before the read started")
        elif rc < 0 and err is None:
            # The message is this thread's libd error, read before anything else calls libd.
            err = ValueError(_last_error() or "the action could not be made") if not made else \
                _error(rc, what.decode() if what != NULL else "")
    finally:
        with nogil:
            PyThread_acquire_lock(slot._lock, WAIT_LOCK)
            slot._op = NULL  # no cancel() reaches it from now on
            PyThread_release_lock(slot._lock)
            if op != NULL:
                clibd.libd_op_free(op)  # cancelled if it still runs: the memory is not written after this
            if a != NULL:
                clibd.libd_action_free(a)
    if err is not None:
        raise err
