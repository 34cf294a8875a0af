"""RdmaBuffer: a light handle on a slice of another process's registered memory.

It travels as JSON (to_json/from_json) or by pickle (which carries the same JSON, never code).
It holds the owner's server address, the slice's place in its region, and the slice's scoped key
(the id and secret of a grant on exactly that slice): whoever holds it may read and write those
bytes (read only, for read-only memory) until the owner drops it. repr() never shows the secret.
The owner's own handle (LentBuffer) makes its key when it first needs it.

A buffer over several memories (request_buffer with a list) is their bytes end to end under one
key; it also carries the size of each (`ranges`, record version 2), since one transfer moves
within one of them: reads and writes are cut where they meet.
"""
from __future__ import annotations

import functools
import itertools
import json
from json.encoder import encode_basestring
from typing import Any, Optional, Sequence, Tuple

from .._memserver import MAX_RANGES, from_binding, loads_record

VERSION = 1  # a buffer over one memory
LIST_VERSION = 2  # over several: the fields of version 1 and "ranges"
_FIELDS = frozenset({"version", "owner", "hostname", "host", "port", "path", "verbs", "grant", "secret", "offset",
                     "size", "whole"})
_LIST_FIELDS = _FIELDS | {"ranges"}
_TYPES = (("owner", str), ("hostname", str), ("host", str), ("port", int), ("path", str), ("verbs", bool),
          ("grant", str), ("secret", str), ("offset", int), ("size", int), ("whole", bool))
_CONFIG_FIELDS = ("host", "path", "grant", "secret")
_str = encode_basestring  # a JSON string, quoted and escaped (json's own C encoder)


@functools.lru_cache(maxsize=64)
def _owner_part(owner: str, hostname: str, host: str, port: int, path: str, verbs: bool) -> str:
    return json.dumps({"owner": owner, "hostname": hostname, "host": host, "port": port, "path": path,
                       "verbs": verbs}, separators=(",", ":"))[1:-1]


def record_head(place: tuple) -> str:
    """What the record of every buffer a server lends starts with, up to its grant id's text:
    place is (owner, hostname, host, port, path, verbs) of that server."""
    return f'{{"version":{VERSION},{_owner_part(*place)},"grant":"'


def lent_record(head: str, key: tuple, offset: int, size: int, whole: bool) -> str:
    """The record of a slice a server lends, after its head (record_head): key is (grant id,
    secret), libd's (letters, digits and '_': nothing in them to escape)."""
    return (f'{head}{key[0]}","secret":"{key[1]}","offset":{offset},"size":{size},'
            f'"whole":{"true" if whole else "false"}}}')


def _checked_ranges(ranges: Sequence[int], size: int, offset: int) -> Tuple[int, ...]:
    """The sizes of a buffer over several memories, checked: 1..MAX_RANGES positive integers that
    make up the whole buffer (such a buffer is a whole lent element: offset 0)."""
    if (not isinstance(ranges, (list, tuple)) or not 1 <= len(ranges) <= MAX_RANGES
            or any(type(n) is not int or n <= 0 for n in ranges)):
        raise ValueError(f"RdmaBuffer: ranges must be 1..{MAX_RANGES} positive sizes")
    if sum(ranges) != size or offset != 0:
        raise ValueError("RdmaBuffer: the ranges do not make up the buffer")
    return tuple(ranges)


_Manager: Any = None


def _manager() -> Any:
    """This process's RdmaManager (its module imports this one: looked up on first use)."""
    global _Manager
    if _Manager is None:
        from ._manager import RdmaManager
        _Manager = RdmaManager
    return _Manager.get()


