"""Waiting on libd from asyncio without holding the event loop.

wait_fd: the event loop itself watches an eventfd that libd writes to when the awaited thing
happens (an operation completes: Operation.watch; a grant gets word, is lost, ends:
watch_notify), and the awaiting task looks again each time it is written. No thread, no hand-off:
the task wakes straight from the loop's poll.

wait_in_thread, for calls that can only block: the call runs in a daemon thread of its own with
the GIL released, so an operation nobody ends can never keep the interpreter from exiting, which a
pool's worker would (pools are joined at exit). Whatever the call raises reaches the awaiting
task; nothing escapes the thread.
"""
import asyncio
import os
import threading
import time
from typing import Any, Callable, Optional


def new_eventfd() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def _drain(fd: int) -> None:
    try:
        os.eventfd_read(fd)
    except OSError:  # nothing written since (EAGAIN), or the descriptor is gone already
        pass


def poll_until(ready: Callable[[], bool], busy_poll_us: float) -> bool:
    """Looks at ready() again and again (yielding the CPU between looks) for up to busy_poll_us
    microseconds: True as soon as it is. For callers that trade a core for latency, as busy-polling
    RDMA stacks do: a sleeper's wake-up costs tens of microseconds on a busy host."""
    if ready():
        return True
    if busy_poll_us <= 0:
        return False
    end = time.perf_counter() + busy_poll_us * 1e-6
    while time.perf_counter() < end:
        os.sched_yield()
        if ready():
            return True
    return False


def poll_operation(op: Any, busy_poll_us: float) -> bool:
    """poll_until for one libd operation: its own poll_for, which loops in C with the GIL released
    (a binding built before it offered poll_for: poll_until's way, one Python call per look)."""
    poll = getattr(op, "poll_for", None)
    return poll(busy_poll_us) if poll is not None else poll_until(op.done, busy_poll_us)


async def wait_fd(fd: int, ready: Callable[[], bool], timeout: Optional[float]) -> bool:
    """Waits until ready() is true, looking again each time `fd` is written. False if `timeout`
    seconds pass first. The writer must be set up before this is called (a write that came
    earlier leaves the fd readable: nothing is missed)."""
    if ready():
        return True
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def look() -> None:
        _drain(fd)
        if not fut.done() and ready():
            fut.set_result(True)

    loop.add_reader(fd, look)
    try:
        if timeout is None:
            await fut
        else:
            await asyncio.wait_for(fut, timeout)
        return True
    except asyncio.TimeoutError:
        return ready()
    finally:
        loop.remove_reader(fd)


async def wait_ready(ready: Callable[[], bool], busy_poll_us: float, timeout: Optional[float], fd: int,
                     arm: Callable[[int], None], op: Any = None) -> "tuple[int, bool]":
    """Polls ready() for up to busy_poll_us (never past `timeout`), then sleeps on an eventfd
    until it is true: `fd`, or a new one when fd < 0, which arm(fd) sets libd writing to (again
    each time: arming is idempotent, and new writers may have come). Returns the eventfd for the
    caller to keep and whether ready() came true within `timeout`. op: the one libd operation
    ready() waits for, if that is all it waits for: polled in C (poll_operation)."""
    spin = busy_poll_us if timeout is None else min(busy_poll_us, timeout * 1e6)
    if poll_operation(op, spin) if op is not None else poll_until(ready, spin):
        return fd, True
    if fd < 0:
        fd = new_eventfd()
    arm(fd)  # before looking again: no write is missed
    return fd, await wait_fd(fd, ready, timeout)


class WaitFd:
    """The eventfd an object's waits share (made by the first, kept for the next), and its end:
    closed with the object, or by the last wait under way if the object closed meanwhile (a
    descriptor closed under a wait could be reused by the time the wait stops watching it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = -1
        self._waiters = 0
        self._closed = False

    def take(self) -> int:
        """For a wait about to start: the fd (-1 before the first; wait_ready makes one)."""
        with self._lock:
            self._waiters += 1
            return self._fd

    def give_back(self, fd: int) -> None:
        """The wait ended with fd: kept for the next, or closed if this was closed meanwhile and
        no other wait is on it."""
        with self._lock:
            self._waiters -= 1
            if not self._closed:
                self._fd = fd
                return
            last = self._waiters == 0
            fd, self._fd = (fd if fd >= 0 else self._fd), -1
        if last and fd >= 0:
            os.close(fd)

    def close(self) -> None:
        """Closes the fd now, or leaves it to the waits under way. Once their operations ended
        (cancelled), nothing writes to it any more."""
        with self._lock:
            self._closed = True
            if self._waiters:
                return
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def _settle(fut: asyncio.Future, result: Any, error: BaseException) -> None:
    if fut.cancelled():
        return  # the awaiting task gave up; the thread's answer has nobody to go to
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def wait_in_thread(fn: Callable[..., Any], *args: Any) -> "asyncio.Future[Any]":
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def body() -> None:
        result, error = None, None
        try:
            result = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            error = e
        try:
            loop.call_soon_threadsafe(_settle, fut, result, error)
        except RuntimeError:
            pass  # the event loop is closed: nobody awaits any more

    threading.Thread(target=body, name="scad-connect-wait", daemon=True).start()
    return fut
