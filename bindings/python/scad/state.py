"""Intermediate state between the stages of an application, in memory elements or in Redis.

Stages of a data-heavy application hand each other arrays: one writes its output, later ones read
it. `open_state(action, args)` gives the same small interface over two stores, so that one
application's code runs both ways and only the storage differs:

  - "memory" (the default): the application's memory elements, reached through the action's
    transports with one-sided reads and writes straight from and into numpy arrays;
  - "redis": a Redis server (args["redis"], e.g. "redis://127.0.0.1:6379/0" or
    "unix:///run/redis.sock"), one key per slot, as functions pass state today.

An element (a transport name; in Redis a key prefix) is cut into `slots` equal slots, so that the
instances of a stage write side by side without coordinating: slot i holds an 8-byte length (plus
one: zero is a slot never written) and the array's bytes. Every call counts its bytes, operations and seconds (`counters()`), which the
applications return so that a benchmark can split data movement from compute; the time spent
asking the runtime for memory and giving it back (grow, release) is counted apart
(runtime_seconds).

    st = open_state(action, args)
    st.put("shards", i, array, slots=parts)           # this instance's output
    x = st.get("shards", j, numpy.float64, slots=parts)

get() returns a read-only array in both stores. On the element's host it is the slot itself, mapped
into the process (nothing copied, as Ray's object store hands out read-only views): it sees a later
put to the same slot, so read a slot once its writers are done (a stage reading its parents'
output), or pass copy=True for a private copy. Elsewhere (tcp, verbs) the bytes are read into a new
array.
"""
from __future__ import annotations

import struct
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy

_LEN = struct.Struct("<Q")


class StateError(RuntimeError):
    """A slot that does not fit its element, a slot never written, or a store that is unreachable."""


class _Counters:
    def __init__(self) -> None:
        self.read_bytes = self.write_bytes = self.ops = 0
        self.seconds = 0.0

    def add(self, t0: float, read: int = 0, written: int = 0) -> None:
        self.seconds += time.perf_counter() - t0
        self.read_bytes += read
        self.write_bytes += written
        self.ops += 1

    def as_dict(self) -> Dict[str, Any]:
        return {"read_bytes": self.read_bytes, "write_bytes": self.write_bytes, "ops": self.ops,
                "seconds": round(self.seconds, 6)}


def _bytes_of(array: numpy.ndarray) -> numpy.ndarray:
    """The array's bytes as a contiguous uint8 view (a copy only when it is not contiguous)."""
    return numpy.ascontiguousarray(array).reshape(-1).view(numpy.uint8)


