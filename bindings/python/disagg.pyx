# cython: language_level=3, boundscheck=False, wraparound=False
"""disagg — the Python face of libd, compatible with Scad's binding.

    from disagg import LibdAction
    action = LibdAction('my-action')
    action.add_transport('mem1;tcp')
    action.config_transport('mem1', config)          # relayed by the control plane
    t = action.get_transport('mem1', 'rdma')
    t.reg(1 << 20)                                   # t.buf: zero-copy, writable memoryview
    t.buf[0:5] = b'hello'
    t.write(5, 0, 0)                                 # (size, remote addr, local offset)
    t.read(5, 0, 64)

Errors are exceptions, never integer codes: MemoryError (no buffer registered), ValueError (out of
range, bad argument), KeyError (no such transport), TimeoutError (deadline), ConnectionError (peer
gone: the transport is in ERROR until recover()), PermissionError (the grant does not allow it).
Every call that waits releases the GIL; threads may share a transport.
"""
import errno as _errno
import mmap
import os
import time
from concurrent.futures import CancelledError

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer
from posix.mman cimport munmap
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from libc.errno cimport EINPROGRESS
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock, PyThread_acquire_lock, PyThread_release_lock, WAIT_LOCK
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport strlen, strncmp
from libcpp cimport bool as cbool
from libcpp.vector cimport vector

cimport clibd

__all__ = ["LibdAction", "LibdTransport", "LibdTransportRDMA", "LibdTransportRDMAServer", "Operation",
           "CancelledError", "STATES", "buffer_info", "scan_connect_record", "scan_buffer_record",
           "GrantTransfer", "begin_transfer"]


def buffer_info(obj):
    """(address, bytes, readonly) of a C-contiguous buffer-protocol object (a numpy array, bytes,
    bytearray, memoryview...), without copying: what a registration needs, read in one call.
    BufferError if the memory is not C-contiguous."""
    cdef Py_buffer view
    PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS)
    try:
        return <size_t>view.buf, view.len, bool(view.readonly)
    finally:
        PyBuffer_Release(&view)

# ---- the records peers parse before every operation (record_scan.h) ------------------------
cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object)
    const char *PyUnicode_AsUTF8AndSize(object, Py_ssize_t *) except NULL
    object PyUnicode_DecodeASCII(const char *, Py_ssize_t, const char *)
    ctypedef struct PyObject
    double PyOS_string_to_double(const char *, char **, PyObject *) except? -1.0

cdef extern from "record_scan.h" namespace "scad::record" nogil:
    cdef struct Span:
        const char *p
        size_t n
    cdef cppclass ConnectDescriptor:
        int64_t size
        Span device
        cbool has_grant
        Span grant, secret
    cdef cppclass ConnectRecord:
        int64_t version, kind
        Span key, owner, hostname, host
        int64_t port
        Span path
        cbool verbs
        Span expires_at
        vector[ConnectDescriptor] descriptors
    cdef cppclass BufferRecord:
        int64_t version
        Span owner, hostname, host
        int64_t port
        Span path
        cbool verbs
        Span grant, secret
        int64_t offset, size
        cbool whole, has_ranges
        vector[int64_t] ranges
    cbool scan_connect(const char *, size_t, ConnectRecord *)
    cbool scan_buffer(const char *, size_t, BufferRecord *)


cdef const char *_ascii_text(object text, Py_ssize_t *n) except? NULL:
    """The characters of a str that is all ASCII (CPython keeps them as one byte each), or NULL
    for anything else: a record the reader leaves to json."""
    if type(text) is not str or not PyUnicode_IS_COMPACT_ASCII(text):
        return NULL
    return PyUnicode_AsUTF8AndSize(text, n)


cdef inline object _ascii(Span s):
    return PyUnicode_DecodeASCII(s.p, <Py_ssize_t>s.n, NULL)


cdef object _json_number(Span s):
    """A JSON number as float(json.loads(s)) gives it (an integer is exact, then rounded once)."""
    cdef char *end = NULL
    cdef double v = PyOS_string_to_double(s.p, &end, NULL)  # past double's range: +-inf, as float() gives
    if end != s.p + s.n:
        return None
    if v == 0.0:
        return 0.0 if all(c in b"-0" for c in s.p[:s.n]) else v  # json's int -0 is 0, float("-0.0") is -0.0
    return v


def scan_connect_record(text):
    """scad.connect's record as RdmaMetadata.to_json() writes it, read in one pass: (kind, key, owner,
    hostname, host, port, path, verbs, expires_at, ((size, grant, secret, device), ...)), every
    field checked as RdmaMetadata.from_dict checks it; None for any other text (the caller parses
    it with json then, which words what is wrong)."""
    cdef Py_ssize_t n
    cdef const char *s = _ascii_text(text, &n)
    cdef ConnectRecord r
    if s == NULL or not scan_connect(s, <size_t>n, &r):
        return None
    expires_at = _json_number(r.expires_at)
    if expires_at is None:
        return None
    descs = []
    grant = secret = None
    cdef size_t i
    for i in range(r.descriptors.size()):
        if r.descriptors[i].has_grant:
            grant, secret = _ascii(r.descriptors[i].grant), _ascii(r.descriptors[i].secret)
        descs.append((r.descriptors[i].size, grant, secret, _ascii(r.descriptors[i].device)))
    return (r.kind, _ascii(r.key), _ascii(r.owner), _ascii(r.hostname), _ascii(r.host), r.port, _ascii(r.path),
            bool(r.verbs), expires_at, descs)


