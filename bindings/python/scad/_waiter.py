"""Waiting on libd from asyncio without holding the event loop.

A wait blocks in libd with the GIL released until its event (a notification, a completion, a
revoke, a deadline) wakes it, in a daemon thread of its own: an operation nobody ends can never
keep the interpreter from exiting, which a pool's worker would (pools are joined at exit).
Whatever the call raises reaches the awaiting task; nothing escapes the thread.
"""
import asyncio
import threading
from typing import Any, Callable


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
