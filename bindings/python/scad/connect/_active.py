"""Active operations: this process reads or writes a peer's memory, as its metadata grants.

Each grant of the metadata is one libd transport, in an action of the operation's own, so
ending the operation lets go of every grant and registration it made. A grant over a list of
ranges (descriptors in a row under one grant) is moved with one readv/writev over the local
descriptors, registered together (libd_trdma_reg_ranges). Over shm and tcp the
transports ride the process's one shared connection to the owner's server (libd's share,1): an
operation attaches its grants to it (one round trip) instead of opening a connection per grant.
The transport is chosen per metadata: shm when the owner is on this host (its unix socket is
here), verbs when both ends have an RDMA device, else tcp. Once its transfers are complete the
operation tells the owner with libd_trdma_notify; a cancelled or failed one tells it so too.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
import time
from typing import Any, Optional

from ._descriptor import Descriptor, as_list
from ._metadata import RdmaMetadata
from ._operation_kind import TERMINAL as _TERMINAL, OperationBase, OperationKind, OperationStatus
from .._memserver import where as _where
from .._waiter import wait_ready

log = logging.getLogger("scad.connect")


_REFUSED = ("the owner refused this metadata: its operation has finished, was cancelled or expired, "
            "or the record is not one it issued")


def _parse(remote_metadata: Any) -> RdmaMetadata:
    if isinstance(remote_metadata, RdmaMetadata):
        return remote_metadata
    if isinstance(remote_metadata, (str, bytes)):
        return RdmaMetadata.from_json(remote_metadata)
    if isinstance(remote_metadata, dict):
        return RdmaMetadata.from_dict(remote_metadata)
    raise TypeError(f"remote_metadata must be an RdmaMetadata (or its JSON), not {type(remote_metadata).__name__}")


def _by_grant(local_descriptors: list, remote_descriptors: tuple) -> list:
    """The remote descriptors in runs under one grant: [(first remote, [(local, offset in the
    grant), ...]), ...]. A run is one list the owner lent, its ranges end to end."""
    runs: list = []
    offset = 0
    for local, remote in zip(local_descriptors, remote_descriptors):
        if runs and runs[-1][0].grant == remote.grant:
            runs[-1][1].append((local, offset))
        else:
            offset = 0
            runs.append((remote, [(local, 0)]))
        offset += remote.size
    return runs


class ActiveOperation(OperationBase):
    """Common to ReadOperation and WriteOperation."""

    _kind = OperationKind.UNSPECIFIED

    def __init__(self, connector: Any, remote_metadata: Any, local_descriptors: Any) -> None:
        from disagg import LibdAction, begin_transfer  # the binding is only needed once an operation runs

        self._lock = threading.Lock()
        self._status = OperationStatus.UNINITIALIZED
        self._why, self._error = "", RuntimeError
        self._action = None
        self._fd = -1  # the eventfd libd writes to as the transfers complete (wait_for_completion)
        self._connector = connector
        md = _parse(remote_metadata)
        if md.operation_kind != self._kind:
            theirs = OperationKind(md.operation_kind)
            use = "begin_read" if theirs is OperationKind.READ else "begin_write"
            raise ValueError(f"{type(self).__name__} needs the metadata of a "
                             f"{'readable' if self._kind is OperationKind.READ else 'writable'} operation; this one is "
                             f"{'readable' if theirs is OperationKind.READ else 'writable'}: use connector.{use}()")
        self._single = isinstance(local_descriptors, Descriptor)
        self._descs = as_list(local_descriptors, "local_descriptors")
        if len(self._descs) != len(md.descriptors):
            raise ValueError(f"{len(self._descs)} local descriptor(s) for {len(md.descriptors)} remote one(s): "
                             "they pair one to one")
        for i, (local, remote) in enumerate(zip(self._descs, md.descriptors)):
            if local.size != remote.size:
                raise ValueError(f"descriptor {i}: local {local.size} bytes, remote {remote.size} bytes: sizes must match")
            if self._kind is OperationKind.READ and local.readonly:
                raise ValueError(f"descriptor {i} is read-only memory (bytes?): a read needs memory it may write")
        self._value = int(md.notification_key, 16)
        self.impl = connector._choose_transport(md)
        self._pipelined = self.impl == "tcp"
        self._told = False  # the word went with the transfer (one descriptor over shm)
        self._transports = []
        self._ops = []
        where = f"{_where(self.impl, md.host, md.port, md.path)};timeout_ms,{int(connector.timeout * 1000)}"
        if self.impl == "tcp" and connector.busy_poll_us > 0:
            # The owner's verdict below is read off the socket by this thread, polling as long.
            where += f";busy_poll_us,{min(int(connector.busy_poll_us), 1_000_000)}"  # libd's most
        try:
            if len(self._descs) == 1:
                self._start_one(begin_transfer, md.descriptors[0], where)
            else:
                self._action = LibdAction(connector.name)
                self._start_many(md, where)
        except PermissionError as e:
            self._fail_setup()
            raise PermissionError(errno.EACCES, f"{_REFUSED} ({e})") from None
        except ConnectionError as e:
            self._fail_setup()
            raise ConnectionError(e.errno, f"cannot reach the owner {md.owner!r} over {self.impl}: {e}") from None
        except BaseException:
            self._fail_setup()
            raise
        self._status = OperationStatus.IN_PROGRESS
        # Over shm the copies are done as they start: the owner is told now, with nothing of
        # the caller's in between (as NIXL's notification leaves with its transfer), not at
        # the caller's first look.
        if all(op.done() for op in self._ops):
            self._drive(0)

    def _start_one(self, begin_transfer: Any, remote: Any, where: str) -> None:
        """One descriptor (the common case): the binding makes its transport, starts the transfer
        (which attaches the grant), queues the word behind it over tcp (the last word: the grant
        is let go of in the same write, so ending the operation sends nothing more), takes the
        owner's verdict, and over shm, where the copy is done as it starts, sends the word and
        lets go of the grant: all in one call, nothing of Python's between the copy and the
        owner's word. What it returns is the action, the transport and the transfer."""
        local = self._descs[0]
        local.register_memory(self._connector)
        t = begin_transfer(self._connector.name, f"d0;{self.impl};{where};grant,{remote.grant};secret,{remote.secret}",
                           local.ptr, local.size, self._kind is not OperationKind.READ, local, self._pipelined,
                           self._value, not self._pipelined, last=self._pipelined)
        self._told = t.told
        self._action = t
        self._transports.append(t)
        self._ops.append(t)

    def _start_many(self, md: RdmaMetadata, where: str) -> None:
        """Several descriptors: a transport per grant, a transfer per transport (a list's ranges
        under one grant move with one readv/writev)."""
        read = self._kind is OperationKind.READ
        for i, (remote, pairs) in enumerate(_by_grant(self._descs, md.descriptors)):
            self._action.add_transport(f"d{i};{self.impl};{where};grant,{remote.grant};secret,{remote.secret}")
            t = self._action.get_transport(f"d{i}", "rdma")
            self._transports.append(t)
            # The first transfer connects (on a shared connection it rides its grant's ATTACH)
            # and starts.
            if len(pairs) == 1:
                local = pairs[0][0]
                local.register_memory(self._connector)
                t.reg_memory(local.ptr, local.size, keep=local)
                self._ops.append(t.read_async(local.size, 0, 0) if read else t.write_async(local.size, 0, 0))
                continue
            locals_ = [local for local, _ in pairs]
            for local in locals_:
                local.register_memory(self._connector)
            t.reg_ranges([(local.ptr, local.size) for local in locals_], keep=locals_)
            entries = [(local.size, offset, local.ptr) for local, offset in pairs]
            self._ops.append(t.readv_async(entries) if read else t.writev_async(entries))
        if self._pipelined:
            # Over tcp the word goes right behind the requests, in the same write: the owner's
            # server reads it after them, tells the owner once its memory has been served in
            # full, and makes it a failure if a request was refused.
            for t in self._transports:
                t.notify(self._value, 0)
        self._verdicts()

    def _verdicts(self) -> None:
        """The owner's verdict on each grant: a refusal is an error here, not later. Over tcp the
        word went right behind the requests, and an owner quick to act on it may have ended the
        operation (its grants revoked, its memory withdrawn) before this looks: the transport is
        cut then, and says so. The owner's server answers a grant's requests before it reads
        its word, so if every transfer completed the grants were attached and served: that is
        the operation done, not an owner out of reach."""
        for t in self._transports:
            try:
                t.remote()
            except ConnectionError:
                if not (self._pipelined and all(op.status == 0 for op in self._ops)):
                    raise

    # ---- Dynamo's surface ---------------------------------------------------------------
    @property
    def status(self) -> OperationStatus:
        if self._status is OperationStatus.IN_PROGRESS and all(op.done() for op in self._ops):
            self._drive(0)  # finished: tell the owner now
        return self._status

    async def wait_for_completion(self, timeout: Optional[float] = None) -> None:
        """Returns once every transfer is done and the owner has been told. Raises TimeoutError
        if `timeout` seconds pass first (the transfers go on: wait again or cancel),
        ConnectionError if the owner vanished or cut the operation off (it cancelled, or the
        operation expired), OperationCancelledError if this side cancelled it."""
        if self._status is OperationStatus.IN_PROGRESS:
            ops = self._ops
            done = lambda: all(op.done() for op in ops)  # noqa: E731 - a look also reads answers in (libd)
            def arm(fd: int) -> None:
                for op in ops:
                    op.watch(fd)  # libd writes to it as each completes

            one = ops[0] if len(ops) == 1 else None  # one transfer: polled in C
            self._fd, ok = await wait_ready(done, self._connector.busy_poll_us, timeout, self._fd, arm, one)
            if not ok:
                raise TimeoutError(f"the transfers did not finish within {timeout} s (they go on)")
            self._drive(0)  # every transfer is done: tell the owner, end the operation
            self._close_wait_fd()
        self._raise_if_failed()

    def cancel(self) -> None:
        """Stops the transfers (once it returns libd no longer touches the local memory) and
        tells the owner this side gave up. No effect once the operation has ended."""
        with self._lock:
            if self._status in _TERMINAL:
                return
            self._status = OperationStatus.CANCELLED
            self._why = "cancelled by this side"
        # The word goes first: cancelling an RDMA transfer in flight may close its connection
        # (verbs), and the owner would then see a peer that vanished, not one that gave up.
        self._tell_owner(-errno.ECANCELED)
        for op in self._ops:
            op.cancel()
        self._release()

    def results(self) -> list:
        """The local descriptors, once the operation is complete."""
        if self.status is not OperationStatus.COMPLETE:
            raise RuntimeError(f"the operation is {self._status.name}, not COMPLETE")
        return list(self._descs)

    def __enter__(self) -> "ActiveOperation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cancel()

    def __await__(self):
        return self._ready().__await__()

    async def _ready(self) -> "ActiveOperation":
        return self

    def __del__(self) -> None:
        try:
            if getattr(self, "_status", None) not in _TERMINAL and getattr(self, "_ops", None) is not None:
                self.cancel()
        except Exception:  # noqa: BLE001 - a finaliser never raises
            log.debug("cancelling a dropped operation failed", exc_info=True)
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            for op in getattr(self, "_ops", ()):
                op.watch(-1)
            os.close(fd)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(descriptors={len(self._descs)}, transport={self.impl}, status={self._status.name})"

    # ---- the machinery ------------------------------------------------------------------
    def _drive(self, timeout: Optional[float]) -> None:
        """Waits for the transfers up to `timeout`, then finishes the operation. Runs in an
        waiting thread too: it records, it never raises."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for op in self._ops:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                op.wait(left)
            except TimeoutError as e:
                if not op.done():
                    return  # the wait ran out, not the transfer
                self._finish_failed(e)
                return
            except Exception as e:  # noqa: BLE001 - recorded and raised by wait_for_completion
                self._finish_failed(e)
                return
        with self._lock:
            if self._status is not OperationStatus.IN_PROGRESS:
                return
        try:
            if not self._pipelined and not self._told:  # (over tcp the word went with the requests)
                for t in self._transports:
                    t.notify(self._value, 0, last=True)  # and let go of the grant in the same write
        except Exception as e:  # noqa: BLE001
            self._end(OperationStatus.ERRORED, f"the transfers completed but the owner could not be told: {e}",
                      ConnectionError)
            return
        self._end(OperationStatus.COMPLETE, "")

    def _finish_failed(self, e: Exception) -> None:
        if self._status is OperationStatus.CANCELLED:
            return
        if isinstance(e, ConnectionError):
            why = f"the owner cut the transfer off (it cancelled, the operation expired, or it is gone): {e}"
            kind = ConnectionError
        elif isinstance(e, TimeoutError):
            why, kind = f"the owner did not answer in time: {e}", TimeoutError
        else:
            why, kind = f"the transfer failed: {e}", type(e) if isinstance(e, OSError) else RuntimeError
        code = getattr(e, "errno", None) or errno.EIO
        self._tell_owner(-code)
        self._end(OperationStatus.ERRORED, why, kind)

    def _tell_owner(self, status: int) -> None:
        """Best effort: an owner that is gone needs no word."""
        for t in self._transports:
            try:
                t.notify(self._value, status)
            except Exception:  # noqa: BLE001
                pass

    def _fail_setup(self) -> None:
        for op in self._ops:
            op.cancel()
        self._status = OperationStatus.ERRORED
        self._release()

    def _release(self) -> None:
        action, self._action = self._action, None
        if self._fd >= 0:
            for op in self._ops:
                op.watch(-1)  # nothing writes to the eventfd after this (closed with the operation)
        if action is not None:
            action.terminate()  # lets go of every grant; the owner sees them go


class ReadOperation(ActiveOperation):
    """Reads a remote ReadableOperation's memory into local descriptors."""

    _kind = OperationKind.READ


class WriteOperation(ActiveOperation):
    """Writes local descriptors into a remote WritableOperation's memory."""

    _kind = OperationKind.WRITE