def scan_buffer_record(text):
    """scad.rdma's record as RdmaBuffer.to_json() writes it, read in one pass: (owner, hostname, host,
    port, path, verbs, grant, secret, offset, size, whole, ranges or None), every field but the
    ranges checked as RdmaBuffer.from_json checks it (the ranges are the caller's to check); None
    for any other text."""
    cdef Py_ssize_t n
    cdef const char *s = _ascii_text(text, &n)
    cdef BufferRecord r
    if s == NULL or not scan_buffer(s, <size_t>n, &r):
        return None
    ranges = [r.ranges[i] for i in range(r.ranges.size())] if r.has_ranges else None
    return (_ascii(r.owner), _ascii(r.hostname), _ascii(r.host), r.port, _ascii(r.path), bool(r.verbs),
            _ascii(r.grant), _ascii(r.secret), r.offset, r.size, bool(r.whole), ranges)


STATES = {clibd.LIBD_STATE_INIT: "INIT", clibd.LIBD_STATE_INITD: "INITD", clibd.LIBD_STATE_READY: "READY",
          clibd.LIBD_STATE_ERROR: "ERROR", clibd.LIBD_STATE_TERMINATED: "TERMINATED"}
_STATE_BITS = {v: k for k, v in STATES.items()}
_CAP_NAMES = ((clibd.LIBD_CAP_NOWAIT, "nowait"), (clibd.LIBD_CAP_DIRECT, "direct"), (clibd.LIBD_CAP_NOTIFY, "notify"),
              (clibd.LIBD_CAP_LAZY_CONNECT, "lazy_connect"), (clibd.LIBD_CAP_SERVER, "server"))

_CONNECTION_ERRNOS = {_errno.ECONNRESET, _errno.ENOTCONN, _errno.ECONNREFUSED, _errno.ECONNABORTED,
                      _errno.ESHUTDOWN, _errno.EPIPE, _errno.EHOSTUNREACH}


cdef enum:
    _EAGAIN = 11            # errno.EAGAIN on Linux
    _NOWAIT_MAX = 16384     # copies up to this size may run without releasing the GIL


cdef str _last_error():
    return clibd.libd_last_error().decode("utf-8", "replace")


cdef object _error(int rc, str what=""):
    """The exception for a negative errno from libd, with libd's message for this thread."""
    cdef int e = -rc
    msg = _last_error() or clibd.libd_strerror(rc).decode()
    if what:
        msg = f"{what}: {msg}"
    if e == _errno.ENOBUFS or e == _errno.ENOMEM:
        exc = MemoryError(msg)
    elif e in (_errno.ERANGE, _errno.EINVAL, _errno.EEXIST, _errno.E2BIG, _errno.EBUSY):
        exc = ValueError(msg)
    elif e == _errno.ENOENT:
        exc = KeyError(msg)
    elif e == _errno.ECANCELED:
        exc = CancelledError(msg)
    elif e == _errno.EOPNOTSUPP:
        exc = NotImplementedError(msg)
    elif e == _errno.ETIMEDOUT:
        return TimeoutError(e, msg)
    elif e in _CONNECTION_ERRNOS:
        return ConnectionError(e, msg)
    elif e == _errno.EACCES or e == _errno.EPERM:
        return PermissionError(e, msg)
    else:
        return OSError(e, msg)
    exc.errno = e
    return exc


cdef inline int _check(int rc, str what="") except -1:
    if rc < 0:
        raise _error(rc, what)
    return rc


cdef bytes _b(s):
    if isinstance(s, bytes):
        return s
    return str(s).encode("utf-8")


cdef void _notify(clibd.libd_transport *t, uint64_t value, int status, bint last) except *:
    """The holder's word to the memory's owner (LibdTransportRDMA.notify, GrantTransfer.notify)."""
    cdef int rc
    with nogil:
        if last:
            rc = clibd.libd_trdma_notify_last(t, value, status)
        else:
            rc = clibd.libd_trdma_notify(t, value, status)
    _check(rc, "notify")


cdef void _grant_spec(clibd.libd_grant_spec *spec, const char *element, const char *client, uint64_t offset,
                      uint64_t length, rights, ttl) except *:
    """A grant's spec: rights as "r", "w" or "rw", ttl in seconds (None: until revoked)."""
    spec.element = element
    spec.client = client
    spec.offset = offset
    spec.length = length
    spec.rights = (1 if "r" in rights else 0) | (2 if "w" in rights else 0)
    spec.ttl_ms = 0 if ttl is None else max(1, int(ttl * 1000))


cdef tuple _key_of(const char *config):
    """(grant id, secret) of the configuration libd's server hands out for a grant, which ends
    "grant,ID;secret,HEX" (the secret is hex and the id names no ';'): read from the end."""
    cdef Py_ssize_t n = strlen(config)
    cdef Py_ssize_t s = n - 1
    while s >= 0 and config[s] != b';':
        s -= 1
    cdef Py_ssize_t g = s - 1
    while g >= 0 and config[g] != b';':
        g -= 1
    # config[g+1:s] is "grant,ID", config[s+1:] "secret,HEX"
    if s < 0 or s - (g + 1) <= 6 or n - (s + 1) <= 7 or strncmp(config + g + 1, "grant,", 6) != 0 \
            or strncmp(config + s + 1, "secret,", 7) != 0:
        raise RuntimeError("libd handed out a grant configuration that does not end in its grant and secret")
    return config[g + 7:s].decode("ascii"), config[s + 8:n].decode("ascii")