class MemoryState:
    """State in the application's memory elements, through the action's transports.

    An element `grow` makes is a list of memory elements (segments), each asked of the runtime
    when the data outgrew the ones before: growing adds room and moves nothing, as a Redis server
    grows in place. A slot lies in one segment (grow by whole slots: the elastic job doubles its
    slots and its room together)."""

    kind = "memory"

    def __init__(self, action: Any) -> None:
        self._action = action
        self._transports: Dict[str, Any] = {}
        self._segments: Dict[str, List[Tuple[str, int]]] = {}  # element `grow` made -> [(transport, bytes)]
        self._generation = 0
        self._control = 0.0  # asking the runtime for memory and giving it back (not data movement)
        self._maps: Dict[str, Any] = {}  # transport -> its element mapped here (get), or None
        self._counters = _Counters()

    def _named(self, name: str):
        t = self._transports.get(name)
        if t is None:
            t = self._transports[name] = self._action.get_transport(name, "rdma")
        return t

    def _layout(self, element: str) -> List[Tuple[str, int]]:
        """The element's segments: [(transport, bytes)]; one, the element itself, unless grown."""
        segments = self._segments.get(element)
        if segments is None:
            segments = [(element, self._named(element).remote()[0])]
        return segments

    def _slot(self, element: str, index: int, slots: int):
        """(transport, offset in it, width) of slot `index` of `slots`."""
        segments = self._layout(element)
        size = sum(n for _, n in segments)
        if slots <= 0 or not 0 <= index < slots:
            raise StateError(f"slot {index} of {slots} in element {element!r}")
        width = size // slots
        if width <= _LEN.size:
            raise StateError(f"element {element!r} of {size} bytes has no room for {slots} slots")
        at = index * width
        for name, n in segments:
            if at < n:
                if at + width > n:
                    raise StateError(f"slot {index} of {slots} in element {element!r} spans two of its segments "
                                     "(grow it by whole slots)")
                return self._named(name), at, width
            at -= n
        raise StateError(f"slot {index} of {slots} is past the end of element {element!r}")  # not reached

    def put(self, element: str, index: int, array: numpy.ndarray, slots: int = 1) -> None:
        data = _bytes_of(array)
        t, base, width = self._slot(element, index, slots)
        if data.nbytes + _LEN.size > width:
            raise StateError(f"{data.nbytes} bytes do not fit slot {index} of element {element!r} "
                             f"({width - _LEN.size} bytes; the element holds {slots} slots)")
        head = numpy.empty(_LEN.size, dtype=numpy.uint8)
        _LEN.pack_into(head, 0, data.nbytes + 1)  # 0 is a slot never written (memory starts zeroed)
        t0 = time.perf_counter()
        # The array's own memory goes out as it is (no copy), then its length: a reader that
        # finds the length finds the bytes before it.
        if data.nbytes:
            t.reg_memory(data.ctypes.data, data.nbytes, keep=data)
            t.write(data.nbytes, base + _LEN.size)
        t.reg_memory(head.ctypes.data, head.nbytes, keep=head)
        t.write(head.nbytes, base)
        self._counters.add(t0, written=head.nbytes + data.nbytes)

    def _mapping(self, name: str, t: Any) -> Any:
        """The element's memory mapped into this process (shm over its pages), or None where the
        transport moves bytes on request (tcp, verbs): asked once per transport."""
        if name not in self._maps:
            try:
                self._maps[name] = t.map()
            except NotImplementedError:  # libd's EOPNOTSUPP
                self._maps[name] = None
        return self._maps[name]

    def get(self, element: str, index: int, dtype: Any, slots: int = 1, copy: bool = False) -> numpy.ndarray:
        t, base, width = self._slot(element, index, slots)
        t0 = time.perf_counter()
        mapped = None if copy else self._mapping(t.name, t)
        if mapped is not None and (t.state != "READY" or (base + _LEN.size) % numpy.dtype(dtype).alignment):
            # The grant ended (the read below says how), or the slot's bytes do not start where
            # the dtype may: a copy, aligned.
            mapped = None
        if mapped is not None:
            # Same host: the slot in place, read-only (as Redis' answer is), nothing copied.
            (stored,) = _LEN.unpack_from(mapped, base)
            length = stored - 1
            if stored == 0 or length + _LEN.size > width:
                raise StateError(f"slot {index} of element {element!r} holds no array")
            out = numpy.frombuffer(mapped, dtype=numpy.uint8, count=length, offset=base + _LEN.size)
            out.flags.writeable = False
            self._counters.add(t0, read=_LEN.size + length)
            return out.view(dtype)
        head = numpy.empty(_LEN.size, dtype=numpy.uint8)
        t.reg_memory(head.ctypes.data, head.nbytes, keep=head)
        t.read(head.nbytes, base)
        (stored,) = _LEN.unpack_from(head, 0)
        length = stored - 1
        if stored == 0 or length + _LEN.size > width:
            raise StateError(f"slot {index} of element {element!r} holds no array")
        out = numpy.empty(length, dtype=numpy.uint8)
        if length:
            t.reg_memory(out.ctypes.data, out.nbytes, keep=out)
            t.read(length, base + _LEN.size)
        self._counters.add(t0, read=head.nbytes + length)
        return out.view(dtype)

    def grow(self, element: str, template: str, size: int) -> None:
        """Makes `element` hold at least `size` bytes, keeping what it holds where it is: one more
        memory element from `template` (the runtime's invoke) for the rest. The first call makes
        the element."""
        segments = self._segments.setdefault(element, [])
        have = sum(n for _, n in segments)
        if have >= size:
            return
        self._generation += 1
        new = f"{element}-{self._generation}"
        c0 = time.perf_counter()
        try:
            self._action.runtime.invoke(template, new, {"size": int(size - have)})
        finally:
            self._control += time.perf_counter() - c0
        segments.append((new, int(size - have)))

    def release(self, element: str) -> None:
        """Gives back every segment of an element `grow` made."""
        for name, _ in self._segments.pop(element, []):
            c0 = time.perf_counter()
            self._transports.pop(name, None)
            self._maps.pop(name, None)  # arrays got from it keep their mapping alive
            self._action.runtime.release(name)
            self._control += time.perf_counter() - c0

    def counters(self) -> Dict[str, Any]:
        return dict(self._counters.as_dict(), runtime_seconds=round(self._control, 6))


