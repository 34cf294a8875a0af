"""RdmaMetadata: the record a passive operation hands its peer (over any channel), as JSON.

It holds the grant of each descriptor: the memory server's address, the grant's id and secret, the
size, the direction (READ: the peer may read; WRITE: the peer may write), the notification key
and an expiry. Descriptors in a row under the same grant are the ranges of one list the owner
lent as one element, in order (the first starts at 0, each next where the last ended); in the
JSON the ones after the first carry only their size and device. The
owner's libd enforces all of it: a grant opens exactly its descriptors' bytes, in that direction, until the operation ends or the expiry passes. Nothing in it reaches
other memory. The secret makes the record a bearer token: send it only to the intended peer,
over a channel you trust; repr() and str() never show it.
"""
from __future__ import annotations

import functools
import json
import re
from json.encoder import encode_basestring
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._memserver import from_binding, loads_record
from ._operation_kind import OperationKind

VERSION = 2  # 2: descriptors after the first under one grant carry only size and device
_READS = (1, 2)  # records written by either version read the same here
_str = encode_basestring  # a JSON string, quoted and escaped (json's own C encoder)
_FIELDS = frozenset({"version", "operation_kind", "notification_key", "owner", "hostname", "host", "port", "path",
                     "verbs", "expires_at", "descriptors"})
_DESCRIPTOR_FIELDS = frozenset({"size", "device", "grant", "secret"})
_NEXT_RANGE_FIELDS = frozenset({"size", "device"})  # a descriptor under the grant of the one before
_FIELD_TYPES = (("notification_key", str), ("owner", str), ("hostname", str), ("host", str), ("port", int),
                ("path", str), ("verbs", bool), ("expires_at", (int, float)))
_NOTIFICATION_KEY = re.compile(r"[0-9a-f]{16}")


def _config_value_ok(value: Any) -> bool:
    """A value that may go into a libd configuration string: a non-empty str without its
    separators (two `in` tests: a regular expression's match took twice as long, per grant)."""
    return type(value) is str and value != "" and ";" not in value and "," not in value


@functools.lru_cache(maxsize=64)
def _owner_fields(owner: str, hostname: str, host: str, port: int, path: str, verbs: bool) -> str:
    return json.dumps({"owner": owner, "hostname": hostname, "host": host, "port": port, "path": path,
                       "verbs": verbs}, separators=(",", ":"))[1:-1]


def _owner_part(md: "RdmaMetadata") -> str:
    return _owner_fields(md.owner, md.hostname, md.host, int(md.port), md.path, bool(md.verbs))


def owner_part(owner: str, hostname: str, endpoint: dict) -> str:
    """The owner's fields of every record a memory server's operations hand out, as JSON (the
    middle of the text): for a lender to keep and write its records with (one_grant_record)."""
    return _owner_fields(owner, hostname, endpoint["host"], int(endpoint["port"]), endpoint["path"],
                         bool(endpoint["verbs"]))


def one_grant_record(kind: int, key: str, owner_fields: str, expires_at: float, size: int, grant: str,
                     secret: str) -> str:
    """to_json()'s text for the record of a passive operation of one host-memory descriptor,
    written at once by its owner: the notification key is hex, and libd's grant ids and secrets
    are letters, digits and '_', so nothing in it needs escaping. owner_fields: owner_part()."""
    return (f'{{"version":{VERSION},"operation_kind":{kind},"notification_key":"{key}",{owner_fields},'
            f'"expires_at":{expires_at!r},"descriptors":[{{"size":{size},"device":"cpu","grant":"{grant}",'
            f'"secret":"{secret}"}}]}}')


class SerializedDescriptor(NamedTuple):
    """One remote descriptor: its size, device, and the grant that opens it (alone, or with the
    descriptors beside it under the same grant). A tuple: a record of many is made often."""

    size: int
    grant: str
    secret: str
    device: str = "cpu"

    def __repr__(self) -> str:  # never the secret
        return f"SerializedDescriptor(size={self.size}, grant={self.grant!r}, device={self.device!r})"

    __str__ = __repr__