cdef class LibdAction:
    """One compute element's action object: an id, options, and named transports.

    LibdAction(aid, **options) — options reach libd as Scad's '+key value' arguments (for example
    timeout_ms=5000). Scad's LibdAction(cv, aid, **options) is accepted too.
    """
    cdef clibd.libd_action *_c
    cdef dict _wrappers
    cdef public list profile_points

    def __cinit__(self, *args, **options):
        self._c = NULL

    def __init__(self, *args, **options):
        if len(args) == 2:      # Scad: LibdAction(cv, aid, ...)
            aid = args[1]
        elif len(args) == 1:
            aid = args[0]
        else:
            raise TypeError("LibdAction(aid, **options)")
        argv_list = []
        for k, v in options.items():
            argv_list.append(_b("+" + k))
            argv_list.append(_b(",".join(map(str, v)) if isinstance(v, (list, tuple)) else v))
        cdef int argc = len(argv_list)
        cdef char **argv = <char **>malloc((argc + 1) * sizeof(char *))
        if argv == NULL:
            raise MemoryError()
        for i in range(argc):
            argv[i] = argv_list[i]
        baid = _b(aid)
        self._c = clibd.libd_action_init(baid, argc, argv)
        free(argv)
        if self._c == NULL:
            raise ValueError(_last_error())
        self._wrappers = {}
        self.profile_points = []

    def __dealloc__(self):
        if self._c != NULL:
            with nogil:
                clibd.libd_action_free(self._c)
            self._c = NULL

    cdef clibd.libd_action *_action(self) except NULL:
        if self._c == NULL:
            raise ConnectionError(_errno.ESHUTDOWN, "the action was terminated")
        return self._c

    @property
    def id(self):
        return clibd.libd_action_id(self._action()).decode()

    def add_transport(self, durl):
        """Adds a transport from a durl 'NAME;IMPL;KEY,VALUE;...'. ValueError names the position."""
        bdurl = _b(durl)
        cdef clibd.libd_action *a = self._action()
        cdef const char *c = bdurl
        cdef int rc
        with nogil:
            rc = clibd.libd_action_add_transport(a, c)
        _check(rc)

    def config_transport(self, name, config):
        """Merges 'KEY,VALUE;...' into a transport's configuration (what the runtime relays)."""
        bname, bconfig = _b(name), _b(config)
        cdef clibd.libd_action *a = self._action()
        cdef const char *n = bname
        cdef const char *c = bconfig
        cdef int rc
        with nogil:
            rc = clibd.libd_action_config_transport(a, n, c)
        _check(rc)

    def transport_names(self):
        cdef char buf[8192]
        _check(clibd.libd_action_transport_names(self._action(), buf, sizeof(buf)))
        names = buf.decode()
        return names.split(",") if names else []

    def get_transport(self, name, ttype="rdma"):
        """The transport `name` as an 'rdma' (client) or 'rdma_server' (memory element) object.

        Returns at once; the first operation waits (up to the deadline) for the transport to be
        configured. KeyError names the transports that exist.
        """
        if ttype not in ("rdma", "rdma_server"):
            raise KeyError(f"unknown transport type {ttype!r} (known: 'rdma', 'rdma_server')")
        w = self._wrappers.get(name)
        if w is None:
            bname = _b(name)
            t = clibd.libd_action_get_transport(self._action(), bname)
            if t == NULL:
                raise KeyError(_last_error())
            kind = clibd.libd_transport_kind(t)
            cls = LibdTransportRDMA if kind == clibd.LIBD_KIND_RDMA else LibdTransportRDMAServer
            w = cls.__new__(cls)
            (<LibdTransport>w)._bind(self, name)
            self._wrappers[name] = w
        want = LibdTransportRDMA if ttype == "rdma" else LibdTransportRDMAServer
        if not isinstance(w, want):
            kind = "rdma" if isinstance(w, LibdTransportRDMA) else "rdma_server"
            raise KeyError(f"transport {name!r} is of type {kind!r}, not {ttype!r}")
        return w

    def terminate(self):
        """Terminates every transport and frees the action. Idempotent."""
        cdef clibd.libd_action *a = self._c
        self._c = NULL
        for w in self._wrappers.values():
            (<LibdTransport>w)._t = NULL
        if a != NULL:
            with nogil:
                clibd.libd_action_free(a)

    def profile(self, point):
        """Scad's profiling hook: records (point, monotonic ns)."""
        self.profile_points.append((point, time.monotonic_ns()))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.terminate()
        return False


