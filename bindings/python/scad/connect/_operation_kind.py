"""The kinds and states of an operation, with dynamo.nixl_connect's names and values, and how an
operation of either side ends."""
import os
from enum import IntEnum

from ._errors import OperationCancelledError


class OperationKind(IntEnum):
    UNSPECIFIED = 0
    READ = 1   # the passive side is readable; the active side reads it
    WRITE = 2  # the passive side is writable; the active side writes it

    def __str__(self) -> str:
        return self.name


class OperationStatus(IntEnum):
    UNINITIALIZED = 0  # not set up yet
    INITIALIZED = 1    # set up: a passive operation waits for its peer
    IN_PROGRESS = 2    # an active operation's transfers are running
    COMPLETE = 3       # done: both sides know
    CANCELLED = 4      # cancelled by this side or by the peer
    ERRORED = 5        # failed (peer gone, refused, expired)

    def __str__(self) -> str:
        return self.name


TERMINAL = (OperationStatus.COMPLETE, OperationStatus.CANCELLED, OperationStatus.ERRORED)


class OperationBase:
    """What both sides of an operation share: Dynamo's connector and kind, and how an operation
    ends (the first end wins, and its resources are released once). The class provides
    _connector, _kind, _lock, _status and _release."""

    @property
    def connector(self):
        return self._connector

    @property
    def operation_kind(self) -> OperationKind:
        return self._kind

    def _end(self, status: OperationStatus, why: str, error: type = OperationCancelledError) -> None:
        with self._lock:
            if self._status in TERMINAL:
                return
            self._status = status
            self._why = why
            self._error = error
        self._release()

    def _close_wait_fd(self) -> None:
        """Closes the eventfd a wait made, once the operation has ended: its end let go of every
        grant or transfer that wrote to it (revoked, unwatched), so nothing writes to it any more,
        and an ended operation waits no more. (Kept until then: a wait that timed out waits again.)"""
        fd = getattr(self, "_fd", -1)
        if fd >= 0 and self._status in TERMINAL:
            self._fd = -1
            os.close(fd)

    def _raise_if_failed(self) -> None:
        if self._status is OperationStatus.CANCELLED:
            raise OperationCancelledError(f"{type(self).__name__}: {self._why}")
        if self._status is OperationStatus.ERRORED:
            raise self._error(f"{type(self).__name__}: {self._why}")

