"""scad.connect — one-sided transfers between processes, with dynamo.nixl_connect's API, on
libd's transports (shm on one host, tcp, RDMA verbs). Code written for dynamo.nixl_connect moves
here with its import changed. See docs/connect.md.

    connector = Connector()
    with connector.create_readable(Descriptor(array)) as op:      # passive side
        send(op.metadata().to_json())                              # any channel
        await op.wait_for_completion()                             # the peer's "done" wakes it

    with await connector.begin_read(RdmaMetadata.from_json(text), Descriptor(out)) as op:
        await op.wait_for_completion()                             # active side
"""
from .._compiled import prefer_compiled

prefer_compiled(__name__, __path__)  # the per-operation modules, compiled by the build when it could

try:
    import numpy  # noqa: F401 - descriptors find buffer addresses with it
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("scad.connect needs numpy: pip install numpy (or scad[numpy])") from e

from ._active import ActiveOperation, ReadOperation, WriteOperation
from ._connector import Connector
from ._descriptor import Descriptor, Device, DeviceKind
from ._errors import OperationCancelledError
from ._metadata import RdmaMetadata, SerializedDescriptor
from ._operation_kind import OperationKind, OperationStatus
from ._passive import PassiveOperation, ReadableOperation, WritableOperation

__all__ = ["Connector", "Descriptor", "Device", "DeviceKind", "OperationKind", "OperationStatus", "RdmaMetadata",
           "SerializedDescriptor", "ReadableOperation", "WritableOperation", "ReadOperation", "WriteOperation",
           "ActiveOperation", "PassiveOperation", "OperationCancelledError"]