cdef class LibdTransport:
    """What every transport has: a name, a state machine, counters."""
    cdef clibd.libd_transport *_t
    cdef LibdAction _action_obj
    cdef public str name

    cdef _bind(self, LibdAction action, str name):
        self._action_obj = action
        self.name = name
        self._t = clibd.libd_action_get_transport(action._c, _b(name))

    cdef clibd.libd_transport *_tr(self) except NULL:
        if self._t == NULL:
            raise ConnectionError(_errno.ESHUTDOWN, f"transport {self.name!r} was terminated")
        return self._t

    @property
    def action(self):
        return self._action_obj

    @property
    def impl(self):
        return clibd.libd_transport_impl(self._tr()).decode()

    @property
    def caps(self):
        """What the transport can do: a frozenset of 'nowait', 'direct', 'notify', 'lazy_connect', 'server'."""
        cdef int bits = _check(clibd.libd_transport_caps(self._tr()), "caps")
        return frozenset(name for bit, name in _CAP_NAMES if bits & bit)

    @property
    def state(self):
        """'INIT', 'INITD', 'READY', 'ERROR' or 'TERMINATED'."""
        if self._t == NULL:
            return "TERMINATED"
        return STATES[clibd.libd_transport_state(self._t)]

    def wait_state(self, states, timeout=None):
        """Waits until the state is one of `states` (a name or names); returns it."""
        if isinstance(states, str):
            states = [states]
        cdef unsigned mask = 0
        for s in states:
            mask |= _STATE_BITS[s]
        cdef int ms = -1 if timeout is None else int(timeout * 1000)
        cdef clibd.libd_transport *t = self._tr()
        cdef int rc
        with nogil:
            rc = clibd.libd_transport_wait_state(t, mask, ms)
        _check(rc)
        return STATES[rc]

    def wait_change(self, uint64_t seq=0, timeout=None):
        """Waits for a state change after `seq`; returns (new_seq, state). Never misses one."""
        cdef int ms = -1 if timeout is None else int(timeout * 1000)
        cdef clibd.libd_transport *t = self._tr()
        cdef int rc
        with nogil:
            rc = clibd.libd_transport_wait_change(t, &seq, ms)
        _check(rc)
        return seq, STATES[rc]

    @property
    def error(self):
        """Why the transport is in ERROR ('' if it is not)."""
        cdef char buf[1024]
        if self._t == NULL:
            return ""
        if clibd.libd_transport_error(self._t, buf, sizeof(buf)) < 0:
            return ""
        return buf.decode("utf-8", "replace")

    def connect(self):
        cdef clibd.libd_transport *t = self._tr()
        cdef int rc
        with nogil:
            rc = clibd.libd_transport_connect(t)
        _check(rc)

    def recover(self):
        """ERROR -> READY: reconnects. ConnectionError while the peer is still gone."""
        cdef clibd.libd_transport *t = self._tr()
        cdef int rc
        with nogil:
            rc = clibd.libd_transport_recover(t)
        _check(rc)

    def terminate(self):
        cdef clibd.libd_transport *t = self._t
        if t == NULL:
            return
        with nogil:
            clibd.libd_transport_terminate(t)

    def get_msg(self):
        """The out-of-band message (Scad's get_msg): (length, text); (0, '') if none yet."""
        cdef size_t needed = 0
        cdef char small[1]
        cdef clibd.libd_transport *t = self._tr()
        rc = clibd.libd_transport_get_message(t, small, 0, &needed)
        if rc == -_errno.ENODATA:
            return 0, ""
        cdef char *buf = <char *>malloc(needed)
        try:
            rc = clibd.libd_transport_get_message(t, buf, needed, NULL)
            _check(rc)
            return rc, buf[:rc].decode()
        finally:
            free(buf)

    @property
    def message(self):
        return self.get_msg()[1]

    def set(self, key, value):
        """Transport-specific knobs (for example the fake transport's faults)."""
        _check(clibd.libd_transport_set(self._tr(), _b(key), _b(value)))

    def stats(self):
        """Counters: ops, bytes, errors, latency percentiles (ns) and the time operations took
        (busy_ns: exact while every operation is timed, then estimated from the timed sample)."""
        cdef clibd.libd_stats s
        cdef uint64_t busy = 0
        _check(clibd.libd_transport_stats(self._tr(), &s))
        _check(clibd.libd_transport_busy_ns(self._tr(), &busy))
        return {"read_ops": s.read_ops, "write_ops": s.write_ops, "read_bytes": s.read_bytes,
                "write_bytes": s.write_bytes, "errors": s.errors,
                "latency_p50_ns": clibd.libd_stats_percentile_ns(&s, 0.5),
                "latency_p99_ns": clibd.libd_stats_percentile_ns(&s, 0.99), "busy_ns": busy}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.terminate()
        return False

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r} {self.state}>"


cdef clibd.libd_range *_range_list(ranges, what) except NULL:
    """libd's list of ranges for [(address, size), ...]: the caller frees it."""
    cdef Py_ssize_t n = len(ranges)
    if n == 0:
        raise ValueError(f"{what}: at least one (address, size) range")
    cdef clibd.libd_range *r = <clibd.libd_range *>malloc(n * sizeof(clibd.libd_range))
    if r == NULL:
        raise MemoryError()
    try:
        for i, (address, size) in enumerate(ranges):
            r[i].base = <void *><size_t>address
            r[i].size = size
    except BaseException:
        free(r)
        raise
    return r


cdef class Mapping:
    """Memory libd mapped into this process (LibdTransportRDMA.map): a buffer to read (and write,
    unless read-only) in place, e.g. numpy.frombuffer(m). Unmapped once it and every view of it
    are gone."""
    cdef char *_addr
    cdef Py_ssize_t _size
    cdef readonly bint readonly

    def __init__(self):
        raise TypeError("a Mapping comes from LibdTransportRDMA.map()")

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, self._addr, self._size, self.readonly, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __len__(self):
        return self._size

    def __dealloc__(self):
        if self._addr != NULL:
            munmap(self._addr, self._size)

    def __repr__(self):
        return f"<Mapping {self._size} bytes{' read-only' if self.readonly else ''}>"


