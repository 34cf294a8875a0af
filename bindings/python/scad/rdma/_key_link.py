"""KeyLink: this process's link to one remote buffer's route, reused for every transfer.

A route is the owner's server and the buffer's key: libd authenticates a link with one grant
(over shm and tcp the links to one owner ride the process's one connection to it, each attaching
its own key; over verbs each is an RC connection of its own). read_into/write_from and the tensor
transport move bytes through links directly; a QueuePair (_queue_pair.py) is the links to one
owner's manager. get()/put() start a transfer and return at once; poll() says whether everything
started has finished, wait() waits for it. A link moves one local region at a time: libd
registers one local buffer per link, so switching to memory outside the current region while
transfers run is refused (wait first).
"""
from __future__ import annotations

import bisect
import errno
import threading
import time
from typing import Any, List, Optional

import numpy

from ..connect import Descriptor
from .._waiter import WaitFd, wait_ready
from .._memserver import MAX_RANGES
from ._buffer import RdmaBuffer


def _local(memory: Any) -> Descriptor:
    return memory if isinstance(memory, Descriptor) else Descriptor(memory)


def _extent(d: Descriptor) -> Descriptor:
    """The memory to register for d: the whole object a view is cut from, where there is one,
    so that transfers into different parts of one array share one registration."""
    obj, root = d.data, None
    try:
        if isinstance(obj, numpy.ndarray):
            while isinstance(obj.base, numpy.ndarray):
                obj = obj.base
            root = Descriptor(obj) if obj is not d.data else None
        elif isinstance(obj, memoryview) and obj.obj is not None:
            root = Descriptor(obj.obj)
    except (ValueError, TypeError):
        root = None  # not contiguous, or not memory a descriptor takes: the view itself
    if root is not None and root.ptr <= d.ptr and d.ptr + d.size <= root.ptr + root.size:
        return root
    return d


def _check_placement(read_into_readonly: bool, offset: int, size: int, remote: RdmaBuffer) -> None:
    if read_into_readonly:
        raise ValueError("a read needs local memory it may write (bytes is read-only)")
    if offset < 0 or offset + size > remote.size():
        raise ValueError(f"[{offset}, +{size}) is outside the remote buffer of {remote.size()} bytes")


def lay_out(remote: RdmaBuffer, memory: Any, offset: int, read: bool) -> List[tuple]:
    """[(Descriptor, offset in remote)]: the local memory (one, or a list laid end to end) placed
    from `offset` in remote, each piece cut where one of remote's memories ends (one transfer
    moves within one of them)."""
    if remote.ranges is None and not isinstance(memory, list):  # one memory into one: placed as it is
        d = _local(memory)
        _check_placement(read and d.readonly, offset, d.size, remote)
        return [(d, offset)]
    descs = [_local(m) for m in memory] if isinstance(memory, list) else [_local(memory)]
    if not descs or len(descs) > MAX_RANGES:
        raise ValueError(f"a transfer moves 1..{MAX_RANGES} local memories, not {len(descs)}")
    _check_placement(read and any(d.readonly for d in descs), offset, sum(d.size for d in descs), remote)
    ends = remote.range_ends()
    i, at, out = bisect.bisect_right(ends, offset), offset, []
    for d in descs:
        done = 0
        while done < d.size:
            while ends[i] <= at:
                i += 1
            n = min(d.size - done, ends[i] - at)
            out.append((d if n == d.size else Descriptor((d.ptr + done, n, "cpu", d)), at))
            done += n
            at += n
    return out


