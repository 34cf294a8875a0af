"""QueuePair: this process's queue pair to another process's RdmaManager.

Monarch's model: one queue pair per route, a route being two managers, and every buffer moved
between them goes through it. get()/put() take any buffer the owner's manager lent and return at
once; poll() and wait() collect the completions of the transfers started through this queue pair.

Underneath, each buffer's key has a link of its own (_key_link.py): libd authenticates a link with
one grant. The queue pair makes a buffer's link on its first transfer (the key is attached with
that transfer) and keeps it until this process drops the buffer or releases the queue pair. Over
shm and tcp the links to one owner ride the process's one connection to it; over verbs each is
an RC connection of its own.
"""
from __future__ import annotations

import errno
import threading
from concurrent.futures import CancelledError
from typing import Any, Dict, List, Optional

from .._waiter import WaitFd, wait_ready
from ._buffer import RdmaBuffer
from ._key_link import KeyLink, refusal


def owner_of(remote: RdmaBuffer) -> tuple:
    """The manager that lent remote: its name and where its server listens."""
    return (remote.owner, remote.host, remote.port, remote.path)


class _Started:
    """A transfer started through the queue pair: its libd operation and what a failure means."""

    __slots__ = ("route", "link", "new", "op")

    def __init__(self, route: tuple, link: KeyLink, new: bool, op: Any) -> None:
        self.route, self.link, self.new, self.op = route, link, new, op