cdef class LibdTransportRDMA(LibdTransport):
    """One-sided access to a memory element: reg(), then read()/write() and their variants."""
    cdef char *_base
    cdef size_t _size
    cdef int _nowait                # from caps, read once: 1 transfers are copies in this thread, 2 not, 0 not asked yet
    cdef bint _ranged               # reg_ranges: entries name their local bytes by address
    cdef unsigned char[::1] _view   # holds the buffer export: the memory outlives any terminate
    cdef object _owner
    cdef public object buf

    def reg(self, size_t size, LibdTransportRDMA other=None):
        """Registers a local buffer of `size` bytes (or shares `other`'s). Sets self.buf."""
        cdef clibd.libd_transport *t = self._tr()
        if size == 0:
            raise ValueError("reg: size must be > 0")
        if other is not None:
            if other._base == NULL:
                raise MemoryError(f"transport {other.name!r} has no registered buffer to share")
            if size > other._size:
                raise ValueError(f"reg: {size} bytes is larger than {other.name!r}'s buffer of {other._size}")
            owner = other._owner
        else:
            # Python owns the memory (an anonymous mapping: page-aligned, zeroed), so a memoryview
            # kept after terminate() stays valid; libd only registers it.
            # Private, not shared: anonymous shared memory is shmem, which gets no transparent huge
            # pages (measured: 25% less bandwidth at 16 MiB than the C API's buffers).
            owner = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        cdef unsigned char[::1] view = owner
        cdef void *p = <void *>&view[0]
        cdef int rc
        with nogil:
            rc = clibd.libd_trdma_reg(t, size, &p)
        _check(rc, "reg")
        self._owner = owner
        self._view = view
        self._base = <char *>&view[0]
        self._size = size
        self._ranged = False
        self.buf = memoryview(owner)[:size]

    def reg_memory(self, uint64_t address, size_t size, keep=None):
        """Registers the caller's own memory [address, address+size) in place: transfers read and
        write it directly, nothing is copied. `keep` (the object owning the memory) is held as
        long as the registration, so the memory outlives every operation on it. self.buf is None:
        the caller already has its memory."""
        cdef clibd.libd_transport *t = self._tr()
        if size == 0 or address == 0:
            raise ValueError("reg_memory: address and size must be non-zero")
        cdef void *p = <void *><size_t>address
        cdef int rc
        with nogil:
            rc = clibd.libd_trdma_reg(t, size, &p)
        _check(rc, "reg_memory")
        self._owner = keep
        self._view = None
        self._base = <char *><size_t>address
        self._size = size
        self._ranged = False
        self.buf = None

    def reg_ranges(self, ranges, keep=None):
        """Registers several buffers of the caller at once, in place: `ranges` is a list of
        (address, size). An entry of readv/writev (and their async forms) then names its local
        bytes by address, (size, remote_offset, address), which must lie inside one of them (libd
        checks). `keep` is held as long as the registration. self.buf is None."""
        cdef clibd.libd_transport *t = self._tr()
        cdef int n = len(ranges)
        cdef clibd.libd_range *r = _range_list(ranges, "reg_ranges")
        cdef int rc
        try:
            with nogil:
                rc = clibd.libd_trdma_reg_ranges(t, r, n)
        finally:
            free(r)
        _check(rc, "reg_ranges")
        self._owner = keep
        self._view = None
        self._base = <char *><size_t>ranges[0][0]
        self._size = ranges[0][1]
        self._ranged = True
        self.buf = None

    def map(self):
        """The memory this transport reaches, mapped into this process: a Mapping (a buffer of
        the whole element, read-only under a read-only grant) that sees every later write to the
        element. shm over a memory element only (as UCX's ucp_rkey_ptr on shared memory):
        NotImplementedError (libd's EOPNOTSUPP) on transports that move bytes on request,
        PermissionError under a write-only grant."""
        cdef clibd.libd_transport *t = self._tr()
        cdef void *addr = NULL
        cdef uint64_t size = 0
        cdef unsigned rights = 0
        cdef int rc
        with nogil:
            rc = clibd.libd_trdma_map(t, &addr, &size)
        _check(rc, "map")
        cdef Mapping m = Mapping.__new__(Mapping)
        m._addr = <char *>addr
        m._size = size
        m.readonly = True
        if clibd.libd_trdma_remote(t, &size, &rights) == 0:
            m.readonly = not (rights & 2)
        return m

    def notify(self, uint64_t value, int status=0, bint last=False):
        """Tells the memory's owner this holder finished (status 0) or gave up (a negative errno),
        with a 64-bit value. Call it once the transfers it covers have completed. last: the holder
        is done with the grant (a shared connection lets go of it in the same write; terminate the
        transport after)."""
        _notify(self._tr(), value, status, last)

    @property
    def size(self):
        return self._size

    @property
    def array(self):
        """The local buffer as a numpy uint8 array (zero copy); needs numpy."""
        import numpy
        if self._base == NULL:
            raise MemoryError(f"transport {self.name!r}: no local buffer registered; call reg() first")
        return numpy.frombuffer(self.buf, dtype=numpy.uint8)

    cdef inline char *_local(self, size_t size, size_t offset) except NULL:
        if self._ranged:  # several registered buffers: `offset` is the address (libd checks it)
            if offset == 0:
                raise ValueError(f"transport {self.name!r}: with several registered buffers, name the local bytes by address")
            return <char *>offset
        if self._base == NULL:
            raise MemoryError(f"transport {self.name!r}: no local buffer registered; call reg() first")
        if offset > self._size or size > self._size - offset:
            raise ValueError(f"transport {self.name!r}: local range [{offset}, +{size}) is outside "
                             f"the registered buffer of {self._size} bytes")
        return self._base + offset

    cdef inline bint _copies_inline(self, clibd.libd_transport *t):
        cdef int bits
        if self._nowait == 0:
            bits = clibd.libd_transport_caps(t)
            if bits < 0:
                return True  # not known: let libd say
            self._nowait = 1 if bits & clibd.LIBD_CAP_NOWAIT else 2
        return self._nowait == 1

    def read(self, size_t size, uint64_t addr, size_t offset=0):
        """Remote [addr, addr+size) -> local buffer at offset. Blocks with the GIL released."""
        cdef char *p = self._local(size, offset)
        cdef clibd.libd_transport *t = self._tr()
        cdef int rc = -_EAGAIN
        # A small copy that cannot wait costs less than handing the GIL over and back; libd
        # says -EAGAIN if it would have to wait, and then the GIL is released. A transport whose
        # transfers are never such copies (its caps) is not asked.
        if size <= _NOWAIT_MAX and self._copies_inline(t):
            rc = clibd.libd_trdma_read_nowait(t, size, addr, p)
        if rc == -_EAGAIN:
            with nogil:
                rc = clibd.libd_trdma_read(t, size, addr, p)
        if rc < 0:
            raise _error(rc)

    def write(self, size_t size, uint64_t addr, size_t offset=0):
        """Local buffer at offset -> remote [addr, addr+size). Blocks with the GIL released."""
        cdef char *p = self._local(size, offset)
        cdef clibd.libd_transport *t = self._tr()
        cdef int rc = -_EAGAIN
        if size <= _NOWAIT_MAX and self._copies_inline(t):
            rc = clibd.libd_trdma_write_nowait(t, size, addr, p)
        if rc == -_EAGAIN:
            with nogil:
                rc = clibd.libd_trdma_write(t, size, addr, p)
        if rc < 0:
            raise _error(rc)

    def read_async(self, size_t size, uint64_t addr, size_t offset=0):
        """Starts a read; returns an Operation (wait(), done(), status, cancel(), await)."""
        return self._start(False, [(size, addr, offset)])

    def write_async(self, size_t size, uint64_t addr, size_t offset=0):
        return self._start(True, [(size, addr, offset)])

    def readv(self, entries):
        """A batch of (size, addr, offset) reads; one bad entry refuses the whole batch."""
        self._start(False, entries).wait()

    def writev(self, entries):
        self._start(True, entries).wait()

    def readv_async(self, entries):
        return self._start(False, entries)

    def writev_async(self, entries):
        return self._start(True, entries)

    cdef Operation _start(self, bint is_write, entries):
        cdef int n = len(entries)
        if n == 0:
            raise ValueError("a batch needs at least one (size, addr, offset) entry")
        cdef clibd.libd_iov *iov = <clibd.libd_iov *>malloc(n * sizeof(clibd.libd_iov))
        if iov == NULL:
            raise MemoryError()
        cdef clibd.libd_op *op = NULL
        cdef clibd.libd_transport *t
        cdef int rc
        cdef size_t size, offset
        try:
            for i, entry in enumerate(entries):
                if len(entry) == 2:
                    size, addr = entry
                    offset = 0
                else:
                    size, addr, offset = entry
                iov[i].buf = self._local(size, offset)
                iov[i].size = size
                iov[i].raddr = addr
            t = self._tr()
            with nogil:
                if is_write:
                    rc = clibd.libd_trdma_writev_async(t, iov, n, &op)
                else:
                    rc = clibd.libd_trdma_readv_async(t, iov, n, &op)
            _check(rc)
        finally:
            free(iov)
        cdef Operation o = Operation.__new__(Operation)
        o._op = op
        o._keep = (self, self._owner)   # the buffer lives while the operation may touch it
        return o

    def remote(self):
        """(size, rights) of the remote region this transport may reach ('r', 'w' or 'rw')."""
        cdef uint64_t size = 0
        cdef unsigned rights = 0
        cdef clibd.libd_transport *t = self._tr()
        cdef int rc
        with nogil:
            rc = clibd.libd_trdma_remote(t, &size, &rights)
        _check(rc)
        return size, ("r" if rights & 1 else "") + ("w" if rights & 2 else "")