class KeyLink:
    def __init__(self, action: Any, transport: Any, route: tuple, impl: str) -> None:
        self._action = action
        self._t = transport
        self.route = route
        self.impl = impl  # "shm", "tcp" or "verbs"
        self._lock = threading.Lock()
        self._pending: List[Any] = []
        self._reg: Optional[tuple] = None  # (ptr, size) of the registered local region
        self._keep: Any = None
        self._fd = WaitFd()  # the eventfd libd writes to as transfers complete (wait)
        self._closed = False
        self.server: tuple = ()  # the owner's server it leads to (the manager's key for idle links)
        self.exposed = False  # part of a QueuePair handed to a caller: closed, never reused
        self.queue_pair: Any = None  # that QueuePair (told when the manager closes the link)
        # Its last transfer completed and none runs (the manager's callers say so): only then
        # may it be kept for another buffer when let go of; else it is closed.
        self.reusable = False
        self._scratch: Any = None  # what an idle link has registered in place of a caller's memory
        self._scratch_at = 0  # its address

    def get(self, local: Any, remote: RdmaBuffer, offset: int = 0) -> Any:
        """Starts reading remote[offset:offset+len(local)] into local (or into a list of local
        memories, in order); returns at once, with the transfer's libd operation."""
        return self._start(local, remote, offset, read=True)

    def put(self, local: Any, remote: RdmaBuffer, offset: int = 0) -> Any:
        """Starts writing local (or a list of local memories, in order) into
        remote[offset:offset+len(local)]; returns at once, with the transfer's libd operation."""
        return self._start(local, remote, offset, read=False)

    def move_list(self, pairs: List[tuple], remote: RdmaBuffer, read: bool = True) -> Any:
        """Starts one transfer of several local buffers, [(local, offset in remote)], each to or
        from its own part of remote (a buffer lent as a list: each part within one of its
        ranges); the local buffers are registered together for it. Returns at once."""
        self._check_route(remote)
        pieces = [(_local(m), offset) for m, offset in pairs]
        ends = remote.range_ends()
        for d, offset in pieces:
            if read and d.readonly:
                raise ValueError("a read needs local memory it may write (bytes is read-only)")
            if offset < 0 or offset + d.size > remote.size():
                raise ValueError(f"[{offset}, +{d.size}) is outside the remote buffer of {remote.size()} bytes")
            if offset + d.size > ends[bisect.bisect_right(ends, offset)]:
                raise ValueError(f"[{offset}, +{d.size}) crosses from one of the buffer's memories into the next "
                                 "(give each its own entry)")
        return self._start_list(pieces, remote, read)

    def _start_list(self, pieces: List[tuple], remote: RdmaBuffer, read: bool) -> Any:
        """One transfer of [(Descriptor, offset in remote)], checked already (move_list, lay_out)."""
        entries = [(d.size, remote.offset + offset, d.ptr) for d, offset in pieces]
        # What to register: each piece's own memory (a piece lay_out cut keeps it as its owner),
        # once; the entries point into them.
        regs = {}
        for d, _ in pieces:
            root = d.data if isinstance(d.data, Descriptor) and d.data.ptr <= d.ptr and \
                d.ptr + d.size <= d.data.ptr + d.data.size else d
            regs.setdefault((root.ptr, root.size), root)
        if len(regs) > 1 and self.impl == "verbs":
            raise NotImplementedError("over verbs one transfer moves one local memory (a queue pair registers one): "
                                      "move each with its own transfer")
        with self._lock:
            self._check_route(remote)
            if any(not op.done() for op in self._pending):
                raise RuntimeError("transfers are still running on this queue pair: wait() first")
            self.reusable = False
            keep = list(regs.values())
            self._reg, self._keep = None, keep  # registered as a list: the next transfer registers anew
            self._t.reg_ranges(list(regs), keep=keep)
            op = self._t.readv_async(entries) if read else self._t.writev_async(entries)
            self._pending.append(op)
        return op

    def poll(self) -> bool:
        """True once every transfer started has finished; raises the first one's error."""
        with self._lock:
            pending, self._pending = self._pending, [op for op in self._pending if not op.done()]
        for op in pending:
            if op.done():
                op.wait(0)  # raises what it failed with
        return not self._pending

    async def wait(self, timeout: Optional[float] = None, busy_poll_us: float = 0.0) -> None:
        """Waits for every transfer started; TimeoutError if `timeout` seconds pass first (they
        go on: wait again, or cancel()). busy_poll_us: how long to poll before sleeping."""
        with self._lock:
            pending = list(self._pending)
        fd = self._fd.take()
        done = lambda: all(op.done() for op in pending)  # noqa: E731 - a look also reads answers in (libd)
        def arm(fd: int) -> None:
            for op in pending:
                op.watch(fd)  # libd writes to it as each completes

        try:
            fd, ok = await wait_ready(done, busy_poll_us, timeout, fd, arm)
        finally:
            self._fd.give_back(fd)
        if not ok:
            raise TimeoutError(f"the transfers did not finish within {timeout} s (they go on)")
        self._wait_all(0, pending)  # all done: raises the first failure (one cancelled meanwhile too)

    def finished(self) -> bool:
        """True, the pending list emptied, when every transfer started has completed successfully
        (shm's complete as they start); False if one still runs or failed (wait() says how)."""
        with self._lock:
            pending = self._pending
            for op in pending:
                if op.status != 0:
                    return False
            pending.clear()
        return True

    def poll_done(self) -> bool:
        """True once every transfer started has finished, failed or not (poll() raises failures)."""
        with self._lock:
            pending = list(self._pending)
        return all(op.done() for op in pending)

    def cancel(self) -> None:
        """Cancels every transfer started: once it returns, libd touches none of their memory."""
        with self._lock:
            pending, self._pending = self._pending, []
        for op in pending:
            op.cancel()

    def cancel_ops(self, ops: List[Any]) -> None:
        """Cancels these transfers of the link (a queue pair's own), not the others."""
        for op in ops:
            op.cancel()
        with self._lock:
            self._pending = [op for op in self._pending if not any(op is o for o in ops)]

    def broken(self) -> bool:
        """True when the link is of no more use: in ERROR (over verbs a transfer cancelled while on
        the wire resets its RC connection, as RDMA cannot withdraw a posted request). The manager
        then lets go of it, and the next transfer to the buffer makes a new one."""
        return self._t.state == "ERROR"

    def close(self) -> None:
        """Cancels what runs and lets go of the link (its libd action, its eventfd, the caller's
        memory). Closing twice is closing once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.route = None  # a transfer started on it from now on is refused
        self.cancel()
        self._action.terminate()
        with self._lock:
            self._reg, self._keep, self._scratch = None, None, None
        self._fd.close()

    # ---- reuse for another buffer of the same server (the manager's idle links) ----
    def park(self) -> bool:
        """Lets go of this link's key at once (the grant is detached from the connection,
        the caller's memory unregistered) but keeps its libd transport for another buffer of the
        same owner's server: making one costs more than the transfer of a small buffer. Only a
        pair whose last transfer completed and that runs none (`reusable`); False, and closed
        instead, otherwise or when the transport cannot be configured again."""
        with self._lock:
            if not self.reusable or self._pending and any(not op.done() for op in self._pending):
                park = False
            else:
                park, self._pending = True, []
                route, self.route = self.route, None  # a transfer started on it from now on is refused
                self.reusable = False
        if not park:
            self.close()
            return False
        try:
            # Nothing of the caller's stays registered (the binding would keep it alive).
            if self._scratch is None:
                self._scratch = numpy.zeros(1, dtype=numpy.uint8)
                self._scratch_at = self._scratch.ctypes.data  # once: numpy's .ctypes costs 0.75 µs a look
            self._t.reg_memory(self._scratch_at, 1, keep=self._scratch)
            with self._lock:
                self._reg, self._keep = None, None
            if self.impl != "shm":
                # The same key again: libd detaches it from the connection now (the owner's
                # server stops counting this process as a holder) and reconnects lazily on the
                # next transfer. Over shm the owner's server holds nothing for it (announce,0:
                # the key is checked in the owner's grant table before each transfer); the next
                # rebind lets go of the key.
                self._action.config_transport("qp", f"grant,{route[3]}")
        except (OSError, ValueError):
            self.close()
            return False
        return True

    def rebind(self, route: tuple, grant: str, secret: str) -> bool:
        """Points a parked link at another buffer of the same server (route, and its key):
        its next transfer attaches that key. False, and closed, if libd refuses."""
        with self._lock:
            try:
                self._action.config_transport("qp", f"grant,{grant};secret,{secret}")
                self.route = route
                return True
            except (OSError, ValueError):
                pass
        self.close()
        return False

    def __repr__(self) -> str:
        return f"KeyLink({self.impl}, pending={len(self._pending)})"

    # ---- the machinery ------------------------------------------------------------------
    def _start(self, local: Any, remote: RdmaBuffer, offset: int, read: bool) -> Any:
        self._check_route(remote)
        pieces = lay_out(remote, local, offset, read)
        if len(pieces) > 1:  # several local memories, or one across two of remote's: one transfer of a list
            return self._start_list(pieces, remote, read)
        d, offset = pieces[0]
        with self._lock:
            self._check_route(remote)
            self.reusable = False
            self._register_locked(d)
            local_off = d.ptr - self._reg[0]
            raddr = remote.offset + offset
            op = self._t.read_async(d.size, raddr, local_off) if read else self._t.write_async(d.size, raddr, local_off)
            self._pending.append(op)
        return op

    def _check_route(self, remote: RdmaBuffer) -> None:
        # Also under the lock, before a transfer starts: the manager may have let go of the link
        # (and pointed it at another buffer) since the caller took it.
        if self.route is None:
            raise ConnectionError(errno.ECONNABORTED, "the link to the buffer was closed (the buffer was dropped here, "
                                                      "or its queue pair released)")
        if remote.route != self.route:
            raise ValueError("this link leads to another buffer's route")

    def _register_locked(self, d: Descriptor) -> None:
        if self._reg and self._reg[0] <= d.ptr and d.ptr + d.size <= self._reg[0] + self._reg[1]:
            return
        if any(not op.done() for op in self._pending):
            raise RuntimeError("transfers on another local region are still running on this queue pair: wait() first")
        whole = _extent(d)
        self._t.reg_memory(whole.ptr, whole.size, keep=whole)
        self._reg, self._keep = (whole.ptr, whole.size), whole

    def _wait_all(self, timeout: Optional[float], pending: Optional[List[Any]] = None) -> None:
        """Waits for `pending` (default: every transfer running) in libd, the GIL released; raises
        the first failure, a transfer cancelled meanwhile included (CancelledError)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if pending is None:
            with self._lock:
                pending = list(self._pending)
        try:
            for op in pending:
                op.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        finally:
            with self._lock:
                self._pending = [op for op in self._pending if not op.done()]


def refusal(e: OSError, impl: str, new: bool) -> OSError:
    """What a transfer's failure means to the caller: a refused key, an owner out of reach (on the
    first contact), or a transfer cut off."""
    if isinstance(e, PermissionError):
        if "allow writes" in str(e) or "refused the write" in str(e):  # libd's words for a key that only reads
            return PermissionError(e.errno, f"the buffer is read-only (its owner lent memory that may not be written): {e}")
        return PermissionError(e.errno, f"the owner refused this buffer's key (dropped or expired): {e}")
    if new:
        return ConnectionError(e.errno, f"cannot reach the buffer's owner over {impl}: {e}")
    return ConnectionError(e.errno, f"the buffer's owner cut the transfer off (it dropped the buffer, or is gone): {e}")
