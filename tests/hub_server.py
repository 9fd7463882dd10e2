"""A local HTTP server that answers the few Hugging Face Hub endpoints `snapshot_download` calls,
so that a download is tested without the Internet (`HF_ENDPOINT` / `HubCache.endpoint`).

Endpoints: the revision's model info (`/api/models/ORG/NAME/revision/REV`: the commit), the
recursive file tree at a commit (`/api/models/ORG/NAME/tree/COMMIT`), and each file
(`HEAD`/`GET /ORG/NAME/resolve/REV/PATH`, with the commit and ETag headers the client reads).
Errors carry the `X-Error-Code` the client maps to its exceptions (RepoNotFound, GatedRepo,
RevisionNotFound). Every request is logged in `requests` for the tests to read.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag → commit
    gated: bool = False

    def commit_of(self, revision: str) -> str | None:
        if revision == self.commit:
            return self.commit
        return self.refs.get(revision)


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo]
    requests: list[str] = field(default_factory=list)


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

        def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _error(self, status: int, code: str, head: bool) -> None:
            self._send(status, json.dumps({"error": code}).encode(), {"X-Error-Code": code}, head)

        def _repo(self, name: str, head: bool) -> FakeRepo | None:
            repo = hub.repos.get(name)
            if repo is None:
                self._error(404, "RepoNotFound", head)
                return None
            if repo.gated:
                self._error(403, "GatedRepo", head)
                return None
            return repo

        def _answer(self, head: bool) -> None:
            path = urlsplit(self.path).path
            hub.requests.append(f"{self.command} {path}")
            parts = [unquote(p) for p in path.strip("/").split("/")]
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                repo_id = f"{parts[2]}/{parts[3]}"
                repo = self._repo(repo_id, head)
                if repo is None:
                    return
                commit = repo.commit_of("/".join(parts[5:]) if parts[4] == "revision" else parts[5])
                if commit is None:
                    self._error(404, "RevisionNotFound", head)
                    return
                if parts[4] == "revision":
                    info = {"id": repo_id, "sha": commit, "siblings": [{"rfilename": f} for f in repo.files]}
                    self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
                    return
                tree = [
                    {"type": "file", "path": name, "size": len(data), "oid": _blob_id(data)}
                    for name, data in sorted(repo.files.items())
                ]
                self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, head)
                return
            if len(parts) >= 5 and parts[2] == "resolve":
                repo = self._repo(f"{parts[0]}/{parts[1]}", head)
                if repo is None:
                    return
                commit = repo.commit_of(parts[3])
                if commit is None:
                    self._error(404, "RevisionNotFound", head)
                    return
                data = repo.files.get("/".join(parts[4:]))
                if data is None:
                    self._error(404, "EntryNotFound", head)
                    return
                headers = {"X-Repo-Commit": commit, "ETag": f'"{_blob_id(data)}"'}
                self._send(200, data, headers, head)
                return
            self._error(404, "RepoNotFound", head)

    return Handler


@contextmanager
def serving(hub: FakeHub) -> Iterator[str]:
    """The hub served on a loopback port; yields its endpoint URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