class RdmaBuffer:
    def __init__(self, *, owner: str, hostname: str, host: str, port: int, path: str, verbs: bool, grant: str,
                 secret: str, offset: int, size: int, whole: bool, ranges: Optional[Sequence[int]] = None) -> None:
        self._fill(owner, hostname, host, port, path, verbs, grant, secret, offset, size, whole, ranges)

    def _fill(self, owner: str, hostname: str, host: str, port: int, path: str, verbs: bool, grant: str,
              secret: str, offset: int, size: int, whole: bool, ranges: Optional[Sequence[int]]) -> None:
        self.owner, self.hostname, self.host, self.port, self.path = owner, hostname, host, port, path
        self.verbs, self.grant, self._secret = verbs, grant, secret
        self.offset, self._size, self.whole = offset, size, whole
        # The size of each memory of a buffer over several (None: one memory), and where each ends.
        self.ranges: Optional[Tuple[int, ...]] = None if ranges is None else _checked_ranges(ranges, size, offset)
        self._ends = (size,) if self.ranges is None else tuple(itertools.accumulate(self.ranges))

    def size(self) -> int:
        """Bytes in the slice."""
        return self._size

    def has_key(self) -> bool:
        """Whether the handle carries its key already: always, but for the owner's own handle
        before its record was first written (its key is made then)."""
        return True

    @property
    def route(self) -> tuple:
        """What a link to this buffer is bound to: its owner's server and its key."""
        return (self.host, self.port, self.path, self.grant)

    def range_ends(self) -> Tuple[int, ...]:
        """Where each of its memories ends, as offsets in the buffer (one entry for one memory)."""
        return self._ends

    async def read_into(self, dst: Any, offset: int = 0, timeout: Optional[float] = 3.0) -> None:
        """Copies this buffer's bytes [offset, offset+len(dst)) into dst (local memory: a numpy
        array, bytearray, writable memoryview, CPU tensor or Descriptor; or a list of them, filled
        in order from offset, in one transfer). On timeout the transfer is cancelled (dst is not
        written afterwards) and TimeoutError raised."""
        await _manager().transfer(self, dst, offset, timeout, read=True)

    async def write_from(self, src: Any, offset: int = 0, timeout: Optional[float] = 3.0) -> None:
        """Copies src (local memory, or a list of it, in order) into this buffer at offset."""
        await _manager().transfer(self, src, offset, timeout, read=False)

    def drop(self) -> None:
        """In the owner: revokes the slice's key at once (peers holding it are cut off) and
        releases its memory when the region has no buffer left. Elsewhere: lets go of this
        process's link to it (a transfer of it still running is cancelled); the owner's grant
        stays."""
        _manager().drop(self)

    # ---- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = {"version": VERSION if self.ranges is None else LIST_VERSION, "owner": self.owner,
               "hostname": self.hostname, "host": self.host, "port": self.port, "path": self.path, "verbs": self.verbs,
               "grant": self.grant, "secret": self._secret, "offset": self.offset, "size": self._size,
               "whole": self.whole}
        if self.ranges is not None:
            out["ranges"] = list(self.ranges)
        return out

    def to_json(self, with_ranges: bool = True) -> str:
        """The record. with_ranges=False: a version-1 record, which readers of either version take,
        for a reader that knows the memories' sizes otherwise (it then cuts its transfers there)."""
        # The same text as json.dumps(self.to_dict(), separators=(",", ":")), written out
        # directly: a buffer's record goes out with every transfer a peer is to make, and its
        # owner's part is the same every time.
        version, ranges = VERSION, ""
        if self.ranges is not None and with_ranges:
            version, ranges = LIST_VERSION, f',"ranges":[{",".join(str(int(n)) for n in self.ranges)}]'
        return (f'{{"version":{version},{_owner_part(self.owner, self.hostname, self.host, self.port, self.path, self.verbs)},'
                f'"grant":{_str(self.grant)},"secret":{_str(self._secret)},"offset":{int(self.offset)},'
                f'"size":{int(self._size)},"whole":{"true" if self.whole else "false"}{ranges}}}')

    @classmethod
    def from_json(cls, text: str | bytes) -> "RdmaBuffer":
        scan = from_binding("scan_buffer_record")
        if scan is not None:
            fields = scan(text)  # a record as to_json writes it, read and checked in one pass
            if fields is not None:
                buf = cls.__new__(cls)
                buf._fill(*fields)  # the ranges are checked there, as below
                return buf
        try:
            raw = loads_record(text)
        except (TypeError, ValueError) as e:
            raise ValueError(f"RdmaBuffer: not JSON ({e})") from None
        if type(raw) is not dict:
            raise ValueError("RdmaBuffer: expected a JSON object")
        version = raw.get("version")
        if type(version) is not int or version not in (VERSION, LIST_VERSION):
            raise ValueError(f"RdmaBuffer: version {version!r} (this side reads {VERSION} and {LIST_VERSION})")
        fields = _FIELDS if version == VERSION else _LIST_FIELDS
        if raw.keys() != fields:
            raise ValueError(f"RdmaBuffer: version {version} has exactly the fields {sorted(fields)}")
        # Every field at once (a peer reads a record per transfer); which one is wrong, only when one is.
        owner, hostname, host, port, path = raw["owner"], raw["hostname"], raw["host"], raw["port"], raw["path"]
        verbs, grant, secret = raw["verbs"], raw["grant"], raw["secret"]
        offset, size, whole = raw["offset"], raw["size"], raw["whole"]
        if not (type(owner) is str and type(hostname) is str and type(host) is str and type(port) is int
                and type(path) is str and type(verbs) is bool and type(grant) is str and type(secret) is str
                and type(offset) is int and type(size) is int and type(whole) is bool):
            for key, typ in _TYPES:
                if type(raw[key]) is not typ:  # exactly: JSON's true is no port, offset or size
                    raise ValueError(f"RdmaBuffer: field {key!r} has the wrong type")
        joined = host + path + grant + secret  # they end up in a libd configuration string
        if ";" in joined or "," in joined:
            for key in _CONFIG_FIELDS:
                if ";" in raw[key] or "," in raw[key]:
                    raise ValueError(f"RdmaBuffer: field {key!r} is malformed")
        if offset < 0 or size <= 0 or not grant or not secret:
            raise ValueError("RdmaBuffer: offset, size, grant or secret out of range")
        ranges = None
        if version == LIST_VERSION:
            ranges = raw["ranges"]
            if type(ranges) is not list:
                raise ValueError(f"RdmaBuffer: ranges must be 1..{MAX_RANGES} positive sizes")
        buf = cls.__new__(cls)
        buf._fill(owner, hostname, host, port, path, verbs, grant, secret, offset, size, whole, ranges)
        return buf

    def __reduce__(self):
        return (RdmaBuffer.from_json, (self.to_json(),))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RdmaBuffer) and other.to_dict() == self.to_dict()

    def __hash__(self) -> int:
        return hash(self.route + (self.offset, self._size))

    def __repr__(self) -> str:
        ranges = "" if self.ranges is None else f", ranges={len(self.ranges)}"
        return f"RdmaBuffer(owner={self.owner!r}, size={self._size}, offset={self.offset}{ranges})"


