"""scad — the command line of the Scad platform, in the spirit of OpenWhisk's wsk.

    scad up                                   run the single-machine platform (scheduler + agent)
    scad app deploy PATH                      deploy the application in PATH (its scad.yaml and files)
    scad app invoke NAME [-p KEY VALUE]...    run it; --result prints only the result JSON
    scad app list | get NAME | delete NAME
    scad activation list | get ID | logs ID | result ID
    scad element list
    scad host list
    scad host key ID [--keys FILE]
    scad proxy [--port 8080]                  an OpenWhisk action container's server (/init, /run)

Credentials and the API host come from $SCAD_HOME/wskprops (written by `scad up`), or --apihost
and --auth. Every command takes --json for output meant for scripts.
"""
import argparse
import base64
import json
import os
import pathlib
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

MANIFESTS = ("scad.yaml", "scad.yml", "scad.json")
MAX_APP_BYTES = 48 << 20


class CliError(Exception):
    """An error the user can act on: printed as one line (plus details), exit status 1."""

    def __init__(self, message, details=()):
        super().__init__(message)
        self.details = list(details)


def scad_home():
    return pathlib.Path(os.environ.get("SCAD_HOME", pathlib.Path.home() / ".scad"))


def read_props(path):
    props = {}
    try:
        for line in path.read_text().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                props[k.strip()] = v.strip()
    except FileNotFoundError:
        pass
    return props