cdef int _poll_op_for(clibd.libd_op *op, double busy_poll_us) except? -1000000:
    """Operation.poll_for's loop: libd_op_poll's last answer (-EINPROGRESS: still running)."""
    cdef int rc
    cdef timespec now
    cdef double t, end, chunk_end
    with nogil:
        rc = clibd.libd_op_poll(op)
    if rc != -EINPROGRESS or busy_poll_us <= 0:
        return rc
    clock_gettime(CLOCK_MONOTONIC, &now)
    end = now.tv_sec * 1e6 + now.tv_nsec * 1e-3 + busy_poll_us
    while True:
        with nogil:
            clock_gettime(CLOCK_MONOTONIC, &now)
            t = now.tv_sec * 1e6 + now.tv_nsec * 1e-3
            chunk_end = t + 1000.0 if t + 1000.0 < end else end
            while t < chunk_end:
                sched_yield()
                rc = clibd.libd_op_poll(op)
                if rc != -EINPROGRESS:
                    break
                clock_gettime(CLOCK_MONOTONIC, &now)
                t = now.tv_sec * 1e6 + now.tv_nsec * 1e-3
        if rc != -EINPROGRESS or t >= end:
            return rc
        PyErr_CheckSignals()  # (raises out of here: Ctrl-C ends a long poll)