class RedisState:
    """State in a Redis server: slot i of element e is the key "{run}:{e}:{i}"."""

    kind = "redis"

    def __init__(self, url: str, run: str) -> None:
        import redis  # the package registry's client; only the Redis variant needs it

        self._db = redis.Redis.from_url(url)
        self._run = run
        self._counters = _Counters()

    def _key(self, element: str, index: int, slots: int) -> str:
        if slots <= 0 or not 0 <= index < slots:
            raise StateError(f"slot {index} of {slots} in element {element!r}")
        return f"{self._run}:{element}:{index}"

    def put(self, element: str, index: int, array: numpy.ndarray, slots: int = 1) -> None:
        data = _bytes_of(array)
        key = self._key(element, index, slots)
        t0 = time.perf_counter()
        self._db.set(key, memoryview(data))
        self._counters.add(t0, written=data.nbytes)

    def get(self, element: str, index: int, dtype: Any, slots: int = 1, copy: bool = False) -> numpy.ndarray:
        key = self._key(element, index, slots)
        t0 = time.perf_counter()
        raw = self._db.get(key)
        if raw is None:
            raise StateError(f"slot {index} of element {element!r} holds no array (no key {key})")
        self._counters.add(t0, read=len(raw))
        out = numpy.frombuffer(raw, dtype=numpy.uint8)  # read-only: the client's own bytes
        return (out.copy() if copy else out).view(dtype)

    def grow(self, element: str, template: str, size: int) -> None:
        """Redis grows by itself."""

    def release(self, element: str) -> None:
        """Deletes the element's keys."""
        t0 = time.perf_counter()
        keys = list(self._db.scan_iter(f"{self._run}:{element}:*"))
        if keys:
            self._db.delete(*keys)
        self._counters.add(t0)

    def counters(self) -> Dict[str, Any]:
        return self._counters.as_dict()


def open_state(action: Any, args: Dict[str, Any]) -> Any:
    """The store the invocation asked for: args["storage"] is "memory" (default) or "redis"; the
    Redis variant reads args["redis"] (its URL) and args["run"] (a key prefix unique to the run)."""
    kind = args.get("storage", "memory")
    if kind == "memory":
        return MemoryState(action)
    if kind == "redis":
        url: Optional[str] = args.get("redis")
        if not url:
            raise StateError('storage "redis" needs args["redis"], the server\'s URL')
        return RedisState(url, str(args.get("run", "run")))
    raise StateError(f'storage must be "memory" or "redis", not {kind!r}')


def carried(args: Dict[str, Any], *parents: str) -> Dict[str, Dict[str, Any]]:
    """The counters the given parent stages carried ("states" in their results: instance -> its
    counters), merged. A stage sees only its parents' results, so each passes on its ancestors'
    counters with its own, and the last one sums them once (merge_counters)."""
    out: Dict[str, Dict[str, Any]] = {}
    for parent in parents:
        for result in args.get(parent, []):
            out.update(result.get("states", {}))
    return out


def merge_counters(*parts: Dict[str, Any]) -> Dict[str, Any]:
    """The sum of several stages' or instances' counters."""
    total = {"read_bytes": 0, "write_bytes": 0, "ops": 0, "seconds": 0.0, "runtime_seconds": 0.0}
    for p in parts:
        for k in total:
            total[k] += p.get(k, 0)
    total["seconds"] = round(total["seconds"], 6)
    total["runtime_seconds"] = round(total["runtime_seconds"], 6)
    return total
