"""The action object a compute element's main(args, action) receives.

It is libd's action (disagg.LibdAction: transports, reads and writes) with what the platform adds
around it: `action.runtime`, the client of the runtime endpoint that hands out new memory elements
and reports peer failures. The binding knows nothing of the platform; this layer adds it.
"""
from __future__ import annotations

import threading
from typing import Optional

import disagg

from .runtime_client import RuntimeClient


class Action(disagg.LibdAction):
    """Action(aid, **options), as disagg.LibdAction, plus:

    runtime_url, runtime_token: the endpoint and this instance's bearer token (the launcher sets
        them; unset, the client reads SCAD_RUNTIME_URL and SCAD_RUNTIME_TOKEN);
    runtime: asks the runtime for new elements (invoke(template, name, props), release(name)) and
        hears of failed peers (peer_failures(), wait_peer_failure(timeout)).
    """

    def __init__(self, *args, **options) -> None:
        super().__init__(*args, **options)
        self.runtime_url: Optional[str] = None
        self.runtime_token: Optional[str] = None
        self._runtime: Optional[RuntimeClient] = None
        self._runtime_lock = threading.Lock()

    @property
    def runtime(self) -> RuntimeClient:
        with self._runtime_lock:  # every thread gets the same client (it holds the peer notices)
            if self._runtime is None:
                self._runtime = RuntimeClient(self, self.runtime_url, self.runtime_token)
            return self._runtime