class QueuePair:
    def __init__(self, manager: Any, owner: tuple) -> None:
        self._manager = manager
        self.owner = owner  # (manager name, host, port, path): owner_of()
        self._lock = threading.Lock()
        self._links: Dict[tuple, KeyLink] = {}  # route -> the link this queue pair holds for it
        self._started: List[_Started] = []  # transfers not yet collected by poll() or wait()
        self._fd = WaitFd()  # the eventfd libd writes to as they complete (wait)
        self._closed = False
        self.impl = ""  # the transport of the last transfer started: "shm", "tcp" or "verbs"

    def get(self, local: Any, remote: RdmaBuffer, offset: int = 0) -> None:
        """Starts reading remote[offset:offset+len(local)] into local (or into a list of local
        memories, in order); returns at once."""
        self._begin(remote, lambda link: link.get(local, remote, offset))

    def put(self, local: Any, remote: RdmaBuffer, offset: int = 0) -> None:
        """Starts writing local (or a list of local memories, in order) into
        remote[offset:offset+len(local)]; returns at once."""
        self._begin(remote, lambda link: link.put(local, remote, offset))

    def move_list(self, pairs: List[tuple], remote: RdmaBuffer, read: bool = True) -> None:
        """Starts one transfer of several local buffers, [(local, offset in remote)], each to or
        from its own part of remote (a buffer lent as a list: each part within one of its
        ranges); the local buffers are registered together for it. Returns at once."""
        self._begin(remote, lambda link: link.move_list(pairs, remote, read))

    def poll(self) -> bool:
        """True once every transfer started has finished; raises the first failure (those that
        finished are collected either way)."""
        with self._lock:
            started = list(self._started)
        done = [s for s in started if s.op.done()]
        self._collect(done)
        return len(done) == len(started)

    async def wait(self, timeout: Optional[float] = None, busy_poll_us: Optional[float] = None) -> None:
        """Waits for every transfer started; TimeoutError if `timeout` seconds pass first (they
        go on: wait again, or cancel()). busy_poll_us: how long to poll before sleeping (default:
        the manager's)."""
        poll_us = self._manager.busy_poll_us if busy_poll_us is None else busy_poll_us
        with self._lock:
            started = list(self._started)
        if not started:
            return
        fd = self._fd.take()
        done = lambda: all(s.op.done() for s in started)  # noqa: E731 - a look also reads answers in (libd)

        def arm(fd: int) -> None:
            for s in started:
                s.op.watch(fd)  # libd writes to it as each completes

        try:
            fd, ok = await wait_ready(done, poll_us, timeout, fd, arm)
        finally:
            for s in started:
                s.op.watch(-1)  # nothing of these writes to the fd later: it serves the next wait
            self._fd.give_back(fd)
        if not ok:
            raise TimeoutError(f"the transfers did not finish within {timeout} s (they go on)")
        self._collect(started)

    def cancel(self) -> None:
        """Cancels every transfer started through this queue pair: once it returns, libd touches
        none of their memory. The queue pair goes on working (a link the cancel broke, as over
        verbs, is replaced at its next transfer)."""
        with self._lock:
            started, self._started = self._started, []
        for s in started:
            s.link.cancel_ops([s.op])
        for s in started:
            if s.link.broken():
                self._failed(s.route, s.link)

    def __repr__(self) -> str:
        return f"QueuePair(owner={self.owner[0]!r}, keys={len(self._links)}, closed={self._closed})"

    # ---- the machinery ------------------------------------------------------------------
    def _begin(self, remote: RdmaBuffer, start: Any) -> None:
        if owner_of(remote) != self.owner:
            raise ValueError(f"this queue pair leads to manager {self.owner[0]!r}, and the buffer is "
                             f"{remote.owner!r}'s: request_queue_pair(remote) for that one")
        route = remote.route
        with self._lock:
            if self._closed:
                raise ConnectionError(errno.ECONNABORTED, "the queue pair was released")
            link, new = self._manager._link(remote, expose=True)  # a caller's: never pointed elsewhere
            self._adopt_locked(route, link)
            new = new and not self._manager._reached(remote)
            try:
                op = start(link)
            except (PermissionError, ConnectionError) as e:
                failed = e
            else:
                self._started.append(_Started(route, link, new, op))
                self.impl = link.impl
                return
        self._failed(route, link)
        raise refusal(failed, link.impl, new) from None

    def _adopt(self, route: tuple, link: KeyLink) -> None:
        with self._lock:
            self._adopt_locked(route, link)

    def _adopt_locked(self, route: tuple, link: KeyLink) -> None:
        self._links[route] = link
        link.queue_pair = self

    def _collect(self, finished: List[_Started]) -> None:
        """Takes finished transfers off the list; raises the first one's failure."""
        if not finished:
            return
        gone = set(map(id, finished))
        with self._lock:
            self._started = [s for s in self._started if id(s) not in gone]
        for s in finished:
            try:
                s.op.wait(0)
            except (PermissionError, ConnectionError) as e:
                self._failed(s.route, s.link)
                raise refusal(e, s.link.impl, s.new) from None
            except CancelledError:
                raise ConnectionAbortedError(errno.ECONNABORTED, "a transfer of this queue pair was cancelled: its "
                                             "buffer was dropped in this process, or the queue pair released") from None
            self._manager._mark_reached_route(s.route)

    def _failed(self, route: tuple, link: KeyLink) -> None:
        """A link whose key was refused, whose owner is gone or that a cancel broke is of no more
        use: the next transfer on that buffer makes a new one, and hears the owner's answer."""
        if self._manager._links.get(route) is link:
            self._manager._forget_link(route)  # closes it, and tells this queue pair (_forget)
        else:
            self._forget(route, link)

    def _forget(self, route: tuple, link: KeyLink) -> None:
        """The manager closed the link (the buffer dropped here, a failure): it is let go of."""
        with self._lock:
            if self._links.get(route) is link:
                del self._links[route]

    def _close_links(self) -> None:
        """Released (RdmaManager.release_queue_pair): every transfer it started is cancelled and
        every link it holds closed, its key let go of; the owners' grants stay."""
        with self._lock:
            self._closed = True
            links, self._links, self._started = self._links, {}, []
        for route, link in links.items():
            if self._manager._links.get(route) is link:
                self._manager._forget_link(route)
            else:
                link.close()
        self._fd.close()  # every transfer ended (cancelled with its link): nothing writes to it