@dataclass(frozen=True)
class RdmaMetadata:
    operation_kind: int
    notification_key: str
    owner: str        # the owning Connector's name
    hostname: str     # the owner's host: a peer on the same host uses shared memory
    host: str         # the owner's memory server: tcp address and port, unix socket
    port: int
    path: str
    expires_at: float  # seconds since the epoch; the owner revokes the grants then
    descriptors: tuple = ()
    verbs: bool = False  # the owner's server also takes RDMA verbs connections
    version: int = VERSION

    @staticmethod
    def owner_fields(owner: str, hostname: str, endpoint: dict) -> dict:
        """The fields every record of one owner's operations holds alike (for owned())."""
        return {"owner": owner, "hostname": hostname, "host": endpoint["host"], "port": int(endpoint["port"]),
                "path": endpoint["path"], "verbs": bool(endpoint["verbs"]), "version": VERSION}

    @classmethod
    def owned(cls, common: dict, kind: int, key: str, expires_at: float, descriptors: tuple) -> "RdmaMetadata":
        """made() for a passive operation's own record: its owner's fields (owner_fields()) and
        its own."""
        md = object.__new__(cls)
        fields = md.__dict__
        fields.update(common)
        fields["operation_kind"] = kind
        fields["notification_key"] = key
        fields["expires_at"] = expires_at
        fields["descriptors"] = descriptors
        return md

    @classmethod
    def made(cls, **fields: Any) -> "RdmaMetadata":
        """A record from fields this side made and checked already (a passive operation's own,
        or a parsed record's): filled as the dataclass's __init__ fills it, without a frozen
        setattr per field."""
        md = object.__new__(cls)
        md.__dict__.update(fields)
        md.__dict__.setdefault("version", VERSION)
        return md

    # The record travels as JSON only (a peer that unpickles what it is sent runs what it is
    # sent): pickling it is refused. Frozen, it is its own copy.
    def __reduce_ex__(self, protocol: int):
        raise TypeError("RdmaMetadata is not pickled: send metadata.to_json() and read it with RdmaMetadata.from_json()")

    def __copy__(self) -> "RdmaMetadata":
        return self

    def __deepcopy__(self, memo: dict) -> "RdmaMetadata":
        return self

    # ---- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "operation_kind": int(self.operation_kind),
            "notification_key": self.notification_key,
            "owner": self.owner,
            "hostname": self.hostname,
            "host": self.host,
            "port": self.port,
            "path": self.path,
            "verbs": self.verbs,
            "expires_at": self.expires_at,
            "descriptors": [{"size": d.size, "device": d.device} if i and d.grant == self.descriptors[i - 1].grant
                            else {"size": d.size, "device": d.device, "grant": d.grant, "secret": d.secret}
                            for i, d in enumerate(self.descriptors)],
        }

    def to_json(self) -> str:
        text = self.__dict__.get("_text")  # written by the owner as it made the record (one_grant_record)
        if text is not None:
            return text
        # The same text json.dumps(self.to_dict()) gives, written out directly: a record goes out
        # with every operation, and most of it (the owner's part) is the same every time.
        parts, grant = [], None
        for d in self.descriptors:
            if d.grant == grant:  # the next range of the same list
                parts.append(f'{{"size":{int(d.size)},"device":{_str(d.device)}}}')
            else:
                parts.append(f'{{"size":{int(d.size)},"device":{_str(d.device)},"grant":{_str(d.grant)},'
                             f'"secret":{_str(d.secret)}}}')
                grant = d.grant
        descs = ",".join(parts)
        return (f'{{"version":{int(self.version)},"operation_kind":{int(self.operation_kind)},'
                f'"notification_key":{_str(self.notification_key)},{_owner_part(self)},'
                f'"expires_at":{float(self.expires_at)!r},"descriptors":[{descs}]}}')

    # pydantic's names, for code written against dynamo.nixl_connect's pydantic model
    def model_dump_json(self) -> str:
        return self.to_json()

    @classmethod
    def model_validate_json(cls, text: str | bytes) -> "RdmaMetadata":
        return cls.from_json(text)

    @classmethod
    def from_json(cls, text: str | bytes) -> "RdmaMetadata":
        scan = from_binding("scan_connect_record")
        if scan is not None:
            fields = scan(text)  # a record as to_json writes it, read and checked in one pass
            if fields is not None:
                kind, key, owner, hostname, host, port, path, verbs, expires_at, descs = fields
                return cls.made(operation_kind=kind, notification_key=key, owner=owner, hostname=hostname, host=host,
                                port=port, path=path, expires_at=expires_at,
                                descriptors=tuple([SerializedDescriptor(*d) for d in descs]), verbs=verbs)
        try:
            raw = loads_record(text)
        except (TypeError, ValueError) as e:
            raise ValueError(f"RdmaMetadata: not JSON ({e})") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: Any) -> "RdmaMetadata":
        if not isinstance(raw, dict):
            raise ValueError("RdmaMetadata: expected a JSON object")
        version = raw.get("version")
        if type(version) is not int or version not in _READS:
            raise ValueError(f"RdmaMetadata: version {raw.get('version')!r} (this side reads {_READS})")
        want = _FIELDS
        if raw.keys() != want:
            extra, missing = sorted(set(raw) - want), sorted(want - set(raw))
            raise ValueError(f"RdmaMetadata: unexpected fields {extra}, missing {missing}")
        kind = raw["operation_kind"]
        # An integer (or an OperationKind, from a dict made in code), never a bool or a float.
        if not isinstance(kind, int) or isinstance(kind, bool) or not (kind == 1 or kind == 2):
            raise ValueError(f"RdmaMetadata: operation_kind {kind!r} is neither READ (1) nor WRITE (2)")
        kind = int(kind)
        descs = raw["descriptors"]
        if type(descs) is not list or not descs:
            raise ValueError("RdmaMetadata: no descriptors")
        parsed = []
        grant = secret = None
        for d in descs:
            if type(d) is not dict:
                raise ValueError("RdmaMetadata: a descriptor must be an object")
            keys = d.keys()
            if keys == _DESCRIPTOR_FIELDS:
                grant, secret = d["grant"], d["secret"]
                # Both end up in a libd configuration string: its separators must not appear.
                if not _config_value_ok(grant):
                    raise ValueError("RdmaMetadata: a descriptor's grant is malformed")
                if not _config_value_ok(secret):
                    raise ValueError("RdmaMetadata: a descriptor's secret is malformed")
            elif keys != _NEXT_RANGE_FIELDS or grant is None or version < 2:
                raise ValueError("RdmaMetadata: a descriptor needs exactly size, device, grant and secret "
                                 "(or size and device only, after one under the same grant)")
            size = d["size"]
            if type(size) is not int or size <= 0:
                raise ValueError("RdmaMetadata: a descriptor's size must be a positive integer")
            parsed.append(SerializedDescriptor(size, grant, secret, d["device"]))
        # Every field at once (a peer reads a record per operation); which one is wrong, only when one is.
        key, owner, hostname, host = raw["notification_key"], raw["owner"], raw["hostname"], raw["host"]
        port, path, verbs, expires_at = raw["port"], raw["path"], raw["verbs"], raw["expires_at"]
        if not (type(key) is str and type(owner) is str and type(hostname) is str and type(host) is str
                and type(port) is int and type(path) is str and type(verbs) is bool
                and type(expires_at) in (int, float)):
            for name, typ in _FIELD_TYPES:
                if not isinstance(raw[name], typ):
                    raise ValueError(f"RdmaMetadata: field {name!r} has the wrong type")
        if not _NOTIFICATION_KEY.fullmatch(key):
            raise ValueError("RdmaMetadata: notification_key must be 16 lower-case hex digits")
        joined = host + path
        if ";" in joined or "," in joined:
            for name in ("host", "path"):
                if ";" in raw[name] or "," in raw[name]:
                    raise ValueError(f"RdmaMetadata: field {name!r} is malformed")
        return cls.made(operation_kind=kind, notification_key=key, owner=owner, hostname=hostname, host=host,
                        port=port, path=path, expires_at=float(expires_at), descriptors=tuple(parsed), verbs=verbs)

    def __repr__(self) -> str:
        kind = OperationKind(self.operation_kind).name
        return (f"RdmaMetadata({kind}, owner={self.owner!r}, hostname={self.hostname!r}, "
                f"descriptors={[d.size for d in self.descriptors]}, expires_at={self.expires_at:.0f})")

    __str__ = __repr__
