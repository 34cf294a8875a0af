"""Runs one user action: loads its file, calls main(args, action) with a configured LibdAction,
and returns the result as JSON. The action is always terminated (its transports released), also
when main raises; an exception becomes an error result, never a crash of the host.

As a program (what the host agent starts):
    python -m scad.launcher < spec.json
where spec is {"aid", "code", "main", "args", "transports": [{"durl", "config"}], "options",
"runtime_url", "runtime_token", "env"}. The user's output goes to stderr, each line it printed to
stdout marked with STDOUT_MARK (the agent logs those as stdout); stdout carries exactly one JSON
line: the result. "env" holds OpenWhisk's __OW_* variables and the manifest's `environment`,
set before the code is loaded (a library that reads one at import sees it) and for the run only. On the
platform the code comes in the spec too ("code_key" with "files", or a zip action's "zip" and
"binary": code_folder.py says where it goes).

    python -m scad.launcher --serve
keeps the interpreter for many runs (the agent's warm and pre-warmed pools): one spec per line on
stdin, one result line per spec on stdout; the run's output on stderr, ended by a marker. While a
run is going, stdin may also carry {"notice": {...}, "aid": AID} lines: a peer instance failed.
A thread reads stdin so that these reach action.runtime while main runs. A warm
process keeps the action's module (and its globals) between runs of the same code, as a warm
OpenWhisk container does; the agent reuses a process only for the same action.
"""
import contextlib
import importlib.util
import io
import json
import os
import queue
import re
import sys
import threading
import time
import traceback
import uuid

from scad import code_folder, ow_code
from scad.action import Action
from scad.main_signature import takes_action


_loaded = {}  # (code path, mtime) -> module: what a warm process keeps


def load_main(code, main="main", keep=False, binary=False):
    """main of the code's file; for a zip action (binary), of the unpacked folder's __main__.py,
    loaded as the action container loads it (ow_code: its folder and virtualenv on sys.path)."""
    if keep:
        key = (code, os.stat(code).st_mtime_ns)
        module = _loaded.get(key)
        if module is None:
            module = _loaded[key] = _load_module(code, binary)
    else:
        module = _load_module(code, binary)
    fn = getattr(module, main, None)
    if not callable(fn):
        raise AttributeError(f"{code!r} has no function {main!r}")
    return fn


def _load_module(code, binary=False):
    if binary:
        return ow_code.import_folder(os.path.dirname(code))
    name = f"scad_action_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, code)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load action code from {code!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _text(s):
    """s as valid UTF-8 text: an exception's message may hold lone surrogates (bytes decoded with
    surrogateescape), which no JSON reader on the other side accepts."""
    return s.encode("utf-8", "replace").decode("utf-8")


def call_main(fn, args, action):
    """main(args, action) as Scad's actions take it; main(args) as plain OpenWhisk actions do."""
    return fn(args, action) if takes_action(fn) else fn(args)


_current = {"aid": None, "action": None}  # the run in progress, for peer notices
_early = {}  # aid -> notices that came just before their run's spec
_current_lock = threading.Lock()


STDOUT_MARK = "\x1fscad:stdout\x1f"  # agent/src/agent.cc, kStdoutMark


class MarkedStdout(io.TextIOBase):
    """sys.stdout while an action runs: what it prints goes to stderr (fd 1 carries results), each
    line marked so that the agent can log it as stdout, as OpenWhisk's logs tell the streams apart."""

    def __init__(self, err):
        self._err = err
        self._line_start = True

    @property
    def encoding(self):
        return getattr(self._err, "encoding", "utf-8")

    def writable(self):
        return True

    def fileno(self):
        return self._err.fileno()

    def write(self, s):
        if not s:
            return 0
        pieces = s.split("\n")
        out = []
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            if piece and self._line_start:
                out.append(STDOUT_MARK)
            out.append(piece if last else piece + "\n")
            if not last:
                self._line_start = True
            elif piece:
                self._line_start = False
        self._err.write("".join(out))
        return len(s)

    def flush(self):
        self._err.flush()

    @property
    def buffer(self):
        """sys.stdout.buffer: bytes, marked the same way."""
        return _MarkedBytes(self)

    def _write_bytes(self, b):
        self._err.flush()  # what was written as text comes first
        pieces = bytes(b).split(b"\n")
        out = []
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            if piece and self._line_start:
                out.append(STDOUT_MARK.encode())
            out.append(piece if last else piece + b"\n")
            if not last:
                self._line_start = True
            elif piece:
                self._line_start = False
        self._err.buffer.write(b"".join(out))
        return len(b)

    def end_line(self):
        """Ends a last line printed without a newline, so that the next run's output starts a line."""
        if not self._line_start:
            self._err.write("\n")
            self._line_start = True
        self._err.flush()


