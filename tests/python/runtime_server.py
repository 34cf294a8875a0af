"""A test runtime endpoint speaking the contract of docs/runtime-endpoint.md: each POST starts a
memory element (a tcp_server transport of a LibdAction in this process), grants it to the calling
action, and answers with the durl and configuration; DELETE stops it."""
import http.server
import json
import re
import threading

import disagg


class RuntimeEndpoint:
    def __init__(self, token="t0ken", refuse_templates=()):
        self.token = token
        self.refuse = set(refuse_templates)
        self.host = disagg.LibdAction("test-runtime")
        self.elements = {}   # (aid, name) -> server transport name
        self.requests = []
        self.lock = threading.Lock()
        runtime = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, body=None):
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def authorized(self):
                if self.headers.get("Authorization") != f"Bearer {runtime.token}":
                    self.reply(401, {"error": "bad or missing token"})
                    return False
                return True

            def do_POST(self):
                if not self.authorized():
                    return
                m = re.fullmatch(r"/v1/actions/([^/]+)/elements", self.path)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                runtime.requests.append(("POST", self.path, body))
                if not m:
                    return self.reply(404, {"error": "no such resource"})
                if body.get("template") in runtime.refuse:
                    return self.reply(409, {"error": f"template {body['template']!r} cannot be met"})
                aid, name = m.group(1), body["name"]
                size = int(body.get("props", {}).get("size", 1 << 20))
                with runtime.lock:
                    sname = f"el{len(runtime.elements)}"
                    runtime.host.add_transport(f"{sname};tcp_server;size,{size}")
                    srv = runtime.host.get_transport(sname, "rdma_server")
                    srv.serve(block=False)
                    config = srv.grant(aid)
                    runtime.elements[(aid, name)] = sname
                self.reply(201, {"name": name, "durl": f"{name};tcp", "config": config})

            def do_DELETE(self):
                if not self.authorized():
                    return
                m = re.fullmatch(r"/v1/actions/([^/]+)/elements/([^/]+)", self.path)
                runtime.requests.append(("DELETE", self.path, None))
                with runtime.lock:
                    sname = runtime.elements.pop((m.group(1), m.group(2)), None) if m else None
                if sname is None:
                    return self.reply(404, {"error": "no such element"})
                runtime.host.get_transport(sname, "rdma_server").stop()
                self.reply(204)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.host.terminate()
