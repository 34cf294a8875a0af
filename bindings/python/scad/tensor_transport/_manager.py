"""ScadTensorTransport: Ray's TensorTransportManager interface on scad.rdma.

One-sided: the source lends each tensor of an object in place (an RdmaBuffer per tensor, made when
Ray extracts the object's metadata); the destination reads them into new or given buffers. The
reads run on a private event loop thread of this module, so callers with or without an event loop
of their own may use it: fetch_multiple_tensors starts them and returns at once (Ray's ray.get
starts the fetches of several objects before it waits for any), wait_fetch_complete waits, and
recv_multiple_tensors does both.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from concurrent.futures import CancelledError
import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set

import numpy

from ..rdma import RdmaBuffer, RdmaManager
from ..rdma._key_link import refusal as _refusal
from ..rdma._manager import _buffer_info  # (address, size, readonly) of an array, in one call
from .._memserver import from_binding
from .._waiter import poll_until, wait_in_thread
from ._metadata import (CommunicatorMetadata, FetchRequest, ScadCommunicatorMetadata, ScadTransportMetadata,
                        _metadata_of)

try:
    from ray.experimental.rdt.tensor_transport_manager import TensorTransportManager as _Base
except ImportError:  # pragma: no cover - depends on the environment
    _Base = object


_ONE_SHOT = ("shm", "tcp")  # transports on which a receive of one buffer is one transfer of its own
_read_once = from_binding("read_once")  # such a transfer, from start to finish in one call
_scan_record = from_binding("scan_buffer_record")  # an RdmaBuffer's record read in one pass
_TransferSlot = from_binding("TransferSlot")  # where it shows, for an abort from another thread


class _Loop:
    """An event loop on a daemon thread, for synchronous callers."""

    def __init__(self) -> None:
        self._loop = None
        self._lock = threading.Lock()

    def submit(self, coro: Any) -> concurrent.futures.Future:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="scad-tensor-transport", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop)


class _Counters:
    """What the tensor transports of this process moved (process-wide: Ray makes one transport
    object per registered name in each process)."""

    FIELDS = ("lent_objects", "lent_tensors", "lent_bytes", "released_objects", "received_objects",
              "received_tensors", "received_bytes", "failed_receives", "shm_reads", "tcp_reads", "verbs_reads")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.FIELDS, 0)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._values[name] += delta

    # What every operation counts, without add's keywords (a loan and a receive take a few µs).
    def lent(self, tensors: int, nbytes: int) -> None:
        with self._lock:
            values = self._values
            values["lent_objects"] += 1
            values["lent_tensors"] += tensors
            values["lent_bytes"] += nbytes

    def received_one(self, nbytes: int, impl: str) -> None:
        """received() of one tensor, read with one transfer over `impl`."""
        with self._lock:
            values = self._values
            values["received_objects"] += 1
            values["received_tensors"] += 1
            values["received_bytes"] += nbytes
            values[_READS[impl]] += 1

    def released(self) -> None:
        with self._lock:
            self._values["released_objects"] += 1

    def received(self, tensors: int, nbytes: int, impls: List[str]) -> None:
        with self._lock:
            values = self._values
            values["received_objects"] += 1
            values["received_tensors"] += tensors
            values["received_bytes"] += nbytes
            for impl in impls:
                values[impl + "_reads"] += 1

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._values)


_counters = _Counters()
_READS = {impl: impl + "_reads" for impl in ("shm", "tcp", "verbs")}  # each transport's counter


def _count_received(reads: List[tuple], impls: List[str] = ()) -> None:
    """Counts an object received by these reads, each into an array or a list of them, and the
    reads made over each libd transport in impls (one update: a receive is a few microseconds)."""
    tensors = nbytes = 0
    for _, local in reads:
        if type(local) is list:
            tensors += len(local)
            nbytes += sum(a.nbytes for a in local)
        else:
            tensors += 1
            nbytes += local.nbytes
    _counters.received(tensors, nbytes, impls)


def _nbytes_of(shape: Any, dtype: Any) -> int:
    """The bytes of a tensor of this shape and dtype (numpy's or torch's)."""
    count = 1
    for n in shape:
        count *= int(n)
    if _is_torch(dtype):
        import torch
        return count * torch.empty((), dtype=dtype).element_size()
    return count * numpy.dtype(dtype).itemsize


def _is_torch(x: Any) -> bool:
    module = type(x).__module__
    return module == "torch" or module.startswith("torch.")


def _memory(tensor: Any) -> numpy.ndarray:
    """The bytes of a CPU tensor or array as a flat uint8 numpy view: its own memory, never a copy
    (the view keeps the tensor's storage alive). Any dtype, torch's bfloat16 included."""
    if type(tensor) is numpy.ndarray:  # the common case first: a few checks, one view
        if tensor.dtype.hasobject:
            raise TypeError(f"an array of dtype {tensor.dtype} holds Python objects, not data: it cannot move as memory")
        if not tensor.flags.c_contiguous:
            raise ValueError("an array must be C-contiguous to move in place (numpy.ascontiguousarray)")
        return tensor if tensor.ndim == 1 and tensor.dtype == numpy.uint8 else tensor.reshape(-1).view(numpy.uint8)
    if _is_torch(tensor):
        if tensor.device.type != "cpu":
            raise NotImplementedError(f"tensors on {tensor.device} are not supported: libd's transports move host memory")
        if not tensor.is_contiguous():
            raise ValueError("a tensor must be contiguous to move in place (tensor.contiguous())")
        import torch
        return tensor.detach().reshape(-1).view(torch.uint8).numpy()
    if not isinstance(tensor, numpy.ndarray):
        raise TypeError(f"a tensor transport moves torch tensors and numpy arrays, not {type(tensor).__name__}")
    if tensor.dtype.hasobject:
        raise TypeError(f"an array of dtype {tensor.dtype} holds Python objects, not data: it cannot move as memory")
    if not tensor.flags.c_contiguous:
        raise ValueError("an array must be C-contiguous to move in place (numpy.ascontiguousarray)")
    return tensor.reshape(-1).view(numpy.uint8)


class _Receive:
    """One receive of an object's tensors: its links, and the first error, which cancels the
    rest (a read that failed, abort_transport, or a FetchRequest dropped before it finished)."""

    def __init__(self, obj_id: str) -> None:
        self.obj_id = obj_id
        self.error: Optional[BaseException] = None
        self._links: List[Any] = []
        self._lock = threading.RLock()  # abort() may run in a finalizer, on any thread

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
            # Under the lock: a link the receive let go of (untrack) may serve another
            # receive next, and this cancel must not reach that one's transfers.
            for link in self._links:
                link.cancel()  # once it returns, libd writes none of the receive's targets

    def abort(self) -> None:
        self.fail(ConnectionAbortedError(f"the receive of object {self.obj_id} was aborted"))

    def check(self) -> None:
        if self.error is not None:
            raise ConnectionAbortedError(f"the receive of object {self.obj_id} ended: {self.error}")

    def start(self, begin: Any) -> None:
        """Runs begin() (which starts a read) unless the receive has ended; an abort waits for a
        start under way, so no read of the receive starts after abort() returns."""
        with self._lock:
            self.check()
            begin()

    def track(self, link: Any) -> None:
        with self._lock:
            if self.error is None:
                self._links.append(link)
                return
        self.check()

    def untrack(self, link: Any) -> None:
        """The receive is done with link (before it is let go of): an abort no longer touches it."""
        with self._lock:
            if link in self._links:
                self._links.remove(link)


class _Route:
    """A route (a remote buffer's link) in use by this process's receives: one at a time,
    since a link reads into one local region at a time and each receive lets go of its link
    when done. Receives on the loop take turns on `lock`; a direct one (recv_multiple_tensors
    in the caller's thread) takes a route only while nobody else has it, and the loop's wait for
    `freed` when it has."""

    def __init__(self) -> None:
        self.lock: Optional[asyncio.Lock] = None  # made at the loop's first use (a direct receive needs none)
        self.users = 0              # receives on the loop using or waiting for it
        self.direct = False         # a direct receive holds it
        self.freed: Optional[asyncio.Event] = None  # set (on the loop) when a direct receive lets go
        self.loop: Any = None


@dataclass
class ScadFetchRequest(FetchRequest):
    """A receive in flight (Ray's FetchRequest): wait_fetch_complete returns its tensors. Dropped
    before it finished, it is cancelled: its targets are not written afterwards."""

    receive: Any = None
    future: Any = None

    def __del__(self) -> None:
        if self.future is not None and not self.future.done():
            self.receive.abort()


class ScadTensorTransport(_Base):
    """Register with Ray (ray.experimental.register_tensor_transport) or call directly.

    timeout: seconds a receive may take before it is cancelled with TimeoutError; busy_poll_us:
    how long a read polls for its completion before it sleeps (0: sleep at once; polling trades a
    core for the wake-up a sleeper pays). Ray makes the transport without arguments: to change
    them under Ray, register a subclass that sets the class attributes."""

    timeout: float = 30.0
    busy_poll_us: float = 0.0

    def __init__(self, timeout: Optional[float] = None, busy_poll_us: Optional[float] = None) -> None:
        self._timeout = type(self).timeout if timeout is None else timeout
        self._busy_poll_us = float(type(self).busy_poll_us if busy_poll_us is None else busy_poll_us)
        if self._busy_poll_us < 0:
            raise ValueError("busy_poll_us must be >= 0")
        self._loop = _Loop()
        self._lent: Dict[str, List[Any]] = {}  # source: obj_id -> its tensors' buffers, or a lone tensor's loan
        self._receiving: Dict[str, Set[_Receive]] = {}       # destination: obj_id -> receives in flight
        self._lone: Dict[str, Any] = {}                     # destination: obj_id -> its lone read's slot
        self._routes: Dict[tuple, _Route] = {}              # destination: routes in use (under _lock)
        self._lock = threading.Lock()

    @staticmethod
    def counters() -> Dict[str, int]:
        """What this process's tensor transports moved so far: objects, tensors and bytes lent
        (source) and received (destination), loans ended, receives that failed, and the reads
        per libd transport (shm, tcp, verbs)."""
        return _counters.snapshot()

    def tensor_transport_backend(self) -> str:
        return "SCAD"

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor: Any) -> bool:
        return True  # libd's tcp reaches every host; shm and verbs are chosen where they work

    # ---- the source ---------------------------------------------------------------------
    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List[Any]) -> ScadTransportMetadata:
        """Lends the object's tensors in place and describes them (shape, dtype, buffer)."""
        if len(rdt_object) == 1 and type(rdt_object[0]) is numpy.ndarray:
            lone = self._lend_lone(obj_id, rdt_object[0])
            if lone is not None:
                return lone
        manager = RdmaManager.get()
        memories = [_memory(t) for t in rdt_object]
        nonempty = [m for m in memories if m.nbytes]
        # Several tensors: lent as one list under one key, read with one transfer (as NIXL lends
        # a list with one blob). Where that cannot be (the server serves verbs), a buffer each.
        listed = manager._request_list(nonempty) if len(nonempty) > 1 else None
        buffers = [listed] if listed is not None else []
        try:
            if listed is None:
                for memory in memories:
                    buffers.append(manager.request_buffer(memory) if memory.nbytes else None)
            # The records now: a buffer's key is made as its record is written, and a failure
            # there must not leave the memory lent with no metadata that garbage_collect could name.
            records = ["" if b is None else b.to_json(with_ranges=False) if b is listed else b.to_json()
                       for b in buffers]
        except BaseException:
            for b in buffers:
                if b is not None:
                    b.drop()
            raise
        with self._lock:
            # A retried task describes the same object again: the loan covers both descriptions.
            self._lent.setdefault(obj_id, []).extend([b for b in buffers if b is not None])
        _counters.lent(len(memories), sum([m.nbytes for m in memories]))
        meta = [(t.shape, t.dtype) if type(t) is numpy.ndarray or _is_torch(t) else (tuple(t.shape), t.dtype)
                for t in rdt_object]  # a numpy array's shape is a tuple already
        if listed is not None:
            # A version-1 record, which receivers of every version read: they know each tensor's
            # bytes from tensor_meta, and cut the transfer there.
            return ScadTransportMetadata(tensor_meta=meta, tensor_device="cpu", buffers=[], lent_list=records[0])
        return ScadTransportMetadata(tensor_meta=meta, tensor_device="cpu", buffers=records)

    def _lend_lone(self, obj_id: str, tensor: numpy.ndarray) -> Optional[ScadTransportMetadata]:
        """The common object, one numpy array with bytes in it, lent under a key of its own with
        no view made of it; None for anything else (the general path lends it or says why not)."""
        if tensor.dtype.hasobject or not tensor.flags.c_contiguous or not tensor.nbytes or _buffer_info is None:
            return None
        try:
            ptr, size, readonly = _buffer_info(tensor)
        except (BufferError, ValueError):
            return None
        manager = RdmaManager.get()
        token, key, record = manager._lend_keyed(tensor, ptr, size, readonly)  # (no key made: nothing lent)
        with self._lock:
            self._lent.setdefault(obj_id, []).append((manager, token, key))
        _counters.lent(1, tensor.nbytes)
        return _metadata_of([(tensor.shape, tensor.dtype)], "cpu", [record], "")

    def get_communicator_metadata(self, src_actor: Any = None, dst_actor: Any = None,
                                  backend: Optional[str] = None) -> CommunicatorMetadata:
        return ScadCommunicatorMetadata()

    def send_multiple_tensors(self, tensors: List[Any], tensor_transport_metadata: Any,
                              communicator_metadata: Any) -> None:
        """Nothing to do: the destination reads (one-sided; Ray does not call it)."""

    def garbage_collect(self, obj_id: str, tensor_transport_meta: Any = None, tensors: Any = None) -> None:
        """Ends the loan: the buffers' keys are revoked and the memory let go."""
        with self._lock:
            buffers = self._lent.pop(obj_id, None)
        if buffers is None:
            return
        for b in buffers:
            if type(b) is tuple:  # a lone tensor's loan (_lend_lone): (manager, token, key)
                b[0]._end_loan(b[1], b[2])
            else:
                b.drop()
        _counters.released()

    # ---- the destination ----------------------------------------------------------------
    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: ScadTransportMetadata,
                              communicator_metadata: Any = None, target_buffers: Optional[List[Any]] = None) -> List[Any]:
        """Reads every tensor of the object into target_buffers (when given) or new arrays /
        tensors, and returns them. Where it can (no other receive of this process uses the
        object's buffers, and their owners' servers have been reached before, so no handshake can
        hold it up), the reads start and are waited for in the calling thread, in libd with the
        GIL released: no hand-off to the module's loop thread and back."""
        single = self._single(tensor_transport_metadata, target_buffers)
        if single is not None:
            return self._recv_single(obj_id, *single)
        out, reads = self._targets(tensor_transport_metadata, target_buffers)
        manager = RdmaManager.get()
        routes = [buf.route for buf, _ in reads]
        reached = all(manager._reached(buf) for buf, _ in reads)
        receive, direct = self._begin(obj_id, routes if reached else None)
        if not direct:
            future = self._loop.submit(self._recv(receive, reads))
            return self.wait_fetch_complete(ScadFetchRequest(obj_id=obj_id, tensors=out, receive=receive, future=future))
        try:
            how = manager._how(reads[0][0]) if len(reads) == 1 and type(reads[0][1]) is numpy.ndarray else None
            if how is not None and how[1] in _ONE_SHOT and reads[0][0].route not in manager._links \
                    and _read_once is not None:
                buf, local = reads[0]
                address, size, _ = _buffer_info(local)
                self._recv_one(receive, (buf.grant, buf._secret, buf.offset), local, (how[1], how[2], address, size))
            else:
                self._recv_direct(receive, reads)
        finally:
            self._end(receive, routes)
        return out

    @staticmethod
    def _single(meta: Any, target_buffers: Optional[List[Any]]) -> Optional[tuple]:
        """The common object, one numpy tensor under a key of its own, read into a numpy array
        over shm or tcp from an owner reached before: (target, (grant, secret, offset) of its
        record, (transport, durl, address, size)) for _recv_single, which makes no link and
        reserves no route (the transfer is one of its own). None for anything else, or anything
        amiss: the general path then receives it, or says what is wrong."""
        if type(meta) is not ScadTransportMetadata or meta.lent_list or _buffer_info is None or _read_once is None:
            return None
        records, described = meta.buffers, meta.tensor_meta
        if len(records) != 1 or len(described) != 1 or not records[0]:
            return None
        if target_buffers is None:
            shape, dtype = described[0]
            if not isinstance(dtype, numpy.dtype) or dtype.hasobject:
                return None
            target = numpy.empty(shape, dtype=dtype)
        elif len(target_buffers) != 1 or type(target_buffers[0]) is not numpy.ndarray or target_buffers[0].dtype.hasobject:
            return None
        else:
            target = target_buffers[0]
        try:
            address, size, readonly = _buffer_info(target)
        except (BufferError, ValueError):
            return None
        # The record's fields, checked as RdmaBuffer.from_json checks them, without the buffer
        # object (anything but a record as to_json writes it: the general path reads it).
        fields = _scan_record(records[0]) if _scan_record is not None else None
        if fields is None:
            return None
        _, hostname, host, port, path, verbs, grant, secret, offset, lent, whole, ranges = fields
        manager = RdmaManager.get()
        if (readonly or size == 0 or size != lent or ranges is not None or (host, port, path, grant) in manager._links
                or (host, port, path) not in manager._reached_servers):
            return None
        _, impl, durl = manager._how_server((hostname, host, port, path, verbs, whole))
        if impl not in _ONE_SHOT:
            return None
        return target, (grant, secret, offset), (impl, durl, address, size)

    def _recv_single(self, obj_id: str, target: numpy.ndarray, key: tuple, placed: tuple) -> List[Any]:
        """_single's receive: one read of its own (_read_alone), listed for abort_transport under the
        object's id alone while it runs (a second receive of the object meanwhile is listed as
        any other receive is, and reads the same way)."""
        slot = _TransferSlot()
        lone = self._lone
        if lone.setdefault(obj_id, slot) is slot:
            try:
                self._read_alone(slot, obj_id, key, target, placed)
            finally:
                del lone[obj_id]  # (only the receive that listed it takes it off)
            return [target]
        receive = _Receive(obj_id)
        with self._lock:
            self._receiving.setdefault(obj_id, set()).add(receive)
        try:
            self._recv_one(receive, key, target, placed)
        finally:
            self._end(receive)
        return [target]

    def _recv_one(self, receive: _Receive, key: tuple, local: numpy.ndarray, placed: tuple) -> None:
        """A receive of one buffer into one array, over shm or tcp, from an owner reached before:
        one read of its own (_read_alone), which the receive's abort cancels. key: (grant,
        secret, offset) of the buffer's record; placed: (transport, durl, address, size)."""
        slot = _TransferSlot()
        try:
            receive.track(slot)  # an abort cancels it from now on (one that came before: raises here)
        except BaseException:
            _counters.add(failed_receives=1)
            raise
        try:
            self._read_alone(slot, receive.obj_id, key, local, placed)
        except BaseException as e:
            receive.fail(e)  # (the read is over: this ends the rest of the receive)
            raise
        finally:
            receive.untrack(slot)
        if receive.error is not None:  # aborted as it finished: it ends as aborted
            _counters.add(failed_receives=1)
            receive.check()

    def _read_alone(self, slot: Any, obj_id: str, key: tuple, local: numpy.ndarray, placed: tuple) -> None:
        """Reads the memory of a buffer's key (grant, secret, offset) into local (placed: its
        (transport, durl, address, size)) with a transfer of its own, from start to finish in one
        call of the binding (read_once), the GIL released in libd: no link to make, rebind or
        park, and no Python step between the start and the end (on a busy host each costs a
        microsecond or more beside a 64-byte tcp read). slot: where an abort cancels it. Its
        failure is said as the receive's."""
        impl, durl, address, size = placed
        grant, secret, offset = key
        manager = RdmaManager.get()
        try:
            _read_once(manager.name, manager._one_shot_durl(grant, secret, impl, durl, self._busy_poll_us), address,
                       size, offset, self._busy_poll_us, self._timeout, slot)
        except BaseException as e:
            _counters.add(failed_receives=1)
            if slot.cancelled:
                raise ConnectionAbortedError(f"the receive of object {obj_id} was aborted") from None
            if isinstance(e, TimeoutError):
                raise TimeoutError(f"the receive of object {obj_id} took longer than {self._timeout} s "
                                   "and was cancelled") from None
            if isinstance(e, (PermissionError, ConnectionError)):
                raise _refusal(e, impl, False) from None
            raise
        # (its owner's server was reached before: the caller's condition for a read of its own)
        _counters.received_one(size, impl)

    def _recv_direct(self, receive: _Receive, reads: List[tuple]) -> None:
        manager = RdmaManager.get()
        started = []
        try:
            try:
                for buf, local in reads:
                    made = manager._link(buf)
                    link, new = made
                    receive.track(link)
                    started.append((buf, link, new))
                    receive.start(lambda: manager._transfer_start(buf, local, 0, True, made))
                # Reads over shm complete as they start: then there is nothing to wait for.
                if not all(link.finished() for _, link, _ in started):
                    deadline = time.monotonic() + self._timeout
                    poll_until(lambda: all(link.poll_done() for _, link, _ in started), self._busy_poll_us)
                    for buf, link, new in started:
                        self._wait_read(receive, link._wait_all, deadline, link.impl, new and not manager._reached(buf))
                receive.check()
                for _, link, _ in started:
                    link.reusable = True  # done, nothing runs: may serve another buffer once let go of
            except BaseException as e:
                receive.fail(e)  # cancels what still runs: the targets are not written after this
                _counters.add(failed_receives=1)
                raise
            finally:
                for buf, link, _ in started:
                    receive.untrack(link)
                    manager._release_link(buf)  # this side is done; the loan stays
        except CancelledError:
            raise ConnectionAbortedError(f"the receive of object {receive.obj_id} was aborted") from None
        for buf, link, _ in started:
            manager._mark_reached(buf)
        _count_received(reads, [link.impl for _, link, _ in started])

    def _wait_read(self, receive: _Receive, wait: Any, deadline: float, impl: str, first_contact: bool) -> None:
        """wait(seconds left) for a read of the receive, in libd with the GIL released; its
        failure said as the receive's (a timeout, a refused key, an owner out of reach)."""
        try:
            wait(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise TimeoutError(f"the receive of object {receive.obj_id} took longer than "
                               f"{self._timeout} s and was cancelled") from None
        except (PermissionError, ConnectionError) as e:
            receive.check()  # aborted meanwhile: that is what it ended with
            raise _refusal(e, impl, first_contact) from None

    def _begin(self, obj_id: str, routes: Optional[List[tuple]] = None) -> tuple:
        """A new receive of obj_id, listed for abort_transport, and whether it took `routes` for
        a direct receive: all of them if none is in use, else none (one look under the lock)."""
        receive = _Receive(obj_id)
        with self._lock:
            self._receiving.setdefault(obj_id, set()).add(receive)
            if routes is None or len(set(routes)) != len(routes) or any(r in self._routes for r in routes):
                return receive, False
            for r in routes:
                entry = self._routes[r] = _Route()
                entry.direct = True
            return receive, True

    def _end(self, receive: _Receive, routes: Optional[List[tuple]] = None) -> None:
        """The receive is over: unlisted, and the routes a direct receive took are let go of
        (a receive on the loop waiting for one is woken)."""
        wake = []
        with self._lock:
            receiving = self._receiving.get(receive.obj_id)
            if receiving is not None:
                receiving.discard(receive)
                if not receiving:
                    del self._receiving[receive.obj_id]
            for r in routes or ():
                entry = self._routes[r]
                entry.direct = False
                if entry.freed is not None:
                    wake.append(entry)
                if not entry.users:
                    del self._routes[r]
        for entry in wake:
            entry.loop.call_soon_threadsafe(entry.freed.set)

    def fetch_multiple_tensors(self, obj_id: str, tensor_transport_metadata: ScadTransportMetadata,
                               communicator_metadata: Any = None,
                               target_buffers: Optional[List[Any]] = None) -> ScadFetchRequest:
        """Starts reading every tensor of the object; returns at once. wait_fetch_complete waits."""
        out, reads = self._targets(tensor_transport_metadata, target_buffers)
        receive, _ = self._begin(obj_id)
        future = self._loop.submit(self._recv(receive, reads))
        return ScadFetchRequest(obj_id=obj_id, tensors=out, receive=receive, future=future)

    @staticmethod
    def _targets(meta: Any, target_buffers: Optional[List[Any]]) -> tuple:
        """The tensors to return and the (buffer, target memory) of each read, checked."""
        if not isinstance(meta, ScadTransportMetadata):
            raise TypeError(f"metadata of another transport ({type(meta).__name__}), not ScadTransportMetadata")
        listed = RdmaBuffer.from_json(meta.lent_list) if getattr(meta, "lent_list", "") else None
        if listed is None and len(meta.buffers) != len(meta.tensor_meta):
            raise ValueError(f"{len(meta.buffers)} buffers for {len(meta.tensor_meta)} tensors")
        if target_buffers is not None and len(target_buffers) != len(meta.tensor_meta):
            raise ValueError(f"{len(target_buffers)} target buffers for {len(meta.tensor_meta)} tensors")
        out, reads, pieces, at = [], [], [], 0
        texts = meta.buffers if listed is None else [""] * len(meta.tensor_meta)
        for i, ((shape, dtype), text) in enumerate(zip(meta.tensor_meta, texts)):
            if target_buffers is not None:
                target = target_buffers[i]
            elif _is_torch(dtype):
                import torch
                target = torch.empty(shape, dtype=dtype)
            else:
                target = numpy.empty(shape, dtype=dtype)
            out.append(target)
            local = _memory(target)
            if not local.flags.writeable:
                raise ValueError(f"target buffer {i} is read-only")
            if listed is not None:  # the list's next range, if the tensor has bytes
                lent = _nbytes_of(shape, dtype)
                if local.nbytes != lent:
                    raise ValueError(f"a target of {local.nbytes} bytes for tensor {i} of {lent}")
                if local.nbytes:
                    pieces.append(local)  # laid end to end: each on its own range of the list
                    at += local.nbytes
                continue
            if not text:
                if local.nbytes:
                    raise ValueError(f"tensor {i} is empty at the source and {local.nbytes} bytes here")
                continue  # an empty tensor: nothing to move
            buf = RdmaBuffer.from_json(text)
            if local.nbytes != buf.size():
                raise ValueError(f"a target of {local.nbytes} bytes for tensor {i} of {buf.size()}")
            reads.append((buf, local))
        if listed is not None:
            if at != listed.size():
                raise ValueError(f"targets of {at} bytes for a list of {listed.size()}")
            reads = [(listed, pieces)] if pieces else []
        return out, reads

    def wait_fetch_complete(self, fetch_request: ScadFetchRequest, timeout: Optional[float] = -1) -> List[Any]:
        """Waits for the receive (timeout: seconds, -1 or None for as long as it takes, 0 to
        poll) and returns its tensors; raises what it failed with. TimeoutError leaves the
        receive running: wait again, or drop the request to cancel it."""
        try:
            fetch_request.future.result(None if timeout is None or timeout < 0 else timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the receive of object {fetch_request.obj_id} has not finished") from None
        return fetch_request.tensors

    async def _recv(self, receive: _Receive, reads: List[tuple]) -> None:
        deadline = time.monotonic() + self._timeout
        try:
            await asyncio.gather(*(self._read(receive, buf, local, deadline) for buf, local in reads),
                                 return_exceptions=True)
            if receive.error is not None:
                raise receive.error
        except BaseException:
            _counters.add(failed_receives=1)
            raise
        finally:
            self._end(receive)
        _count_received(reads)

    async def _read(self, receive: _Receive, buf: RdmaBuffer, local: numpy.ndarray, deadline: float) -> None:
        manager = RdmaManager.get()
        async with self._route(buf.route):
            link = None
            try:
                receive.check()
                link, new = manager._link(buf)
                receive.track(link)
                attaches = new  # the read's start attaches the key (what fails there: never reached)
                if new and not manager._reached(buf):
                    # The first contact with this owner's server runs the handshake (an owner that
                    # does not answer holds it up to the deadline): in a thread, so that the loop
                    # serves other receives meanwhile, and an abort meanwhile is seen before the
                    # read starts. Later links to it connect with their first read.
                    try:
                        await wait_in_thread(link._t.connect)
                    except (PermissionError, ConnectionError) as e:
                        raise _refusal(e, link.impl, True) from None
                    attaches = False
                receive.start(lambda: manager._transfer_start(buf, local, 0, True, (link, attaches)))
                try:
                    await link.wait(max(0.0, deadline - time.monotonic()), self._busy_poll_us)
                except TimeoutError:
                    raise TimeoutError(f"the receive of object {receive.obj_id} took longer than {self._timeout} s "
                                       "and was cancelled") from None
                except (PermissionError, ConnectionError) as e:
                    raise _refusal(e, link.impl, attaches and not manager._reached(buf)) from None
                receive.check()  # cancelled before the wait began: nothing was waited for
                link.reusable = True  # done, nothing runs: may serve another buffer once let go of
                manager._mark_reached(buf)
                _counters.add(**{f"{link.impl}_reads": 1})
            except BaseException as e:
                receive.fail(e)
                raise
            finally:
                if link is not None:
                    receive.untrack(link)
                manager._release_link(buf)  # closed (what still runs is cancelled); the loan stays

    @contextlib.asynccontextmanager
    async def _route(self, route: tuple):
        """One receive at a time per buffer in this process (see _Route)."""
        with self._lock:
            entry = self._routes.get(route)
            if entry is None:
                entry = self._routes[route] = _Route()
            if entry.lock is None:
                entry.lock = asyncio.Lock()  # bound to the module's loop, the only one that awaits it
            entry.users += 1
        try:
            async with entry.lock:
                while True:
                    with self._lock:
                        if not entry.direct:
                            break
                        if entry.freed is None:
                            entry.freed, entry.loop = asyncio.Event(), asyncio.get_running_loop()
                        freed = entry.freed
                    await freed.wait()
                    with self._lock:
                        entry.freed = None
                yield
        finally:
            with self._lock:
                entry.users -= 1
                if not entry.users and not entry.direct:
                    del self._routes[route]

    def abort_transport(self, obj_id: str, communicator_metadata: Any = None) -> None:
        """Cancels this process's receives of the object in flight: they raise
        ConnectionAbortedError and their targets are not written afterwards. The source's loan
        stays (a one-sided source takes no part in a transfer); garbage_collect ends it."""
        slot = self._lone.get(obj_id)
        if slot is not None:
            slot.cancel()  # once it returns libd writes none of the target
        with self._lock:
            receives = list(self._receiving.get(obj_id, ()))
        for receive in receives:
            receive.abort()