cdef class Operation:
    """An operation in flight. wait(timeout) raises what the operation failed with; `await op`
    works in asyncio; cancel() returns once libd no longer touches the buffers."""
    cdef clibd.libd_op *_op
    cdef object _keep

    def __dealloc__(self):
        if self._op != NULL:
            with nogil:
                clibd.libd_op_free(self._op)

    @property
    def status(self):
        """0 when done, -EINPROGRESS while running, a negative errno if it failed."""
        cdef int rc
        with nogil:  # a look may run the client loop's work (libd_op_poll)
            rc = clibd.libd_op_poll(self._op)
        return rc

    def done(self):
        cdef int rc
        with nogil:
            rc = clibd.libd_op_poll(self._op)
        return rc != -_errno.EINPROGRESS

    def poll_for(self, double busy_poll_us):
        """Looks at the operation again and again, with the GIL released, for up to busy_poll_us
        microseconds, yielding the CPU between looks (each look may read answers in, as done()'s
        does): whether it is done. For a waiter that trades a core for latency, as busy-polling
        RDMA stacks do; scad._waiter.poll_until does the same with any callable, one Python call
        per look. Signals are looked at every millisecond (Ctrl-C ends a long poll)."""
        return _poll_op_for(self._op, busy_poll_us) != -EINPROGRESS

    def wait(self, timeout=None):
        """Waits; TimeoutError if `timeout` (seconds) passes first (the operation goes on)."""
        cdef int ms = -1 if timeout is None else max(0, int(timeout * 1000))
        cdef int rc
        with nogil:
            rc = clibd.libd_op_wait(self._op, ms)
        if rc == -_errno.ETIMEDOUT and clibd.libd_op_poll(self._op) == -_errno.EINPROGRESS:
            raise TimeoutError(_errno.ETIMEDOUT, "wait timed out; the operation goes on")
        if rc < 0:
            raise _error(rc)

    def cancel(self):
        """Cancels; True if it was cancelled, False if it had already finished."""
        cdef int rc
        with nogil:
            rc = clibd.libd_op_cancel(self._op)
        return rc == -_errno.ECANCELED

    def watch(self, int fd):
        """libd writes to `fd` (an eventfd) once the operation has completed, at once if it has:
        an event loop can wait for it without a thread. watch(-1) stops that; once it returns no
        write to the old fd can come any more."""
        with nogil:
            clibd.libd_op_watch(self._op, fd)

    def __await__(self):
        # Imported here: asyncio (with ssl) is a third of a compute process's start otherwise, and
        # whoever awaits has it loaded already.
        import asyncio
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self.wait).__await__()


