"""QueuePair: this process's queue pair to another process's RdmaManager.

Monarch's model: one queue pair per route, a route being two managers, and every buffer moved
between them goes through it. get()/put() take any buffer the owner's manager lent and return at
once; poll() and wait() collect the completions of everything started.

Underneath, each buffer's key has a link of its own (_key_link.py): libd authenticates a link with
one grant. The queue pair makes a buffer's link on its first transfer (the key is attached with
that transfer) and keeps it until this process drops the buffer or releases the queue pair. Over
shm and tcp the links to one owner ride the process's one connection to it; over verbs each is
an RC connection of its own.
"""
from __future__ import annotations

import errno
import threading
import time
from typing import Any, Dict, List, Optional

from ._buffer import RdmaBuffer
from ._key_link import KeyLink, refusal


def owner_of(remote: RdmaBuffer) -> tuple:
    """The manager that lent remote: its name and where its server listens."""
    return (remote.owner, remote.host, remote.port, remote.path)


class QueuePair:
    def __init__(self, manager: Any, owner: tuple) -> None:
        self._manager = manager
        self.owner = owner  # (manager name, host, port, path): owner_of()
        self._lock = threading.Lock()
        self._links: Dict[tuple, KeyLink] = {}  # route -> the link this queue pair made for it
        self._started: Dict[tuple, tuple] = {}  # route -> (link, new, remote): transfers started since the last wait
        self._closed = False
        self.impl = ""  # the transport of the last transfer started: "shm", "tcp" or "verbs"

    def get(self, local: Any, remote: RdmaBuffer, offset: int = 0) -> None:
        """Starts reading remote[offset:offset+len(local)] into local (or into a list of local
        memories, in order); returns at once."""
        self._start(local, remote, offset, True)

    def put(self, local: Any, remote: RdmaBuffer, offset: int = 0) -> None:
        """Starts writing local (or a list of local memories, in order) into
        remote[offset:offset+len(local)]; returns at once."""
        self._start(local, remote, offset, False)

    def move_list(self, pairs: List[tuple], remote: RdmaBuffer, read: bool = True) -> None:
        """Starts one transfer of several local buffers, [(local, offset in remote)], each to or
        from its own part of remote (a buffer lent as a list: each part within one of its
        ranges); the local buffers are registered together for it. Returns at once."""
        self._begin(remote, lambda link: link.move_list(pairs, remote, read))

    def poll(self) -> bool:
        """True once every transfer started has finished; raises the first failure."""
        with self._lock:
            started = list(self._started.items())
        done = True
        for route, (link, new, _) in started:
            try:
                done = link.poll() and done
            except (PermissionError, ConnectionError) as e:
                self._failed(route, link)
                raise self._refusal(e, link, new) from None
        if done:
            with self._lock:
                for route, entry in started:
                    if self._started.get(route) is entry:
                        del self._started[route]
        return done

    async def wait(self, timeout: Optional[float] = None, busy_poll_us: Optional[float] = None) -> None:
        """Waits for every transfer started; TimeoutError if `timeout` seconds pass first (they
        go on: wait again, or cancel()). busy_poll_us: how long to poll before sleeping (default:
        the manager's)."""
        poll_us = self._manager.busy_poll_us if busy_poll_us is None else busy_poll_us
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            started = list(self._started.items())
        for route, entry in started:
            link, new, remote = entry
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                await link.wait(left, poll_us)
            except TimeoutError:
                raise TimeoutError(f"the transfers did not finish within {timeout} s (they go on)") from None
            except (PermissionError, ConnectionError) as e:
                self._failed(route, link)
                raise self._refusal(e, link, new) from None
            self._manager._mark_reached(remote)
            with self._lock:
                if self._started.get(route) is entry:
                    del self._started[route]

    def cancel(self) -> None:
        """Cancels every transfer started: once it returns, libd touches none of their memory. The
        queue pair goes on working (a link the cancel broke is replaced at its next transfer)."""
        with self._lock:
            started, self._started = list(self._started.items()), {}
        for route, (link, _, _) in started:
            link.cancel()
            if link.broken():
                self._failed(route, link)

    def __repr__(self) -> str:
        return f"QueuePair(owner={self.owner[0]!r}, keys={len(self._links)}, closed={self._closed})"

    # ---- the machinery ------------------------------------------------------------------
    def _start(self, local: Any, remote: RdmaBuffer, offset: int, read: bool) -> None:
        self._begin(remote, lambda link: (link.get if read else link.put)(local, remote, offset))

    def _begin(self, remote: RdmaBuffer, start: Any) -> None:
        if owner_of(remote) != self.owner:
            raise ValueError(f"this queue pair leads to manager {self.owner[0]!r}, and the buffer is "
                             f"{remote.owner!r}'s: request_queue_pair(remote) for that one")
        route = remote.route
        with self._lock:
            if self._closed:
                raise ConnectionError(errno.ECONNABORTED, "the queue pair was released")
            link, new = self._manager._link(remote, expose=True)  # a caller's: never pointed elsewhere
            self._links[route] = link
            entry = self._started.get(route)
            if entry is None or entry[0] is not link:  # a link made again since (the buffer dropped here)
                entry = self._started[route] = (link, new, remote)
        try:
            start(link)
        except (PermissionError, ConnectionError) as e:
            self._failed(route, link)
            raise self._refusal(e, link, entry[1]) from None
        self.impl = link.impl

    def _failed(self, route: tuple, link: KeyLink) -> None:
        """A link whose key was refused or whose owner is gone is of no more use: the next
        transfer on that buffer makes a new one, and hears the owner's answer."""
        with self._lock:
            if self._started.get(route, (None,))[0] is link:
                del self._started[route]
            if self._links.get(route) is link:
                del self._links[route]
        if self._manager._links.get(route) is link:
            self._manager._forget_link(route)

    @staticmethod
    def _refusal(e: OSError, link: KeyLink, new: bool) -> OSError:
        return refusal(e, link.impl, new)

    def _close_links(self) -> None:
        """Released (RdmaManager.release_queue_pair): every link it made is closed, its key let
        go of; the owners' grants stay."""
        with self._lock:
            self._closed = True
            links, self._links, self._started = self._links, {}, {}
        for route, link in links.items():
            if self._manager._links.get(route) is link:
                self._manager._forget_link(route)
