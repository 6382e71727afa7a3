"""A local HTTP server that answers the Hugging Face Hub API calls `snapshot_download` makes, for one tiny repo.

Endpoints: `GET /api/models/{repo}/revision/{rev}` (repo info: sha + siblings), `GET /api/models/{repo}/tree/{sha}`
(file listing with sizes), `HEAD|GET /{repo}/resolve/{rev}/{file}` (ETag, X-Repo-Commit, content). Unknown repos
get 404 with `X-Error-Code: RepoNotFound`, as the hub answers. Every request is logged in `requests`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]], sizes: dict[str, int] | None = None):
        """repos: repo_id -> {filename: content}; sizes: filename -> size to *announce* (a server may lie)."""
        self.repos = repos
        self.sizes = sizes or {}
        self.requests: list[tuple[str, str]] = []
        self.sha = {r: hashlib.sha1(json.dumps(sorted(f)).encode() + r.encode()).hexdigest() for r, f in repos.items()}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._serve(head=True)

            def do_GET(self):
                self._serve(head=False)

            def _send(self, code, body=b"", headers=None, head=False):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, obj, head=False):
                self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"}, head)

            def _not_found(self, head):
                self._send(404, b'{"error":"Repository not found"}',
                           {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found",
                            "Content-Type": "application/json"}, head)

            def _serve(self, head: bool):
                path = unquote(urlsplit(self.path).path)
                hub.requests.append((self.command, path))
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 5:
                    repo, kind = "/".join(parts[2:4]), parts[4]
                    if repo not in hub.repos:
                        return self._not_found(head)
                    files = hub.repos[repo]
                    if kind == "revision":
                        return self._json({"id": repo, "modelId": repo, "sha": hub.sha[repo], "private": False,
                                           "siblings": [{"rfilename": f} for f in files]}, head)
                    if kind == "tree":
                        return self._json([{"type": "file", "path": f, "oid": hashlib.sha1(c).hexdigest(),
                                            "size": hub.sizes.get(f, len(c))} for f, c in files.items()], head)
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo, filename = "/".join(parts[:2]), "/".join(parts[4:])
                    if repo not in hub.repos:
                        return self._not_found(head)
                    content = hub.repos[repo].get(filename)
                    if content is None:
                        return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                    headers = {"ETag": f'"{hashlib.sha1(content).hexdigest()}"', "X-Repo-Commit": hub.sha[repo],
                               "Content-Type": "application/octet-stream"}
                    if filename in hub.sizes:  # announced as an LFS file of that size
                        headers.update({"X-Linked-Size": str(hub.sizes[filename]),
                                        "X-Linked-Etag": headers["ETag"]})
                    return self._send(200, content, headers, head)
                return self._send(404, b"", {}, head)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def downloads(self) -> list[str]:
        """Paths whose content was sent (GET on /resolve/)."""
        return [p for m, p in self.requests if m == "GET" and "/resolve/" in p]
