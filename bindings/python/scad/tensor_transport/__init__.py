"""scad.tensor_transport — a Ray Direct Transport tensor transport (Ray's TensorTransportManager
interface) on libd, through scad.rdma. Works with or without Ray installed. See
docs/tensor-transport.md."""
from ._manager import ScadTensorTransport
from ._metadata import CommunicatorMetadata, ScadCommunicatorMetadata, ScadTransportMetadata, TensorTransportMetadata

__all__ = ["ScadTensorTransport", "ScadTransportMetadata", "ScadCommunicatorMetadata", "TensorTransportMetadata",
           "CommunicatorMetadata"]