class Client:
    def __init__(self, apihost, auth, namespace="_"):
        self.apihost = apihost.rstrip("/")
        self.auth = auth
        self.ns = namespace

    @classmethod
    def from_args(cls, args):
        props = read_props(scad_home() / "wskprops")
        apihost = args.apihost or os.environ.get("SCAD_APIHOST") or props.get("APIHOST")
        auth = args.auth or os.environ.get("SCAD_AUTH") or props.get("AUTH")
        if not apihost or not auth:
            raise CliError(f"no platform configured: start one with `scad up` (it writes {scad_home()}/wskprops), "
                           "or pass --apihost and --auth")
        if not apihost.startswith("http"):
            apihost = "https://" + apihost
        return cls(apihost, auth)

    def request(self, method, path, body=None, params=None, timeout=120):
        url = self.apihost + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("Authorization", "Basic " + base64.b64encode(self.auth.encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                raise CliError(f"{method} {path}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise CliError(f"cannot reach the platform at {self.apihost} ({getattr(e, 'reason', e)}): "
                           "is it running? Start it with `scad up`") from None

    def ok(self, method, path, body=None, params=None, expect=(200,)):
        status, data = self.request(method, path, body, params)
        if status not in expect:
            msg = (data or {}).get("error", f"HTTP {status}") if isinstance(data, dict) else f"HTTP {status}"
            hint = {401: " (check AUTH in $SCAD_HOME/wskprops)", 404: ""}.get(status, "")
            raise CliError(msg + hint, (data or {}).get("problems", []) if isinstance(data, dict) else [])
        return status, data

    def ns_path(self, *parts):
        return "/api/v1/namespaces/" + "/".join(urllib.parse.quote(p, safe="") for p in (self.ns, *parts))


def out(args, human, data):
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(human)


def parse_params(pairs):
    params = {}
    for key, value in pairs or []:
        try:
            params[key] = json.loads(value)  # as wsk does: JSON if it parses, else a string
        except ValueError:
            params[key] = value
    return params


def load_app(path):
    folder = pathlib.Path(path)
    if not folder.is_dir():
        raise CliError(f"{path} is not a folder: an application is a folder with a scad.yaml beside its code")
    manifest = next((folder / m for m in MANIFESTS if (folder / m).is_file()), None)
    if manifest is None:
        raise CliError(f"no scad.yaml in {path}: write one (see docs/manifest.md)")
    text = manifest.read_text()
    if manifest.suffix == ".json":
        doc = json.loads(text)
    else:
        import yaml
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise CliError(f"{manifest} is not valid YAML: {e}") from None
    name = doc.get("name") if isinstance(doc, dict) else None
    if not isinstance(name, str):
        raise CliError(f"{manifest} has no 'name'")
    files, total = {}, 0
    for f in sorted(folder.rglob("*")):
        rel = f.relative_to(folder)
        if not f.is_file() or f == manifest or any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        try:
            files[str(rel)] = f.read_text()
        except UnicodeDecodeError:
            raise CliError(f"{rel} is not text: applications carry source files (put data in memory elements)") from None
        total += f.stat().st_size
        if total > MAX_APP_BYTES:
            raise CliError(f"the application's files exceed {MAX_APP_BYTES >> 20} MiB")
    return name, text, files, total


def cmd_up(args):
    # SCAD_SERVER if set; the one a wheel carries (pip install .: scad/bin); a source tree's build.
    root = pathlib.Path(__file__).resolve().parents[3]
    candidates = [os.environ.get("SCAD_SERVER"), str(pathlib.Path(__file__).resolve().parent / "bin" / "scad-server"),
                  str(root / "build" / "scheduler" / "scad-server")]
    server = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if server is None:
        raise CliError("scad-server not found: pip install . carries it in scad/bin; in a source tree, build it "
                       "(scripts/setup); or set SCAD_SERVER")
    import disagg
    import scad
    pythonpath = os.pathsep.join(dict.fromkeys([os.path.dirname(disagg.__file__),
                                                 os.path.dirname(os.path.dirname(scad.__file__))]))
    argv = [server, "--home", str(args.home or scad_home()), "--host", args.host, "--port", str(args.port),
            "--python", sys.executable, "--pythonpath", pythonpath]
    if args.pool:
        argv += ["--pool", args.pool]
    if args.cpus:
        argv += ["--cpus", str(args.cpus)]
    if args.verbs:
        argv += ["--verbs", args.verbs]
    sys.stdout.flush()
    os.execv(server, argv)  # one process: scheduler and agent


def cmd_app(args):
    c = Client.from_args(args)
    if args.action == "deploy":
        name, text, files, total = load_app(args.path)
        if not args.json:
            print(f"deploying {name}: {len(files)} file(s), {total / 1024:.1f} KiB ...", file=sys.stderr, flush=True)
        _, data = c.ok("PUT", c.ns_path("apps", name), {"manifest": text, "files": files})
        out(args, f"ok: deployed {name} (version {data['version']}, elements: "
                  f"{', '.join(sorted(data['manifest']['elements']))})", data)
    elif args.action == "invoke":
        params = {"blocking": "true"}
        if args.result:
            params["result"] = "true"
        t0 = time.monotonic()
        if not args.json and not args.result:
            print(f"invoking {args.name} ...", file=sys.stderr, flush=True)
        status, data = c.request("POST", c.ns_path("apps", args.name), parse_params(args.param), params)
        if status == 202:
            raise CliError(f"{args.name} is still running: see `scad activation get {data['activationId']}`")
        if status in (401, 403, 404, 400):
            raise CliError(data.get("error", f"HTTP {status}"))
        if args.result:
            print(json.dumps(data, indent=2))
            return 0 if status == 200 else 1
        resp = data["response"]
        human = (f"{'ok' if resp['success'] else 'error'}: {args.name} activation {data['activationId']} "
                 f"({resp['status']} in {data['duration']} ms, {time.monotonic() - t0:.2f} s round trip)\n"
                 + json.dumps(resp.get("result"), indent=2))
        out(args, human, data)
        return 0 if resp["success"] else 1
    elif args.action == "list":
        _, data = c.ok("GET", c.ns_path("apps"))
        out(args, "\n".join(f"{a['name']:30} v{a['version']:<4} {len(a['manifest']['elements'])} elements"
                            for a in data) or "no applications deployed", data)
    elif args.action == "get":
        _, data = c.ok("GET", c.ns_path("apps", args.name))
        out(args, json.dumps(data, indent=2), data)
    elif args.action == "delete":
        _, data = c.ok("DELETE", c.ns_path("apps", args.name))
        out(args, f"ok: deleted {args.name}", data)
    return 0


# The top-level statusCode of listed activations (OpenWhisk's short form).
STATUSES = {0: "success", 1: "application error", 2: "action developer error", 3: "whisk internal error"}


def cmd_activation(args):
    c = Client.from_args(args)
    if args.action == "list":
        _, data = c.ok("GET", c.ns_path("activations"), params={"limit": args.limit})
        lines = [f"{a['activationId']}  {a['name']:24} {STATUSES.get(a.get('statusCode'), '?'):24} {a.get('duration', 0)} ms" for a in data]
        out(args, "\n".join(lines) or "no activations", data)
    elif args.action == "get":
        _, data = c.ok("GET", c.ns_path("activations", args.id))
        out(args, json.dumps(data, indent=2) + _transfer_table(data), data)
    elif args.action == "logs":
        _, data = c.ok("GET", c.ns_path("activations", args.id, "logs"))
        out(args, "\n".join(data["logs"]), data)
    elif args.action == "result":
        _, data = c.ok("GET", c.ns_path("activations", args.id, "result"))
        out(args, json.dumps(data, indent=2), data)
    return 0


def _transfer_table(record):
    """Where the time went: each instance's transports, what they moved and how long it took."""
    transfers = next((a.get("value") for a in record.get("annotations", []) if a.get("key") == "transfers"), None)
    if not isinstance(transfers, dict) or not transfers:
        return ""
    lines = ["", "", f"{'instance':20} {'transport':16} {'kind':5} {'reads':>7} {'read MiB':>9} {'writes':>7} "
             f"{'written MiB':>11} {'seconds':>9}"]
    for instance, entries in sorted(transfers.items()):
        for t in entries:
            lines.append(f"{instance:20} {t['transport']:16} {t['kind']:5} {t['read_ops']:>7} "
                         f"{t['read_bytes'] / 2**20:>9.2f} {t['write_ops']:>7} {t['write_bytes'] / 2**20:>11.2f} "
                         f"{t['seconds']:>9.4f}")
    return "\n".join(lines)


def cmd_element(args):
    c = Client.from_args(args)
    _, data = c.ok("GET", c.ns_path("elements"))
    out(args, "\n".join(f"{e['id']:48} {e['kind']:8} {e.get('size', 0) >> 20:>6} MiB  {e['app']} on {e['host']}"
                        for e in data) or "no elements running", data)
    return 0


def cmd_host(args):
    c = Client.from_args(args)
    _, data = c.ok("GET", "/api/v1/hosts")
    out(args, "\n".join(f"{h['id']:12} {h['state']:5} cpus {h['cpus_free']:.1f}/{h['cpus']:.1f} free  memory pool "
                        f"{h['memory_pool_used'] >> 20}/{h['memory_pool'] >> 20} MiB used"
                        f"{'  rdma' if h.get('rdma') else ''}" for h in data), data)
    return 0


def cmd_host_key(args):
    """A key of its own for host ID: its hash goes into the scheduler's --host-keys file, the key
    ("ID:SECRET") to stdout, once, for the agent's --token-file. Delete the line to revoke it."""
    import hashlib
    import re
    import secrets
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,255}", args.id) or args.id == "local":
        print(f"scad: '{args.id}' cannot be a host id ('local' is the built-in host's)", file=sys.stderr)
        return 2
    secret = secrets.token_hex(32)
    keys = os.path.expanduser(args.keys or os.path.join(os.environ.get("SCAD_HOME", "~/.scad"), "host-keys"))
    fd = os.open(keys, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{args.id} {hashlib.sha256(secret.encode()).hexdigest()}\n")
    print(f"{args.id}:{secret}")
    return 0


def cmd_proxy(args):
    from scad.proxy import run
    return run(args)


def parser():
    # The common flags work after any command, as in `scad app list --json`.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--apihost", help="API host (default: APIHOST in $SCAD_HOME/wskprops)")
    common.add_argument("--auth", help="uuid:key (default: AUTH in $SCAD_HOME/wskprops)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    p = argparse.ArgumentParser(prog="scad", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the single-machine platform", parents=[common])
    up.add_argument("--home", help="state directory (default $SCAD_HOME or ~/.scad)")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=3233, help="0 picks a free port")
    up.add_argument("--pool", help="memory pool size for memory elements, e.g. 4GiB")
    up.add_argument("--cpus", type=float, help="cpus compute elements may use")
    up.add_argument("--verbs", help="RDMA verbs on the memory pool: auto (default), off, or dev=NAME,gid_index=N")
    up.set_defaults(fn=cmd_up)

    app = sub.add_parser("app", help="applications").add_subparsers(dest="action", required=True)
    d = app.add_parser("deploy", parents=[common])
    d.add_argument("path")
    i = app.add_parser("invoke", parents=[common])
    i.add_argument("name")
    i.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"))
    i.add_argument("--result", "-r", action="store_true", help="print only the result JSON")
    app.add_parser("list", parents=[common])
    for verb in ("get", "delete"):
        app.add_parser(verb, parents=[common]).add_argument("name")
    for a in (d, i, *app.choices.values()):
        a.set_defaults(fn=cmd_app)

    act = sub.add_parser("activation", help="activation records").add_subparsers(dest="action", required=True)
    act.add_parser("list", parents=[common]).add_argument("--limit", type=int, default=30)
    for verb in ("get", "logs", "result"):
        act.add_parser(verb, parents=[common]).add_argument("id")
    for a in act.choices.values():
        a.set_defaults(fn=cmd_activation)

    el = sub.add_parser("element", help="running elements").add_subparsers(dest="action", required=True)
    el.add_parser("list", parents=[common]).set_defaults(fn=cmd_element)
    host = sub.add_parser("host", help="hosts").add_subparsers(dest="action", required=True)
    host.add_parser("list", parents=[common]).set_defaults(fn=cmd_host)
    key = host.add_parser("key", help="make a key of its own for a host (scad-server --host-keys)")
    key.add_argument("id")
    key.add_argument("--keys", help="the scheduler's host-keys file (default $SCAD_HOME/host-keys)")
    key.set_defaults(fn=cmd_host_key)
    proxy = sub.add_parser("proxy", help="serve OpenWhisk's action runtime contract (/init, /run)")
    from scad.proxy import add_arguments as proxy_arguments
    proxy_arguments(proxy)
    proxy.set_defaults(fn=cmd_proxy, json=False)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        return args.fn(args) or 0
    except CliError as e:
        print(f"scad: error: {e}", file=sys.stderr)
        for d in e.details:
            print(f"  - {d}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
