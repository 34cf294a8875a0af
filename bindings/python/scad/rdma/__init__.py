"""scad.rdma — PyTorch Monarch's RDMA buffers on libd's transports (shm, tcp, verbs).
See docs/rdma.md.

    buf = RdmaManager.get().request_buffer(tensor)      # the owner: a handle on its memory
    send(pickle.dumps(buf))                              # or buf.to_json()
    await buf.read_into(local)                           # any peer holding it
    buf.drop()                                           # the owner: revoke
"""
from .._compiled import prefer_compiled

prefer_compiled(__name__, __path__)  # the per-operation modules, compiled by the build when it could

from ._buffer import RdmaBuffer
from ._manager import RdmaManager
from ._queue_pair import QueuePair

__all__ = ["RdmaManager", "RdmaBuffer", "QueuePair"]
