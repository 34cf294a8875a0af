"""The kinds and states of an operation, with dynamo.nixl_connect's names and values."""
from enum import IntEnum


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
