"""ScadTensorTransport: Ray's TensorTransportManager interface on scad.rdma.

One-sided: the source lends each tensor of an object in place (an RdmaBuffer per tensor, made when
Ray extracts the object's metadata); the destination reads them into new or given buffers. Ray's
interface is synchronous, so transfers run on a private event loop thread of this module, which
works whether or not the caller runs an event loop of its own.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Dict, List, Optional

import numpy

from ..rdma import RdmaBuffer, RdmaManager
from ._metadata import CommunicatorMetadata, ScadCommunicatorMetadata, ScadTransportMetadata

try:
    from ray.experimental.rdt.tensor_transport_manager import TensorTransportManager as _Base
except ImportError:  # pragma: no cover - depends on the environment
    _Base = object


class _Loop:
    """An event loop on a daemon thread, for synchronous callers."""

    def __init__(self) -> None:
        self._loop = None
        self._lock = threading.Lock()

    def run(self, coro: Any, timeout: Optional[float]) -> Any:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="scad-tensor-transport", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _host_array(tensor: Any) -> numpy.ndarray:
    """A numpy view of a CPU tensor or array: its own memory, never a copy (the view keeps the
    tensor's storage alive)."""
    if _is_torch(tensor):
        if tensor.device.type != "cpu":
            raise NotImplementedError(f"tensors on {tensor.device} are not supported: libd's transports move host memory")
        if not tensor.is_contiguous():
            raise ValueError("a tensor must be contiguous to move in place (tensor.contiguous())")
        return tensor.detach().numpy()
    if not isinstance(tensor, numpy.ndarray):
        raise TypeError(f"a tensor transport moves torch tensors and numpy arrays, not {type(tensor).__name__}")
    if not tensor.flags.c_contiguous:
        raise ValueError("an array must be C-contiguous to move in place (numpy.ascontiguousarray)")
    return tensor


class ScadTensorTransport(_Base):
    """Register with Ray (ray.experimental.register_tensor_transport) or call directly."""

    def __init__(self, timeout: float = 30.0) -> None:
        self._timeout = timeout
        self._loop = _Loop()
        self._lent: Dict[str, List[RdmaBuffer]] = {}      # source: obj_id -> its tensors' buffers
        self._receiving: Dict[str, List[Any]] = {}        # destination: obj_id -> queue pairs in use
        self._lock = threading.Lock()

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
        manager = RdmaManager.get()
        arrays = [_host_array(t) for t in rdt_object]
        buffers = []
        try:
            for array in arrays:
                buffers.append(manager.request_buffer(array) if array.nbytes else None)
        except BaseException:
            for b in buffers:
                if b is not None:
                    b.drop()
            raise
        with self._lock:
            self._lent[obj_id] = [b for b in buffers if b is not None]
        meta = [(tuple(t.shape), t.dtype) for t in rdt_object]
        return ScadTransportMetadata(tensor_meta=meta, tensor_device="cpu",
                                     buffers=[b.to_json() if b is not None else "" for b in buffers])

    def get_communicator_metadata(self, src_actor: Any = None, dst_actor: Any = None,
                                  backend: Optional[str] = None) -> CommunicatorMetadata:
        return ScadCommunicatorMetadata()

    def send_multiple_tensors(self, tensors: List[Any], tensor_transport_metadata: Any,
                              communicator_metadata: Any) -> None:
        """Nothing to do: the destination reads (one-sided)."""

    def garbage_collect(self, obj_id: str, tensor_transport_meta: Any = None, tensors: Any = None) -> None:
        """Ends the loan: the buffers' keys are revoked and the memory let go."""
        with self._lock:
            buffers = self._lent.pop(obj_id, [])
        for b in buffers:
            b.drop()

    # ---- the destination ----------------------------------------------------------------
    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: ScadTransportMetadata,
                              communicator_metadata: Any = None, target_buffers: Optional[List[Any]] = None) -> List[Any]:
        """Reads every tensor of the object into target_buffers (when given) or new arrays."""
        meta = tensor_transport_metadata
        if target_buffers is not None and len(target_buffers) != len(meta.tensor_meta):
            raise ValueError(f"{len(target_buffers)} target buffers for {len(meta.tensor_meta)} tensors")
        out = []
        for i, (shape, dtype) in enumerate(meta.tensor_meta):
            if target_buffers is not None:
                out.append(target_buffers[i])
            elif _is_torch(dtype):
                import torch
                out.append(torch.empty(shape, dtype=dtype))
            else:
                out.append(numpy.empty(shape, dtype=dtype))
        self._loop.run(self._recv(obj_id, meta, out), None)
        return out

    async def _recv(self, obj_id: str, meta: ScadTransportMetadata, out: List[Any]) -> None:
        manager = RdmaManager.get()
        try:
            for text, target in zip(meta.buffers, out):
                if not text:
                    continue  # an empty tensor: nothing to move
                buf = RdmaBuffer.from_json(text)
                local = _host_array(target)
                if local.nbytes != buf.size():
                    raise ValueError(f"a target of {local.nbytes} bytes for a tensor of {buf.size()}")
                qp = await manager.request_queue_pair(buf)
                with self._lock:
                    self._receiving.setdefault(obj_id, []).append(qp)
                qp.get(local.reshape(-1).view(numpy.uint8), buf)
                try:
                    await qp.wait(self._timeout)
                except TimeoutError:
                    qp.cancel()  # the target is not written after the caller was told it timed out
                    raise
                manager.release_queue_pair(buf)  # this side is done; the loan ends at garbage_collect
        finally:
            with self._lock:
                self._receiving.pop(obj_id, None)

    def abort_transport(self, obj_id: str, communicator_metadata: Any = None) -> None:
        """Source: ends the loan. Destination: cancels the reads in flight (their wait fails)."""
        self.garbage_collect(obj_id)
        with self._lock:
            qps = self._receiving.pop(obj_id, [])
        for qp in qps:
            qp.cancel()
