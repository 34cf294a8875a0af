"""The metadata Ray's tensor transports exchange, with Ray's names, usable without Ray."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple

import numpy

try:  # with Ray installed, ours are Ray's classes, so Ray accepts them as they are
    from ray.experimental.rdt.tensor_transport_manager import (CommunicatorMetadata, FetchRequest,
                                                               TensorTransportMetadata)
except ImportError:  # pragma: no cover - depends on the environment
    @dataclass
    class CommunicatorMetadata:
        """Metadata for the communicator (a one-sided transport needs none)."""

    @dataclass
    class TensorTransportMetadata:
        """Shapes and dtypes of an object's tensors, and their device."""

        tensor_meta: List[Tuple[Any, Any]]
        tensor_device: Optional[str] = None

    @dataclass
    class FetchRequest:
        """A receive started by fetch_multiple_tensors, for wait_fetch_complete."""

        obj_id: str
        tensors: List[Any]


@dataclass
class ScadTransportMetadata(TensorTransportMetadata):
    """Adds how the destination reads the tensors: `lent_list`, one RdmaBuffer (as JSON) over all
    the non-empty ones lent as a list, in order, read with one transfer; or else `buffers`, per
    tensor, the RdmaBuffer through which it is read ("" for an empty tensor)."""

    buffers: List[str] = field(default_factory=list)
    lent_list: str = ""

    def __reduce_ex__(self, protocol: int):
        # Pickled (Ray pickles it for every object) as its four fields, numpy's plain dtypes by
        # name: a dtype pickled as itself is a reduce of its own, a fifth of the record's cost.
        # The common record, one tensor read through one buffer, goes flat (_rebuild_one: no
        # list or pair to pickle around its fields, half the pickle's cost). Only the record as
        # extract_tensor_transport_metadata makes it (a list of (shape, dtype) pairs, no dtype
        # given as a string); anything else (a subclass, attributes set on it) pickles as a
        # dataclass does.
        fields = self.__dict__
        if type(self) is ScadTransportMetadata and len(fields) == 4:  # these four and no other:
            meta, buffers, lent_list = fields.get("tensor_meta"), fields.get("buffers"), fields.get("lent_list")
            if type(meta) is list and type(buffers) is list and type(lent_list) is str and "tensor_device" in fields:
                if len(meta) == 1 and len(buffers) == 1 and type(buffers[0]) is str and lent_list == "":
                    pair = meta[0]
                    if type(pair) is tuple and len(pair) == 2 and type(pair[1]) is not str:
                        return (_rebuild_one, (pair[0], _dtype_name(pair[1]), fields["tensor_device"], buffers[0]))
                if all(type(m) is tuple and len(m) == 2 and type(m[1]) is not str for m in meta):
                    return (_rebuild, ([(shape, _dtype_name(dtype)) for shape, dtype in meta],
                                       fields["tensor_device"], buffers, lent_list))
        return super().__reduce_ex__(protocol)


_FIELDS = frozenset({"tensor_meta", "tensor_device", "buffers", "lent_list"})
_PLAIN = frozenset("?bBhHiIlLqQefdgFDG")  # numpy's type codes for booleans, integers, floats, complex
_DTYPES: Dict[str, Any] = {}  # name -> numpy dtype, for the names unpickled so far (a few)
_NAMES: Dict[int, Tuple[Any, str]] = {}  # id of a plain numpy dtype -> (that dtype, its name), for those pickled so far


def _plain(dtype: Any) -> bool:
    """A numpy dtype its name ("<f4", ">i8") makes again exactly: no fields, no subarray, no
    metadata, no Python objects."""
    return dtype.char in _PLAIN and dtype.metadata is None


def _dtype_name(dtype: Any) -> Any:
    """A plain numpy dtype's name; any other dtype (torch's, a structured one) as is."""
    # By identity first: numpy hands out one object per plain dtype (an array's float32 is
    # numpy.dtype("f4") itself), and its name is made anew on every look (a quarter of the
    # pickle's cost). The entry holds the dtype, so its id cannot be another's.
    known = _NAMES.get(id(dtype))
    if known is not None and known[0] is dtype:
        return known[1]
    if not isinstance(dtype, numpy.dtype) or not _plain(dtype):
        return dtype
    name = dtype.str
    if len(_NAMES) < 64:  # plain dtypes are few: anything past that is named each time
        _NAMES[id(dtype)] = (dtype, name)
    return name


def _dtype_of(name: Any) -> Any:
    if type(name) is not str:
        return name
    dtype = _DTYPES.get(name)
    if dtype is None:
        try:
            dtype = numpy.dtype(name)
        except (TypeError, ValueError, SyntaxError):  # numpy parses some names as Python literals
            dtype = None
        # Only the name _dtype_name writes ("<f4", "|b1"): numpy also takes aliases and oddities
        # ("\x00" is its bool), none of which a pickle of ours holds.
        if dtype is None or not _plain(dtype) or dtype.str != name:
            raise ValueError(f"ScadTransportMetadata: {name[:64]!r} is not a plain numpy dtype's name")
        if len(_DTYPES) < 64:  # plain dtypes are few: anything past that is looked up each time
            _DTYPES[name] = dtype
    return dtype


def _metadata_of(tensor_meta: list, tensor_device: Optional[str], buffers: List[str], lent_list: str) -> "ScadTransportMetadata":
    """ScadTransportMetadata(tensor_meta=..., tensor_device=..., buffers=..., lent_list=...), its
    fields set directly: the dataclass's own __init__ is Python made at run time, and a lender
    and a receiver make one per object. (Where Ray's class has fields of its own beyond these,
    its __init__ fills them.)"""
    if not _FOUR_FIELDS:
        return ScadTransportMetadata(tensor_meta=tensor_meta, tensor_device=tensor_device, buffers=buffers,
                                     lent_list=lent_list)
    meta = _new(ScadTransportMetadata)
    meta.tensor_meta, meta.tensor_device, meta.buffers, meta.lent_list = tensor_meta, tensor_device, buffers, lent_list
    return meta


_new = object.__new__
_FOUR_FIELDS = {f.name for f in fields(ScadTransportMetadata)} == _FIELDS


def _rebuild(tensor_meta: list, tensor_device: Optional[str], buffers: List[str], lent_list: str) -> "ScadTransportMetadata":
    return _metadata_of([(shape, _dtype_of(name)) for shape, name in tensor_meta], tensor_device, buffers, lent_list)


def _rebuild_one(shape: Any, dtype: Any, tensor_device: Optional[str], buffer: str) -> "ScadTransportMetadata":
    """The record of one tensor read through one buffer, as __reduce_ex__ flattens it (a receiver
    of an older version, which knows only _rebuild, cannot read it: Ray runs one version of its
    packages across a cluster)."""
    return _metadata_of([(shape, _dtype_of(dtype))], tensor_device, [buffer], "")


@dataclass
class ScadCommunicatorMetadata(CommunicatorMetadata):
    """Nothing to agree on: the destination reads the source's memory one-sidedly."""