class LentBuffer(RdmaBuffer):
    """A buffer as its owner's request_buffer returns it: its key is made when it is first needed
    (the handle serialised, compared, or moved through), not when the memory is registered, as
    NIXL's registration makes no key until its metadata is exported. A lender that registers
    memory it never hands out pays for no key; one that does pays for it once, at to_json. A
    handle dropped before its key was made gets one no owner knows of: a record of it is refused,
    as a dropped buffer's is."""

    def _lend(self, manager: Any, region: Any, token: str, place: tuple, offset: int, size: int, whole: bool,
              rights: str) -> None:
        """place: (owner, hostname, host, port, path, verbs) of the lender's server; rights: its
        key's ("r" for read-only memory, else "rw")."""
        self._rights = rights
        self.owner, self.hostname, self.host, self.port, self.path, self.verbs = place
        self.offset, self._size, self.whole = offset, size, whole
        self.ranges, self._ends = None, (size,)
        self._key: Optional[Tuple[str, str]] = None  # (grant id, secret), once made
        self._lender, self._region, self.token = manager, region, token

    @property  # type: ignore[override]
    def grant(self) -> str:
        key = self._key
        return (key if key is not None else self._lender._mint(self))[0]

    @property
    def _secret(self) -> str:  # type: ignore[override]
        key = self._key
        return (key if key is not None else self._lender._mint(self))[1]

    def to_json(self, with_ranges: bool = True) -> str:
        """The record (RdmaBuffer.to_json), its key made now if it has none yet. A lent buffer
        covers one memory, and its key's id and secret are libd's (letters, digits and '_'):
        nothing in them to escape."""
        key = self._key
        if key is None:
            key = self._lender._mint(self)
        return lent_record(self._lender._record_head, key, self.offset, self._size, self.whole)

    def drop(self) -> None:
        """Revokes the slice's key (peers holding it are cut off) and releases its memory when
        the region has no buffer left. In a child forked after it was lent, the buffer is the
        parent's: the child lets go of its own link to it, if it made one, and nothing else."""
        lender = self._lender
        if not lender._forked():
            lender._end_loan(self.token, self._key)
        elif self._key is not None:
            _manager().drop(self)  # the child's own manager: not the owner, it forgets its link

    def has_key(self) -> bool:
        """Whether its key has been made (a record of it, or a transfer, asked for it)."""
        return self._key is not None

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: D107 - made by request_buffer only
        raise TypeError("a LentBuffer is made by RdmaManager.request_buffer; build an RdmaBuffer from a record instead")

    @classmethod
    def from_json(cls, text: "str | bytes") -> RdmaBuffer:
        """The handle a record describes: a plain RdmaBuffer (the key in the record)."""
        return RdmaBuffer.from_json(text)
