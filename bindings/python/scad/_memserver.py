"""The memory server a process runs to lend its own memory (scad.connect, scad.rdma).

A libd server transport started with size,0: no element of its own, only memory exposed in place
(libd_trdma_server_expose). It listens on tcp (peers on other hosts), on a unix socket (peers on
this host: shm, by cross-memory attach) and takes RDMA verbs connections when this host has a
device. Also where a peer decides how to reach such a server.
"""
import json
import json.scanner
import os
import socket
import tempfile
from typing import Any

MAX_RANGES = 1024  # libd's LIBD_MAX_RANGES: the most memories one lent element (expose_ranges) holds

_scan_json = json.scanner.c_make_scanner(json.JSONDecoder()) if json.scanner.c_make_scanner else None


def loads_record(text: Any) -> Any:
    """json.loads(text), for the record a peer parses before every transfer: json's C scanner called
    directly, without the decoder's Python layers and whitespace expressions (0.7 µs of 2.3 for a
    buffer's record). Whatever it does not take whole (bytes, whitespace around the value, bad
    JSON) goes to json.loads, which parses it, or raises its own error, as before."""
    if type(text) is str and _scan_json is not None:
        try:
            value, end = _scan_json(text, 0)
        except (StopIteration, ValueError):
            end = -1
        if end == len(text):
            return value
    return json.loads(text)


_FROM_BINDING: dict = {}


def from_binding(name: str) -> Any:
    """disagg's function `name`, looked up once; None where the binding cannot be imported. The
    per-operation helpers it offers (a buffer's address, a record read in one pass) all have a
    Python way that the caller takes then."""
    try:
        return _FROM_BINDING[name]
    except KeyError:
        pass
    try:
        import disagg
    except ImportError:
        found = None
    else:
        found = getattr(disagg, name, None)  # (a binding built before it offered name: the Python way)
    _FROM_BINDING[name] = found
    return found


def has_rdma_device() -> bool:
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


def start(name: str, host: str, verbs: bool, busy_poll_us: float = 0.0):
    """Starts a server for the action `name`: (action, server transport, endpoint dict with host,
    port, path, verbs). busy_poll_us: how long the server's thread keeps polling after each
    request before it sleeps (0: at once). The caller terminates the action to stop it."""
    from disagg import LibdAction  # the binding is needed only once memory is lent

    path = os.path.join(tempfile.gettempdir(), f"{name}.sock")
    action = LibdAction(name)
    try:
        spin = f";busy_poll_us,{int(busy_poll_us)}" if busy_poll_us > 0 else ""
        action.add_transport(f"srv;{'verbs_server' if verbs else 'tcp_server'};size,0;host,{host};port,0;path,{path}{spin}")
        srv = action.get_transport("srv", "rdma_server")
        srv.serve(block=False)
        where = dict(pair.split(",", 1) for pair in srv.message.split(";"))
    except BaseException:
        action.terminate()
        raise
    return action, srv, {"host": where["host"], "port": int(where["port"]), "path": where["path"], "verbs": verbs}


def config_value(config: str, key: str) -> str:
    """The value of `key` in a configuration string libd made ("k,v;k,v;..."), whose keys are
    unique and whose values hold neither ',' nor ';' (a grant's: grant, secret, host...)."""
    if config.startswith(key + ","):
        at = len(key) + 1
    else:
        at = config.find(";" + key + ",")
        if at < 0:
            raise RuntimeError(f"libd's grant configuration has no {key!r}")  # libd's contract broke
        at += len(key) + 2
    end = config.find(";", at)
    return config[at:] if end < 0 else config[at:end]


def grant_of(config: str) -> tuple:
    """(grant, secret) of the configuration string of a grant libd made, which ends
    "grant,G;secret,S": two partitions from the end, where config_value's general search costs
    five times that (a lender makes one per buffer). Any other layout is searched as config_value
    does."""
    head, sep, secret = config.rpartition(";secret,")
    # Taken from the end only where each key is there once (config_value takes the first).
    if sep and ";" not in secret and "," not in secret and ";secret," not in head and not head.startswith("secret,"):
        before, sep, grant = head.rpartition("grant,")
        if sep and (not before or before[-1] == ";") and ";" not in grant and "," not in grant \
                and ";grant," not in before and not before.startswith("grant,"):
            return grant, secret
    return config_value(config, "grant"), config_value(config, "secret")


def where(impl: str, host: str, port: int, path: str) -> str:
    """The durl pairs that reach a memory server over `impl`. shm and tcp ride the process's shared
    connection to that server (libd's share,1: one connection per server, a grant attached to it
    per transport, each still confined to its own grant); verbs keeps a queue pair per grant."""
    if impl == "shm":
        return f"path,{path};share,1"
    if impl == "tcp":
        return f"host,{host};port,{port};share,1"
    return f"host,{host};port,{port}"


def choose_transport(forced, hostname: str, path: str, verbs: bool, whole: bool = True) -> str:
    """How to reach a server: shm when it is on this host (its socket is here) and the grant
    covers a whole element (shm hands out nothing smaller), verbs when both ends have a device,
    else tcp."""
    if forced is not None:
        return forced
    if whole and hostname == socket.gethostname() and path and os.path.exists(path):
        return "shm"
    if verbs and has_rdma_device():
        return "verbs"
    return "tcp"
