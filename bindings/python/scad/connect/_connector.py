"""The Connector: one per process (or per worker), the factory of every operation.

It owns a libd memory server (started by initialize() or by the first passive operation) that
serves passive operations' memory in place over tcp and a unix socket, and RDMA verbs when this
host has a device.
"""
from __future__ import annotations

import itertools
import os
import socket
import threading
import uuid
from typing import Any, Optional

from .. import _memserver
from ._active import ReadOperation, WriteOperation
from ._metadata import RdmaMetadata, owner_part
from ._passive import ReadableOperation, WritableOperation

_TRANSPORTS = (None, "shm", "tcp", "verbs")
_ROUTES_KEPT = 256  # owners whose transport a connector remembers


class Connector:
    """Connector(host=None, timeout=30.0, expires_in=600.0, transport=None, verbs=None, busy_poll_us=0)

    host        the address this process's memory server listens on and advertises to peers
                (default $SCAD_CONNECT_HOST, else 127.0.0.1: set it for peers on other hosts)
    timeout     seconds a transfer may take before it fails (libd's per-request deadline)
    expires_in  seconds a passive operation's metadata stays valid unless the operation says
                otherwise (the owner revokes it then)
    transport   force "shm", "tcp" or "verbs" for active operations (default: shm for a peer on
                this host, verbs when both ends have an RDMA device, else tcp)
    verbs       serve passive operations over RDMA verbs too (default: when this host has a device)
    busy_poll_us  how long wait_for_completion polls (the core spinning, yielding) before it sleeps
                (default 0: sleep at once; the event loop wakes the task). A few hundred microseconds
                saves a sleeper's wake-up on small operations, at the cost of a busy core meanwhile.
    """

    def __init__(self, *, host: Optional[str] = None, timeout: float = 30.0, expires_in: float = 600.0,
                 transport: Optional[str] = None, verbs: Optional[bool] = None, busy_poll_us: float = 0.0) -> None:
        if transport not in _TRANSPORTS:
            raise ValueError(f"transport must be one of 'shm', 'tcp', 'verbs' or None, not {transport!r}")
        if timeout <= 0 or expires_in <= 0:
            raise ValueError("timeout and expires_in must be > 0 seconds")
        self._name = f"scad-connect-{uuid.uuid4().hex[:16]}"
        self._hostname = socket.gethostname()
        self._host = host or os.environ.get("SCAD_CONNECT_HOST", "127.0.0.1")
        self.timeout = float(timeout)
        self.expires_in = float(expires_in)
        self._transport = transport
        if busy_poll_us < 0:
            raise ValueError("busy_poll_us must be >= 0")
        self.busy_poll_us = float(busy_poll_us)
        self._verbs = _memserver.has_rdma_device() if verbs is None else bool(verbs)
        self._lock = threading.Lock()
        # Each passive operation's notification key, the next of a count from a random start (taken
        # under the GIL: no two operations get the same). It names the operation's element and comes
        # back in the peer's word, which only a holder of the operation's grant can send: it needs
        # to be unique, not secret.
        self._keys = itertools.count(int.from_bytes(os.urandom(8), "little"))
        self._action = None
        self._srv = None
        self._endpoint: dict = {}
        # How each owner's server is reached, once looked up (its host name, socket and devices):
        # the look costs two system calls (the host name, the socket's stat), paid by every
        # operation otherwise. Bounded: a process that meets many owners looks again past it.
        self._routes: dict = {}

    @property
    def name(self) -> str:
        """This connector's unique name (the owner named in its operations' metadata)."""
        return self._name

    @property
    def hostname(self) -> str:
        return self._hostname

    async def initialize(self) -> "Connector":
        """Starts the memory server now rather than at the first passive operation."""
        self._server()
        return self

    # ---- operations ---------------------------------------------------------------------
    def create_readable(self, local_descriptors: Any, *, expires_in: Optional[float] = None) -> ReadableOperation:
        """Opens local memory for one remote ReadOperation. Usable at once or awaited."""
        return ReadableOperation(self, local_descriptors, expires_in)

    def create_writable(self, local_descriptors: Any, *, expires_in: Optional[float] = None) -> WritableOperation:
        """Opens local memory for one remote WriteOperation. Usable at once or awaited."""
        return WritableOperation(self, local_descriptors, expires_in)

    def begin_read(self, remote_metadata: Any, local_descriptors: Any) -> ReadOperation:
        """Starts reading a remote ReadableOperation's memory into local_descriptors."""
        return ReadOperation(self, remote_metadata, local_descriptors)

    def begin_write(self, local_descriptors: Any, remote_metadata: Any) -> WriteOperation:
        """Starts writing local_descriptors into a remote WritableOperation's memory."""
        return WriteOperation(self, remote_metadata, local_descriptors)

    def close(self) -> None:
        """Stops the memory server (every passive operation's grants go with it)."""
        with self._lock:
            action, self._action, self._srv = self._action, None, None
        if action is not None:
            action.terminate()  # ends every wait on it (-ECANCELED)

    def __enter__(self) -> "Connector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Connector(name={self._name!r}, hostname={self._hostname!r})"

    # ---- for the operations -------------------------------------------------------------
    def _server(self) -> Any:
        srv = self._srv
        if srv is not None:
            return srv  # every passive operation asks: no lock once it runs (close() only clears it)
        with self._lock:
            if self._srv is None:
                action, srv, endpoint = _memserver.start(self._name, self._host, self._verbs)
                # The server last: a caller that finds it without the lock finds its endpoint too.
                self._action, self._endpoint = action, endpoint
                self._record_owner = owner_part(self._name, self._hostname, endpoint)  # in every record
                self._record_fields = RdmaMetadata.owner_fields(self._name, self._hostname, endpoint)
                self._srv = srv
            return self._srv

    def _choose_transport(self, md: RdmaMetadata) -> str:
        if self._transport is not None:
            return self._transport
        server = (md.hostname, md.path, md.verbs)
        impl = self._routes.get(server)
        if impl is None:
            impl = _memserver.choose_transport(None, md.hostname, md.path, md.verbs)
            if len(self._routes) >= _ROUTES_KEPT:
                self._routes.clear()
            self._routes[server] = impl
        return impl
