"""Passive operations: this process's memory, opened to one peer for one transfer.

The memory is served in place by the connector's libd memory server (expose: nothing copied),
under a grant in the operation's direction, with an expiry. A list of descriptors is one element
over the list of their ranges and one grant (as NIXL lends a list with one blob), so the peer
attaches once and moves the list with one request; where the server also serves RDMA verbs (one
remote key reaches one range) each descriptor is an element and a grant of its own. The peer's libd sends a
NOTIFY on its connection once its transfers are done, and wait_for_completion() wakes on it (a
thread blocked in libd, no polling). The operation ends - complete, cancelled, failed or dropped -
by revoking its grants and withdrawing its memory: the metadata opens nothing afterwards.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
import time
from concurrent.futures import CancelledError as _LibdCancelled
from typing import Any, Optional

from ._descriptor import Descriptor, as_list
from ._metadata import RdmaMetadata, SerializedDescriptor, one_grant_record
from ._operation_kind import TERMINAL as _TERMINAL, OperationBase, OperationKind, OperationStatus
from .._memserver import MAX_RANGES, grant_of
from .._waiter import wait_ready

# How long the server's loop stays with a polling wait after its last look (libd's progress lease):
# past it, the server's own thread takes the loop back even if the waiter never said so.
_LEASE_US = 1000
_KEY_MASK = (1 << 64) - 1  # a notification key is 64 bits, written as 16 hex digits

log = logging.getLogger("scad.connect")


class PassiveOperation(OperationBase):
    """Common to ReadableOperation and WritableOperation."""

    _kind = OperationKind.UNSPECIFIED

    def __init__(self, connector: Any, local_descriptors: Any, expires_in: Optional[float] = None) -> None:
        self._lock = threading.Lock()
        self._status = OperationStatus.UNINITIALIZED
        self._why, self._error = "", RuntimeError
        self._elements: list[str] = []
        self._grants: list[str] = []
        self._fd = -1  # the eventfd libd writes to when a grant gets word (wait_for_completion)
        self._connector = connector
        self._descs = as_list(local_descriptors, "local_descriptors")
        self._single = isinstance(local_descriptors, Descriptor)
        if self._kind is OperationKind.WRITE:
            for d in self._descs:
                if d.readonly:
                    raise ValueError(f"{d!r} is read-only memory (bytes?): a writable operation needs memory the peer may write")
        ttl = connector.expires_in if expires_in is None else float(expires_in)
        if ttl <= 0:
            raise ValueError("expires_in must be > 0 seconds")
        server = connector._server()
        self._server = server
        self._value = next(connector._keys) & _KEY_MASK  # what the peer's NOTIFY carries back
        self._key = f"{self._value:016x}"
        self._pending: set[str] = set()  # grants whose holder has not said it finished
        serialized = []
        rights = "r" if self._kind is OperationKind.READ else "w"
        try:
            for d in self._descs:
                d.register_memory(connector)
            if len(self._descs) == 1:
                lists = (self._descs,)
            elif not connector._endpoint["verbs"]:
                # one element over the ranges, one grant (a list holds up to MAX_RANGES)
                lists = [self._descs[i:i + MAX_RANGES] for i in range(0, len(self._descs), MAX_RANGES)]
            else:
                lists = [[d] for d in self._descs]
            for i, descs in enumerate(lists):
                element = f"op{self._key}-{i}"
                if len(descs) == 1:
                    grant, secret = server.lend(element, descs[0].ptr, descs[0].size, rights, ttl)
                    self._elements.append(element)
                else:
                    server.expose_ranges(element, [(d.ptr, d.size) for d in descs])
                    self._elements.append(element)
                    grant, secret = grant_of(server.grant_ex(element, "*", rights=rights, ttl=ttl))
                self._grants.append(grant)
                # Descriptors in a row under one grant are its ranges, in order.
                serialized += [SerializedDescriptor(d.size, grant, secret) for d in descs]
        except BaseException:
            self._release()
            raise
        self._pending = set(self._grants)
        expires_at = time.time() + ttl
        kind = int(self._kind)
        self._metadata = md = RdmaMetadata.owned(connector._record_fields, kind, self._key, expires_at,
                                                 tuple(serialized))
        if len(serialized) == 1:  # the common record, its text written now from what is at hand
            d = serialized[0]
            md.__dict__["_text"] = one_grant_record(kind, self._key, connector._record_owner, expires_at, d.size,
                                                    d.grant, d.secret)
        self._status = OperationStatus.INITIALIZED

    # ---- Dynamo's surface ---------------------------------------------------------------
    @property
    def status(self) -> OperationStatus:
        """Looks (without waiting) whether the peer has said it finished."""
        if self._status not in _TERMINAL:
            self._collect(timeout=0)
        return self._status

    def metadata(self, hex_encode: bool = False) -> RdmaMetadata:
        """The record to hand the peer. Refused once the operation has ended."""
        if self._status in _TERMINAL:
            raise RuntimeError(f"the operation is {self._status.name}: its metadata opens nothing any more")
        return self._metadata

    async def wait_for_completion(self, timeout: Optional[float] = None) -> None:
        """Returns once the peer has finished its transfers (it told this side so). Raises
        TimeoutError if `timeout` seconds pass first (the operation goes on: wait again or
        cancel), ConnectionError if the peer vanished or its connection broke before it
        finished, TimeoutError if the operation expired, OperationCancelledError if either side
        cancelled it."""
        if self._status not in _TERMINAL:
            # While it polls, this thread serves the peer's requests and word itself (the
            # server's loop, leased): nothing has to be woken for them. Given back before sleeping;
            # kept after the operation (the next one's wait takes it on), it lapses within _LEASE_US.
            drive = [self._connector.busy_poll_us > 0]
            ran = [False]  # whether this wait ran the loop (not only asked for it)

            def give_back() -> None:
                drive[0] = False
                try:
                    self._server.progress(0)
                except ConnectionError:
                    pass  # the connector's server stopped: nothing to give back

            def ended() -> bool:
                if drive[0]:
                    try:
                        ran[0] = self._server.progress(_LEASE_US) or ran[0]
                    except ConnectionError:
                        drive[0] = False  # the server stopped: the look below says what that means
                self._collect(timeout=0)  # takes whatever the peer said
                return self._status in _TERMINAL

            def arm(fd: int) -> None:
                if drive[0]:  # the looks after this one are the sleeper's: the server's thread serves
                    give_back()
                for grant in list(self._pending):
                    try:
                        self._server.watch_notify(grant, fd)
                    except (KeyError, ConnectionError):
                        pass  # ended already: the next look says how

            self._fd, ok = await wait_ready(ended, self._connector.busy_poll_us, timeout, self._fd, arm)
            if drive[0] and not ran[0]:
                give_back()  # the word was there at the first look: the loop was only asked for
            if not ok:
                raise TimeoutError(f"the peer did not finish within {timeout} s (the operation goes on)")
            self._close_wait_fd()
        self._raise_if_failed()

    def cancel(self) -> None:
        """Revokes the grants at once: a peer still transferring gets an error, not a hang.
        No effect on an operation that has already ended, nor on one whose peer has already said
        it finished (that word is taken first: the operation is COMPLETE)."""
        if self._status not in _TERMINAL:
            self._collect(timeout=0)
        with self._lock:
            if self._status in _TERMINAL:
                return
            self._status = OperationStatus.CANCELLED
            self._why = "cancelled by this side"
        self._release()

    def __enter__(self) -> "PassiveOperation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cancel()  # leaving the block ends the operation; no effect once it completed

    def __await__(self):
        return self._ready().__await__()

    async def _ready(self) -> "PassiveOperation":
        return self

    def __del__(self) -> None:
        # A dropped operation must not leave its memory open. Never raises (a finaliser).
        try:
            if getattr(self, "_status", None) not in _TERMINAL and hasattr(self, "_lock"):
                self.cancel()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn libd down
            log.debug("cancelling a dropped operation failed", exc_info=True)
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)  # its grants are revoked (and unwatched): nobody writes to it

    def __repr__(self) -> str:
        return f"{type(self).__name__}(descriptors={len(self._descs)}, status={self._status.name})"

    # ---- the machinery ------------------------------------------------------------------
    def _collect(self, timeout: Optional[float]) -> None:
        """Takes what the peer said about each pending grant, waiting up to `timeout` (None:
        until something happens). Runs in a waiting thread too: it never raises, it records."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for grant in list(self._pending):
            if self._status in _TERMINAL:
                return
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                # A look (timeout 0, a poll) finds None while nothing came, not an exception.
                word = self._server.poll_notify(grant) if left == 0 else self._server.wait_notify(grant, left)
                if word is None:
                    return
                value, status = word
            except TimeoutError:
                return
            except _LibdCancelled:
                self._end(OperationStatus.CANCELLED, "cancelled by this side")
                return
            except ConnectionError:
                self._end(OperationStatus.ERRORED, "the peer's connection closed before it said it finished "
                                                   "(the peer died, was cut off, or gave up)", ConnectionError)
                return
            except KeyError:
                # The grant is gone: this side ended the operation meanwhile (status says how).
                return
            except OSError as e:
                if e.errno == errno.EKEYEXPIRED:
                    self._end(OperationStatus.ERRORED, "the operation expired before the peer finished", TimeoutError)
                else:
                    self._end(OperationStatus.ERRORED, f"waiting for the peer failed: {e}", OSError)
                return
            except Exception as e:  # noqa: BLE001 - nothing escapes the waiting thread unrecorded
                self._end(OperationStatus.ERRORED, f"waiting for the peer failed: {e}", RuntimeError)
                return
            if value != self._value:
                self._end(OperationStatus.ERRORED, "the peer sent a notification for another operation", RuntimeError)
                return
            if status != 0:
                if -status == errno.ECANCELED:
                    self._end(OperationStatus.CANCELLED, "the peer cancelled its transfer")
                else:
                    self._end(OperationStatus.ERRORED, f"the peer's transfer failed: {os.strerror(-status)}", ConnectionError)
                return
            self._pending.discard(grant)
        if not self._pending:
            self._end(OperationStatus.COMPLETE, "")

    def _release(self) -> None:
        """Revokes every grant and withdraws the memory; idempotent."""
        elements, self._elements = self._elements, []
        grants, self._grants = self._grants, []
        if self._fd >= 0:
            for g in grants:
                self._server.unwatch_notify(g, self._fd)  # nothing writes to it after this
        # Each grant revoked by its id, not only with its element: a grant that expired is no
        # longer the element's, and only its revoke lets go of the record the server keeps of
        # it. Already gone (KeyError) or the connector's server stopped (ConnectionError):
        # stopping revoked everything, which is what this wanted.
        for g in grants:
            try:
                self._server.revoke(g)
            except (KeyError, ConnectionError):
                pass
        for e in elements:
            try:
                self._server.withdraw(e)
            except (KeyError, ConnectionError):
                pass


class ReadableOperation(PassiveOperation):
    """Local memory a remote ReadOperation may read, once."""

    _kind = OperationKind.READ


class WritableOperation(PassiveOperation):
    """Local memory a remote WriteOperation may write, once."""

    _kind = OperationKind.WRITE
