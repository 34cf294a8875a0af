"""scad proxy: the HTTP side of an OpenWhisk action container, so that a Scad action runs unchanged
on a real OpenWhisk (as the server in the action's container) and OpenWhisk's invoker can drive it.

    POST /init  {"value": {"code": "...", "binary": false, "main": "main", "env": {...}}}
    POST /run   {"value": {...args...}, "activation_id", "action_name", "namespace", "deadline", ...}

What the answers are is ow_container.py's business (docs/openwhisk.md, "The action container");
this file only speaks HTTP/1.1 with kept-alive connections, as the invoker's clients use them, and
makes sure nothing a request does escapes its thread. Request bodies (they carry api_key) are never
logged.

    python -m scad.proxy [--host 0.0.0.0] [--port 8080] [--action-dir /action] [--quiet]
"""
import argparse
import json
import os
import socket
import sys
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from scad.ow_container import DEFAULT_MAX_RESULT, SENTINEL, ActionContainer  # noqa: F401 - SENTINEL for callers

# The controller accepts code up to 48 MB, which base64 makes 64 MB: room for that, not more.
MAX_BODY = 80 << 20


def _error(message):
    return json.dumps({"error": message}).encode()


def make_handler(container):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # kept-alive connections: a warm run costs no TCP handshake

        def setup(self):
            super().setup()
            # The answer goes out in one write; without this a kept-alive client could still wait
            # out its delayed ACK on a split one.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *args):
            pass  # the container's logs are the action's: the invoker puts them in the activation

        def do_POST(self):
            try:
                status, data = self._answer()
            except Exception as e:  # noqa: BLE001 - a bug here answers 500 and the proxy keeps serving
                traceback.print_exc(file=sys.stderr)
                status, data = 500, _error(f"internal error in the action proxy: {type(e).__name__}")
            self._reply(status, data)

        def do_GET(self):
            self._drain()
            self._reply(404, _error("the action proxy answers POST /init and POST /run"))

        def _answer(self):
            if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
                self.close_connection = True
                return 411, _error("a body with Content-Length is required")
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY:
                self.close_connection = True  # the body is not read: the connection cannot go on
                return 413, _error(f"the body must be 0 to {MAX_BODY} bytes")
            raw = self.rfile.read(length) if length else b""
            if self.path not in ("/init", "/run"):
                return 404, _error(f"no such endpoint {self.path}: the action proxy answers /init and /run")
            try:
                body = json.loads(raw) if raw.strip() else {}
            except (ValueError, UnicodeDecodeError) as e:
                return 400, _error(f"Error unmarshaling request: {e}")
            if self.path == "/init":
                return container.init(body)
            return container.run(body)

        def _drain(self):
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = 0
            if 0 < length <= MAX_BODY:
                self.rfile.read(length)
            elif length:
                self.close_connection = True

        def _reply(self, status, data):
            head = (f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n")
            if self.close_connection:
                head += "Connection: close\r\n"
            try:
                self.wfile.write(head.encode("latin-1") + b"\r\n" + data)
                self.wfile.flush()
            except OSError:  # the invoker gave up (its timeout): nothing to answer to
                self.close_connection = True

    return Handler


class ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # A client that hangs up mid-request is routine; one line, not a traceback per connection.
        exc = sys.exc_info()[1]
        print(f"scad proxy: connection dropped: {type(exc).__name__}: {exc}", file=sys.stderr)


def serve(host="127.0.0.1", port=8080, ready=None, action_dir=None, max_result=DEFAULT_MAX_RESULT):
    server = ProxyServer((host, port), make_handler(ActionContainer(action_dir, max_result)))
    if ready:
        ready(server.server_address)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def add_arguments(p):
    p.add_argument("--host", default=os.environ.get("SCAD_PROXY_HOST", "127.0.0.1"),
                   help="0.0.0.0 inside an OpenWhisk action container")
    p.add_argument("--port", type=int, default=int(os.environ.get("SCAD_PROXY_PORT", "8080")))
    p.add_argument("--action-dir", default=os.environ.get("SCAD_PROXY_ACTION_DIR"),
                   help="where /init puts the code (the image: /action); default a new temporary folder")
    p.add_argument("--max-result", type=int, default=int(os.environ.get("SCAD_PROXY_MAX_RESULT", DEFAULT_MAX_RESULT)),
                   help="bytes; the invoker's whisk.activation.payload.max (0: no limit in the proxy)")
    p.add_argument("--quiet", action="store_true",
                   help="no ready line on stdout (in a container stdout is the first activation's log)")


def run(args):
    def ready(addr):
        if not args.quiet:
            print(f"scad proxy: /init and /run on {addr[0]}:{addr[1]}", flush=True)
    try:
        serve(args.host, args.port, ready, args.action_dir, args.max_result)
    except KeyboardInterrupt:
        pass
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m scad.proxy", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
