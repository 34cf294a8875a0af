"""The metadata Ray's tensor transports exchange, with Ray's names, usable without Ray."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

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


@dataclass
class ScadCommunicatorMetadata(CommunicatorMetadata):
    """Nothing to agree on: the destination reads the source's memory one-sidedly."""
