"""The one exception of its own scad.connect raises; every other failure is a built-in with a
message that says what happened: ConnectionError (peer gone), TimeoutError (deadline or expiry),
PermissionError (the owner refused the metadata), ValueError / TypeError (bad arguments)."""


class OperationCancelledError(RuntimeError):
    """The operation was cancelled, by this side (cancel(), leaving its `with` block) or by its
    peer. Not asyncio.CancelledError: a cancelled transfer must not look like a cancelled task."""
