"""action.runtime: asks the host's runtime for new memory elements while an action runs.

The contract (docs/runtime-endpoint.md): the launcher learns the endpoint from the environment —
SCAD_RUNTIME_URL (e.g. http://127.0.0.1:7070) and SCAD_RUNTIME_TOKEN (a bearer token for this
action) — and speaks JSON over HTTP:

    POST   {url}/v1/actions/{aid}/elements         {"template": T, "name": N, "props": {...}}
           201 {"name": N, "durl": "N;IMPL", "config": "KEY,VALUE;..."}
    DELETE {url}/v1/actions/{aid}/elements/{name}  204

Errors come back as {"error": "..."} with a 4xx/5xx status.

Peer failures: when another compute instance of the same activation crashes, times out or raises,
the agent tells this one (a notice line on the launcher's stdin, read by its notice thread).
`peer_failures()` lists the notices so far; `wait_peer_failure(timeout)` blocks for the next one.
Each is {"aid", "element", "instance", "status", "type", "reason", "shared"}, where "shared" names
the memory elements both instances reach.
"""
import json
import os
import threading
from urllib.parse import quote


class RuntimeRequestError(RuntimeError):
    """The runtime refused or failed a request; `status` is the HTTP status (0: unreachable)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class RuntimeClient:
    def __init__(self, action, url=None, token=None, timeout=30.0):
        self._action = action
        self.url = (url or os.environ.get("SCAD_RUNTIME_URL", "")).rstrip("/")
        self.token = token if token is not None else os.environ.get("SCAD_RUNTIME_TOKEN", "")
        self.timeout = timeout
        self._failures = []
        self._failures_cv = threading.Condition()

    def _peer_failed(self, notice):
        """Called by the launcher's notice thread."""
        with self._failures_cv:
            self._failures.append(notice)
            self._failures_cv.notify_all()

    def peer_failures(self):
        """The failures of peer instances reported so far (a copy)."""
        with self._failures_cv:
            return list(self._failures)

    def wait_peer_failure(self, timeout=None):
        """The first peer failure, waiting up to `timeout` seconds for one; None if none came."""
        with self._failures_cv:
            self._failures_cv.wait_for(lambda: self._failures, timeout)
            return self._failures[0] if self._failures else None

    def _request(self, method, path, body=None):
        # Imported on first use: urllib.request (with http.client and ssl) is 10-20 ms of every
        # compute process's start otherwise, and most actions never call the runtime.
        import urllib.error
        import urllib.request

        if not self.url:
            raise RuntimeRequestError(0, "no runtime endpoint: this action was not started by a Scad runtime, "
                                         "or its manifest gives it no network (SCAD_RUNTIME_URL is not set)")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
                return json.loads(raw) if raw else {}
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read()).get("error", "")
            except Exception:
                detail = ""
            raise RuntimeRequestError(e.code, f"runtime refused {method} {path}: {e.code} {detail or e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeRequestError(0, f"runtime at {self.url} unreachable: {getattr(e, 'reason', e)}") from None

    def _path(self, *parts):
        return "/v1/actions/" + "/".join(quote(str(p), safe="") for p in (self._action.id, *parts))

    def invoke(self, template, trans, props=None):
        """Starts a new element from `template`, joins it to this action as transport `trans` and
        returns once the transport is usable."""
        if trans in self._action.transport_names():
            raise ValueError(f"this action already has a transport named {trans!r}")
        reply = self._request("POST", self._path("elements"),
                              {"template": template, "name": trans, "props": props or {}})
        try:
            durl, config = reply["durl"], reply["config"]
        except (KeyError, TypeError):
            raise RuntimeRequestError(500, f"runtime answered without durl/config: {reply!r}") from None
        self._action.add_transport(durl)
        self._action.config_transport(trans, config)
        t = self._action.get_transport(trans, "rdma")
        t.connect()   # usable on return, or the error now
        return t

    def release(self, name):
        """Releases an element this action invoked; the runtime revokes access at once."""
        try:
            self._action.get_transport(name, "rdma").terminate()
        except KeyError:
            raise KeyError(f"this action has no transport named {name!r}") from None
        self._request("DELETE", self._path("elements", name))