cdef class LibdTransportRDMAServer(LibdTransport):
    """The memory element side: serve() it, grant() clients, revoke() them, stop()."""

    def serve(self, block=True):
        """Starts serving. With block=True (Scad's behaviour) returns when stop() is called."""
        cdef clibd.libd_transport *t = self._tr()
        cdef int rc
        with nogil:
            rc = clibd.libd_trdma_server_serve(t)
        _check(rc, "serve")
        if not block:
            return
        cdef unsigned done_mask = clibd.LIBD_STATE_INITD | clibd.LIBD_STATE_TERMINATED
        while True:
            if self._t == NULL:
                return
            t = self._t
            with nogil:
                rc = clibd.libd_transport_wait_state(t, done_mask, 200)
            if rc >= 0:
                return
            PyErr_CheckSignals()   # Ctrl-C stops a blocking serve

    def stop(self):
        cdef clibd.libd_transport *t = self._t
        if t == NULL:
            return
        with nogil:
            clibd.libd_trdma_server_stop(t)

    def grant(self, client, uint64_t offset=0, uint64_t length=0, rights="rw"):
        """Gives `client` (an action id) access; returns the configuration to relay to it."""
        cdef unsigned r = (1 if "r" in rights else 0) | (2 if "w" in rights else 0)
        cdef char out[2048]
        bclient = _b(client)
        _check(clibd.libd_trdma_server_grant(self._tr(), bclient, offset, length, r, out, sizeof(out)), "grant")
        return out.decode()

    def revoke(self, grant_id):
        cdef clibd.libd_transport *t = self._tr()
        bid = _b(grant_id)
        cdef const char *c = bid
        cdef int rc
        with nogil:   # closing the grant's connections waits for the server's loop
            rc = clibd.libd_trdma_server_revoke(t, c)
        _check(rc, "revoke")

    def expose(self, element, uint64_t address, uint64_t size):
        """Serves the caller's memory [address, address+size) in place as element `element`
        (a server started with size,0 serves only such memory). The caller keeps it valid until
        withdraw(element) returns."""
        cdef clibd.libd_transport *t = self._tr()
        bel = _b(element)
        _check(clibd.libd_trdma_server_expose(t, bel, <void *><size_t>address, size), "expose")

    def expose_ranges(self, element, ranges):
        """Serves several buffers of the caller, `ranges` a list of (address, size), in place as one
        element: its offsets run through them in order, a grant opens all of them (and nothing
        between them), and one transfer moves within one of them. Over tcp and shm; verbs refuses
        it (lend each buffer as its own element there)."""
        cdef clibd.libd_transport *t = self._tr()
        bel = _b(element)
        cdef int n = len(ranges)
        cdef clibd.libd_range *r = _range_list(ranges, "expose_ranges")
        try:
            _check(clibd.libd_trdma_server_expose_ranges(t, bel, r, n), "expose_ranges")
        finally:
            free(r)

    def withdraw(self, element):
        """Stops serving `element`: its grants are revoked and their connections closed."""
        cdef clibd.libd_transport *t = self._tr()
        bel = _b(element)
        cdef const char *c = bel
        cdef int rc
        with nogil:
            rc = clibd.libd_trdma_server_withdraw(t, c)
        _check(rc, "withdraw")

    def grant_ex(self, element, client="*", uint64_t offset=0, uint64_t length=0, rights="rw", ttl=None):
        """A grant on `element` for `client` ('*': whoever holds the configuration), expiring
        after `ttl` seconds (None: until revoked). Returns the configuration to relay; it carries
        the grant's secret."""
        cdef clibd.libd_grant_spec spec
        cdef char out[2048]
        bel = _b(element)
        bclient = _b(client)
        _grant_spec(&spec, bel, bclient, offset, length, rights, ttl)
        _check(clibd.libd_trdma_server_grant_ex(self._tr(), &spec, out, sizeof(out)), "grant")
        return out.decode()

    def grant_key(self, element, uint64_t offset=0, uint64_t length=0, rights="rw", ttl=None):
        """grant_ex() for whoever holds the key ('*'), returned as (grant id, secret) instead of a
        configuration: for a lender that writes its own record, once per buffer."""
        cdef clibd.libd_grant_spec spec
        cdef char out[2048]
        bel = _b(element)
        _grant_spec(&spec, bel, "*", offset, length, rights, ttl)
        _check(clibd.libd_trdma_server_grant_ex(self._tr(), &spec, out, sizeof(out)), "grant")
        return _key_of(out)

    def lend(self, element, uint64_t address, uint64_t size, rights="rw", ttl=None):
        """expose() and grant_ex() in one call: serves the caller's memory [address, address+size)
        in place as `element` and grants it to whoever holds the grant ('*'), expiring after
        `ttl` seconds (None: until revoked). Returns (grant id, secret). withdraw(element) ends
        it (its grants go with it). If the grant cannot be made the element is withdrawn."""
        cdef clibd.libd_transport *t = self._tr()
        cdef clibd.libd_grant_spec spec
        cdef char out[2048]
        bel = _b(element)
        _grant_spec(&spec, bel, "*", 0, 0, rights, ttl)
        _check(clibd.libd_trdma_server_expose(t, spec.element, <void *><size_t>address, size), "expose")
        cdef int rc = clibd.libd_trdma_server_grant_ex(t, &spec, out, sizeof(out))
        if rc < 0:
            err = _error(rc, "grant")
            clibd.libd_trdma_server_withdraw(t, spec.element)
            raise err
        return _key_of(out)

    def watch_notify(self, grant_id, int fd):
        """libd writes to `fd` (an eventfd) whenever wait_notify(grant_id) would have something to
        return; wait_notify(grant_id, 0) then takes it. KeyError if the grant is gone."""
        bid = _b(grant_id)
        _check(clibd.libd_trdma_server_watch_notify(self._tr(), bid, fd), "watch_notify")

    def unwatch_notify(self, grant_id, int fd):
        """Stops watch_notify; no write to `fd` comes after it returns. A grant that is gone is fine."""
        if self._t == NULL:
            return
        bid = _b(grant_id)
        clibd.libd_trdma_server_unwatch_notify(self._t, bid, fd)

    def prefetch(self, element=None):
        """Has the pages of `element` (None: this transport's own element) allocated in the
        background, for an owner about to fill it; returns at once. NotImplementedError for lent
        memory (its pages are the lender's), KeyError for no such element."""
        bel = _b(self.name if element is None else element)
        _check(clibd.libd_trdma_server_prefetch(self._tr(), bel), "prefetch")

    def progress(self, uint32_t lease_us=1000):
        """Runs the server's loop once on this thread, without blocking, and leases it for
        `lease_us` (the server's own thread stays parked meanwhile): for an owner that polls for a
        holder's word, so that the holder's requests are served here and nothing is woken.
        progress(0) gives the loop back; call it before sleeping. True when the loop ran here."""
        cdef clibd.libd_transport *t = self._tr()
        cdef int rc
        with nogil:
            rc = clibd.libd_trdma_server_progress(t, lease_us)
        _check(rc, "progress")
        return rc == 1

    def wait_notify(self, grant_id, timeout=None):
        """Waits for a holder of `grant_id` to say it finished: returns (value, status), status 0
        or the negative errno the holder gave up with. Raises TimeoutError (nothing within
        `timeout` seconds), ConnectionError (the holder's connection closed without a word),
        OSError(EKEYEXPIRED) (the grant expired), CancelledError (revoked or stopped meanwhile),
        KeyError (no such grant)."""
        cdef clibd.libd_transport *t = self._tr()
        bid = _b(grant_id)
        cdef const char *c = bid
        cdef uint64_t value = 0
        cdef int status = 0
        cdef int ms = -1 if timeout is None else max(0, int(timeout * 1000))
        cdef int rc
        with nogil:
            rc = clibd.libd_trdma_server_wait_notify(t, c, &value, &status, ms)
        _check(rc, "wait_notify")
        return value, status

    def poll_notify(self, grant_id):
        """wait_notify(grant_id, 0) for a caller that polls: None while no word has come (no
        TimeoutError to raise and catch on every look); otherwise what wait_notify returns or
        raises."""
        cdef clibd.libd_transport *t = self._tr()
        bid = _b(grant_id)
        cdef uint64_t value = 0
        cdef int status = 0
        cdef int rc = clibd.libd_trdma_server_wait_notify(t, bid, &value, &status, 0)  # never blocks
        if rc == -_errno.ETIMEDOUT:
            return None
        _check(rc, "wait_notify")
        return value, status


include "grant_transfer.pxi"