class _MarkedBytes(io.RawIOBase):
    """MarkedStdout's binary side (sys.stdout.buffer)."""

    def __init__(self, text):
        self._text = text

    def writable(self):
        return True

    def write(self, b):
        return self._text._write_bytes(b)

    def flush(self):
        self._text._err.buffer.flush()


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _run_env(spec):
    """The run's variables: names of letters, digits and '_', text values (the agent checked the
    rest: which names a manifest may set)."""
    env = spec.get("env")
    if not isinstance(env, dict):
        return {}
    return {k: v for k, v in env.items()
            if isinstance(k, str) and _ENV_NAME.fullmatch(k) and isinstance(v, str) and "\0" not in v}


def run_action(spec, keep_module=False):
    """Returns {"ok": True, "result": ...} or {"ok": False, "error": {"type", "message", "traceback"}},
    the error with "init" when the code could not be placed or loaded ("build": it does not
    compile; "start": anything else, a bad zip, an import that raises, no such main), with "init_ms" (loading the code and wiring the action), "run_ms" (main itself) and
    "transports" (what the action's transports moved, per kind) and "transfers" (per transport)."""
    action = None
    t0 = time.monotonic()
    timing = {}
    env = _run_env(spec)
    before = {k: os.environ.get(k) for k in env}
    loading = True  # what fails while true is the code's (an init failure), not main's
    try:
        os.environ.update(env)
        # The uid switch comes first: a device opened as root (a verbs context) refuses commands
        # from the same process once its credentials changed.
        code = code_folder.place(spec) if "files" in spec or "zip" in spec else spec["code"]
        loading = False
        action = Action(spec.get("aid") or f"action-{uuid.uuid4().hex[:8]}", **spec.get("options", {}))
        if spec.get("runtime_url"):
            action.runtime_url = spec["runtime_url"]
        if spec.get("runtime_token"):
            action.runtime_token = spec["runtime_token"]
        for t in spec.get("transports", []):
            action.add_transport(t["durl"])
            if t.get("config"):
                action.config_transport(t["durl"].split(";", 1)[0], t["config"])
        action.runtime  # made here, once: the notice thread and main must share one object
        with _current_lock:
            _current.update(aid=action.id, action=action)
            early = _early.pop(action.id, [])
            _early.clear()  # any other aid's are from runs that are over
        for notice in [*spec.get("peer_failures", []), *early]:
            action.runtime._peer_failed(notice)
        loading = True
        fn = load_main(code, spec.get("main", "main"), keep=keep_module, binary=bool(spec.get("binary")))
        loading = False
        t1 = time.monotonic()
        timing["init_ms"] = int((t1 - t0) * 1000)
        result = call_main(fn, spec.get("args", {}), action)
        timing["run_ms"] = int((time.monotonic() - t1) * 1000)
        # The result must be JSON (no NaN, no lone surrogates): say so here, not in the host.
        json.dumps(result, allow_nan=False, ensure_ascii=False).encode("utf-8")
        reply = {"ok": True, "result": result}
    except BaseException as e:  # noqa: BLE001 - a user's SystemExit or KeyboardInterrupt is an error result too
        reply = {"ok": False, "error": {"type": _text(type(e).__name__), "message": _text(str(e)),
                                        "traceback": _text(traceback.format_exc())}}
        if loading:
            reply["error"]["init"] = _init_kind(e)
            if isinstance(e, ow_code.InitError):  # its message is the reason (with the user's traceback)
                reply["error"]["traceback"] = _text(str(e))
    finally:
        # A warm process runs the next activation too: its id, deadline and key must not stay.
        for k, v in before.items():  # the process's own value, where a manifest's replaced it
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        with _current_lock:
            _current.update(aid=None, action=None)
        transports, transfers = transport_usage(action) if action is not None else ({}, [])
        if action is not None:
            action.terminate()
    return {**reply, **timing, "transports": transports, "transfers": transfers}


