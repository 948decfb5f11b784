"""A loopback stand-in for an SGLang server that serves REAL samples: the /metrics scrapes of a
tests/data/sglang-cpu-real run, in order (one file per request, looping), and that run's
get_server_info.json / get_model_info.json. Tests switch the run being served (e.g. long-queue →
client-bound) so that a finding appears and later resolves.

Like SGLang's /metrics (prometheus_client's exposition), a scrape is gzipped when the request's
Accept-Encoding names gzip (httpx asks for it by default), so clients pay what they pay against the real
server. Only two things are changed on the way out, on purpose and by name: ``model_name`` (label and
``served_model_name``) can be replaced by a test payload such as ``<script>alert(1)</script>``, and an
``api_key`` secret can be planted in the server info to prove it is redacted everywhere.
"""

from __future__ import annotations

import gzip
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client.exposition import gzip_accepted

_MODEL_RE = re.compile(r'model_name="[^"]*"')


class SampleServer:
    def __init__(self, data_root: Path, run: str, model_name: str | None = None, api_key: str | None = None) -> None:
        self.root = Path(data_root) / "sglang-cpu-real"
        self.model_name = model_name
        self.api_key = api_key
        self.lock = threading.Lock()
        self.requests = 0
        self.set_run(run)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like SGLang's uvicorn

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                owner.requests += 1
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, ctype = owner.next_scrape().encode(), "text/plain; version=0.0.4; charset=utf-8"
                elif path == "/get_server_info":
                    body, ctype = json.dumps(owner.server_info()).encode(), "application/json"
                elif path == "/get_model_info":
                    body, ctype = (owner.run_dir / "get_model_info.json").read_bytes(), "application/json"
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                if path == "/metrics" and gzip_accepted(self.headers.get("Accept-Encoding", "")):
                    body = gzip.compress(body)  # what prometheus_client's exposition does
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def set_run(self, run: str, skip_idle: bool = True) -> None:
        """Serve another run from its first busy scrape (the idle pre-load scrape is skipped)."""
        run_dir = self.root / run
        files = sorted((run_dir / "metrics").glob("*.prom"))
        if not files:
            raise FileNotFoundError(f"no scrapes under {run_dir}/metrics")
        with self.lock:
            self.run = run
            self.run_dir = run_dir
            self.files = files[1:-2] if skip_idle and len(files) > 4 else files  # drop idle start and drain tail
            self.pos = 0

    def next_scrape(self) -> str:
        with self.lock:
            f = self.files[self.pos % len(self.files)]
            self.pos += 1
        text = f.read_text()
        if self.model_name is not None:
            text = _MODEL_RE.sub(lambda m: 'model_name="' + self.model_name.replace("\\", "\\\\").replace('"', '\\"') + '"', text)  # type: ignore[union-attr]
        return text

    def server_info(self) -> dict[str, Any]:
        info = json.loads((self.run_dir / "get_server_info.json").read_text())
        if self.model_name is not None:
            info["served_model_name"] = self.model_name
        if self.api_key is not None:
            info["api_key"] = self.api_key
        return info

    def __enter__(self) -> SampleServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> SampleServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
