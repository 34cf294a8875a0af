"""Descriptors: where an operation's memory is. A descriptor never copies: it records the
address and size of the caller's own memory and keeps the object that owns it alive, so a peer
reads and writes that memory in place."""
from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy

from .._memserver import from_binding


class DeviceKind(IntEnum):
    """The kind of memory a descriptor points at. libd's transports move host memory only."""

    UNSPECIFIED = 0
    HOST = 1
    CUDA = 2

    def __str__(self) -> str:
        return {DeviceKind.HOST: "cpu", DeviceKind.CUDA: "cuda"}.get(self, "<invalid>")


class Device:
    """A device: Device("cpu"), Device("host"), Device((DeviceKind.HOST, 0)). "cuda:N" parses,
    but a descriptor on it is refused (no transport here reaches device memory)."""

    def __init__(self, metadata: Any) -> None:
        if isinstance(metadata, Device):
            kind, device_id = metadata.kind, metadata.id
        elif (isinstance(metadata, tuple) and len(metadata) == 2 and isinstance(metadata[0], DeviceKind)
              and isinstance(metadata[1], int)):
            kind, device_id = metadata
        elif isinstance(metadata, str):
            text = metadata.strip().lower()
            if text in ("cpu", "host"):
                kind, device_id = DeviceKind.HOST, 0
            elif text.startswith("cuda") or text.startswith("gpu"):
                kind = DeviceKind.CUDA
                device_id = int(text.split(":", 1)[1]) if ":" in text else 0
            else:
                raise ValueError(f"device {metadata!r}: expected 'cpu', 'host' or 'cuda:<id>'")
        else:
            raise TypeError(f"device must be a str, a (DeviceKind, int) tuple or a Device, not {type(metadata).__name__}")
        self._kind = DeviceKind(kind)
        self._id = device_id

    @property
    def kind(self) -> DeviceKind:
        return self._kind

    @property
    def id(self) -> int:
        return self._id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and (self._kind, self._id) == (other._kind, other._id)

    def __hash__(self) -> int:
        return hash((self._kind, self._id))

    def __str__(self) -> str:
        return f"cuda:{self._id}" if self._kind is DeviceKind.CUDA else str(self._kind)

    def __repr__(self) -> str:
        return f"Device(kind={self._kind.name}, id={self._id})"


HOST = Device("cpu")


def _is_torch_tensor(data: Any) -> bool:
    # Without importing torch: a process that has no tensors pays nothing for torch support.
    return type(data).__module__.split(".")[0] == "torch" and hasattr(data, "data_ptr")


def _from_buffer(obj: Any) -> tuple[int, int, bool]:
    """(address, size, readonly) of a contiguous buffer-protocol object, without copying."""
    view = memoryview(obj)
    if not view.contiguous:
        raise ValueError("a descriptor needs contiguous memory (this buffer is strided)")
    if view.nbytes == 0:
        raise ValueError("a descriptor needs at least one byte")
    flat = numpy.frombuffer(view.cast("B") if view.format != "B" or view.ndim != 1 else view, dtype=numpy.uint8)
    return flat.__array_interface__["data"][0], view.nbytes, view.readonly


