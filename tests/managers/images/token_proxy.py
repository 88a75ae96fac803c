"""A bearer-token front for a test registry: a token endpoint that takes basic credentials,
and a proxy that answers 401 + ``WWW-Authenticate: Bearer`` unless the token comes along,
forwarding authorised requests to the real docker-registry behind it."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

TOKEN = "tok-7f3a"


class TokenProxy:
    def __init__(self, upstream: str, user: str, password: str) -> None:
        self.token_requests = 0
        proxy = self
        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.startswith("/token"):
                    proxy.token_requests += 1
                    if self.headers.get("Authorization") != expected:
                        return self._reply(401, b'{"error":"bad credentials"}')
                    return self._reply(200, json.dumps({"token": TOKEN}).encode())
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", f'Bearer realm="http://{proxy.host}/token",service="test"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                headers = {"Accept": self.headers.get("Accept", "*/*")}
                with httpx.Client(trust_env=False) as c:
                    r = c.get(f"http://{upstream}{self.path}", headers=headers)
                self.send_response(r.status_code)
                for key in ("Content-Type", "Docker-Content-Digest"):
                    if key in r.headers:
                        self.send_header(key, r.headers[key])
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)
                return None

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