def _init_kind(e):
    """OpenWhisk's two init failures: the code does not compile ("build"), or it does but cannot
    be started ("start")."""
    if isinstance(e, ow_code.InitError):
        return e.kind
    return "build" if isinstance(e, SyntaxError) else "start"


_KINDS = {"rdma_shm": "shm", "rdma_tcp": "tcp", "rdma_uverbs": "verbs", "rdma_local": "local"}


_COUNTS = ("read_ops", "write_ops", "read_bytes", "write_bytes", "errors", "busy_ns")


def transport_usage(action):
    """libd's counters of the action's client transports: per transport ("transfers": name, kind,
    operations, bytes, errors and the time they took, for the activation record) and summed per
    kind (shm, tcp, verbs, local; "transports", for the platform's /metrics)."""
    out, transfers = {}, []
    try:
        names = action.transport_names()
    except Exception:  # noqa: BLE001 - a terminated or broken action moved nothing more
        return out, transfers
    for name in names:
        try:
            t = action.get_transport(name, "rdma")
            kind = _KINDS.get(t.impl)
            stats = t.stats() if kind else None
        except Exception:  # noqa: BLE001 - a server transport, or one already gone
            continue
        if stats is None:
            continue
        transfers.append({"transport": name, "kind": kind, **{k: stats[k] for k in _COUNTS}})
        total = out.setdefault(kind, dict.fromkeys(_COUNTS, 0))
        for key in total:
            total[key] += stats[key]
    return out, transfers


END_OF_RUN = "\x00scad:end-of-run\x00"  # on stderr after each run: the agent reads its output up to here


def _deliver_notice(message):
    """A peer failure for the run in progress, or kept for the run about to start (the agent may
    write it just before that run's spec)."""
    with _current_lock:
        action = _current["action"] if _current["aid"] == message.get("aid") else None
        if action is None and len(_early) < 64:
            _early.setdefault(message.get("aid"), []).append(message["notice"])
    if action is not None:
        action.runtime._peer_failed(message["notice"])


def _read_stdin(specs):
    """Splits stdin: notices go to the running action at once, specs to the main thread."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if isinstance(message, dict) and isinstance(message.get("notice"), dict):
            _deliver_notice(message)
        else:
            specs.put(line)
    specs.put(None)


def _private_result_channel():
    """The agent reads results on fd 1, and user code can write there too (os.write(1, ...), a
    child process that inherits stdout). The launcher keeps a private duplicate for its results
    and points fd 1 at stderr, so whatever user code writes to fd 1 ends up in its logs and can
    never be taken for a result line. (os.dup's copy is not inherited by children.)"""
    sys.stdout.flush()
    fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(fd, "w", encoding="utf-8")


def _die_with_the_agent():
    """PR_SET_PDEATHSIG: the process ends when the agent does, even by SIGKILL (in a sandbox,
    bubblewrap sees to that as well)."""
    import ctypes
    import signal
    parent = os.getppid()  # (pid 1 is the sandbox's own init: that is a parent too)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def serve():
    """One spec per line in, one result per line out, until stdin closes. The run's output goes
    to stderr as it is written (so a crash loses none of it), followed by END_OF_RUN."""
    _die_with_the_agent()
    out = _private_result_channel()
    specs = queue.Queue()
    threading.Thread(target=_read_stdin, args=(specs,), daemon=True, name="scad-notices").start()
    for line in iter(specs.get, None):
        try:
            spec = json.loads(line)
        except ValueError as e:
            result = {"ok": False, "error": {"type": "ValueError", "message": f"bad spec: {e}"}}
        else:
            marked = MarkedStdout(sys.stderr)
            with contextlib.redirect_stdout(marked):
                result = run_action(spec, keep_module=True)
            marked.end_line()
        sys.stderr.flush()
        out.write(json.dumps(result) + "\n")
        out.flush()
        sys.stderr.write(END_OF_RUN + "\n")
        sys.stderr.flush()
    return 0


def main():
    if "--serve" in sys.argv[1:]:
        return serve()
    try:
        spec = json.load(sys.stdin)
    except ValueError as e:
        print(json.dumps({"ok": False, "error": {"type": "ValueError", "message": f"bad spec: {e}"}}))
        return 2
    channel = _private_result_channel()
    marked = MarkedStdout(sys.stderr)
    with contextlib.redirect_stdout(marked):
        out = run_action(spec)
    marked.end_line()
    channel.write(json.dumps(out) + "\n")
    channel.flush()
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