class Descriptor:
    """Memory for an operation: a numpy array, bytes (read-only: a source only), bytearray,
    memoryview, an (ndarray, device) tuple, an (address, size, device[, owner]) tuple, or a CPU
    torch.Tensor. `size`, `device`, `ptr`; register_memory(connector) binds it to a connector
    (idempotent; operations do it on first use), also under Dynamo's later names
    register_with_connector / deregister_with_connector / is_registered."""

    def __init__(self, data: Any) -> None:
        self._ref: Any = data  # keeps the memory's owner alive as long as the descriptor
        self._device = HOST
        self._connector = None
        if isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], numpy.ndarray):
            self._device = Device(data[1])
            data = self._ref = data[0]
        if isinstance(data, tuple) and len(data) in (3, 4) and isinstance(data[0], int) and isinstance(data[1], int):
            self._ptr, self._size = data[0], data[1]
            self._device = Device(data[2])
            self._readonly = False
            self._ref = data[3] if len(data) == 4 else None
            if self._ptr == 0 or self._size <= 0:
                raise ValueError("an (address, size, device) descriptor needs a non-null address and a size > 0")
        elif isinstance(data, numpy.ndarray):
            info = from_binding("buffer_info")
            if info is not None:  # the binding reads address, size and mode in one call
                try:
                    self._ptr, self._size, self._readonly = info(data)
                except (BufferError, ValueError):  # numpy says "ndarray is not C-contiguous"
                    raise ValueError("a descriptor needs a C-contiguous array (use numpy.ascontiguousarray)") from None
            else:
                if not data.flags.c_contiguous:
                    raise ValueError("a descriptor needs a C-contiguous array (use numpy.ascontiguousarray)")
                self._ptr = data.__array_interface__["data"][0]
                self._size = data.nbytes
                self._readonly = not data.flags.writeable
            if self._size == 0:
                raise ValueError("a descriptor needs at least one byte")
        elif _is_torch_tensor(data):
            if data.device.type != "cpu":
                self._device = Device(str(data.device))
            elif not data.is_contiguous():
                raise ValueError("a descriptor needs a contiguous tensor (use tensor.contiguous())")
            self._ptr = data.data_ptr()
            self._size = data.numel() * data.element_size()
            self._readonly = False
            if self._size == 0:
                raise ValueError("a descriptor needs at least one byte")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            self._ptr, self._size, self._readonly = _from_buffer(data)
        else:
            raise TypeError(f"a Descriptor takes a numpy array, bytes, bytearray, memoryview, (ndarray, device), "
                            f"(address, size, device[, owner]) or a CPU torch.Tensor, not {type(data).__name__}")
        if self._device.kind is not DeviceKind.HOST:
            raise NotImplementedError(f"device memory ({self._device}) is not supported: libd's transports move host memory")

    @property
    def ptr(self) -> int:
        return self._ptr

    @property
    def size(self) -> int:
        return self._size

    @property
    def device(self) -> Device:
        return self._device

    @property
    def readonly(self) -> bool:
        """True for memory that may only be a source (bytes, a read-only array or view)."""
        return self._readonly

    @property
    def data(self) -> Any:
        """The object that owns the memory (None for an address tuple without an owner)."""
        return self._ref

    def register_memory(self, connector: Any) -> None:
        """Binds the descriptor to `connector`. Idempotent; binding it to a second connector is
        refused. libd registers the memory with each operation's connection (verbs keeps a cache
        of memory registrations, so registering the same memory again costs a lookup)."""
        if self._connector is connector:
            return
        if self._connector is not None:
            raise ValueError("this descriptor is already registered with another Connector")
        self._connector = connector

    # Dynamo's later names for the same binding (its operations call them; code written for it
    # may too). Dynamo binds a descriptor to one of the connector's connections; here the
    # connector is the connection.
    def register_with_connector(self, connector: Any) -> None:
        self.register_memory(connector)

    def deregister_with_connector(self, connector: Any) -> None:
        """Unbinds the descriptor from `connector`, which it must be bound to."""
        if self._connector is not connector:
            raise ValueError("this descriptor is not registered with that Connector")
        self._connector = None

    @property
    def is_registered(self) -> bool:
        return self._connector is not None

    def __repr__(self) -> str:
        ro = ", readonly" if self._readonly else ""
        return f"Descriptor(ptr={self._ptr:#x}, size={self._size}, device={self._device}{ro})"


def as_list(descriptors: Any, what: str) -> list[Descriptor]:
    """One descriptor or a non-empty list of them, as a list."""
    if isinstance(descriptors, Descriptor):
        return [descriptors]
    if isinstance(descriptors, (list, tuple)) and descriptors and all(isinstance(d, Descriptor) for d in descriptors):
        return list(descriptors)
    if isinstance(descriptors, (list, tuple)) and not descriptors:
        raise ValueError(f"{what}: the list of descriptors is empty")
    raise TypeError(f"{what} must be a Descriptor or a list of Descriptor")
