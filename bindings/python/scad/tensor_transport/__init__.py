"""scad.tensor_transport — a Ray Direct Transport tensor transport (Ray's TensorTransportManager
interface) on libd, through scad.rdma. Works with or without Ray installed. See
docs/tensor-transport.md."""
from .._compiled import prefer_compiled

prefer_compiled(__name__, __path__)  # the per-operation modules, compiled by the build when it could

from ._manager import ScadTensorTransport
from ._metadata import CommunicatorMetadata, ScadCommunicatorMetadata, ScadTransportMetadata, TensorTransportMetadata

__all__ = ["ScadTensorTransport", "ScadTransportMetadata", "ScadCommunicatorMetadata", "TensorTransportMetadata",
           "CommunicatorMetadata"]
