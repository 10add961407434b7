"""A small Hub-compatible HTTP server for testing the REAL huggingface_hub / transformers clients offline.

Standard library only: a ``ThreadingHTTPServer`` on 127.0.0.1 (port 0), repos stored in a temp directory
(content-addressed blobs + one snapshot per commit, so revisions resolve like git). It implements what the
clients call for:

- ``create_repo`` (``POST /api/repos/create``; 409 + ``url`` when it exists), ``delete_repo``;
- ``upload_folder`` / ``push_to_hub``: ``POST /api/models/{id}/preupload/{rev}``, git-LFS
  ``POST /{id}.git/info/lfs/objects/batch`` + ``PUT`` to the returned href, the NDJSON
  ``POST /api/models/{id}/commit/{rev}`` (header / file / lfsFile / deletedFile), ``POST /api/validate-yaml``;
- ``model_info`` / ``list_repo_files`` / ``list_repo_tree`` / ``get_paths_info``;
- ``hf_hub_download`` / ``snapshot_download`` / ``file_exists``: ``HEAD``/``GET /{id}/resolve/{rev}/{path}``
  with ``X-Repo-Commit`` and ``ETag`` (``X-Linked-Etag``/``X-Linked-Size`` for LFS files);
- 404s carrying the Hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``), which
  the client turns into ``RepositoryNotFoundError`` / ``RevisionNotFoundError`` / ``RemoteEntryNotFoundError``.

Use :func:`local_hub` (module-scoped server) and :func:`hub_client` (points this process's clients at it)
as pytest fixtures by importing them into a test module, or :func:`client_env` for a subprocess.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self
from urllib.parse import parse_qs, unquote, urlparse

import pytest

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz", ".onnx")
LFS_MIN_SIZE = 1_000_000
DUMMY_TOKEN = "hf_local_test_token"
USER = "user"


def _git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubState:
    """Repos on disk: ``root/blobs/<sha256>`` holds contents; each commit maps path -> sha256."""

    def __init__(self, root: Path):
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        self.repos: dict[str, dict] = {}  # repo_id -> {"commits": [(sha, {path: sha256}, message)], "private"}
        self.lfs: set[str] = set()  # sha256 of LFS objects uploaded through the batch API
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str]] = []  # (method, path) log, for tests

    # --- storage -------------------------------------------------------------------------------------
    def put_blob(self, data: bytes) -> str:
        oid = hashlib.sha256(data).hexdigest()
        path = self.root / "blobs" / oid
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return oid

    def blob(self, oid: str) -> bytes:
        return (self.root / "blobs" / oid).read_bytes()

    def has_blob(self, oid: str) -> bool:
        return (self.root / "blobs" / oid).exists()

    # --- repos ---------------------------------------------------------------------------------------
    def resolve(self, repo_id: str, rev: str):
        """(commit sha, {path: sha256}) for a branch name or commit sha; None when unknown."""
        commits = self.repos[repo_id]["commits"]
        if rev in ("main", "HEAD", "refs/heads/main"):
            sha, files, _ = commits[-1]
            return sha, files
        for sha, files, _ in commits:
            if sha == rev:
                return sha, files
        return None

    def files(self, repo_id: str, rev: str = "main") -> dict[str, bytes]:
        """All files of a repo at a revision, as bytes (test helper)."""
        with self.lock:
            _, files = self.resolve(repo_id, rev)
            return {p: self.blob(oid) for p, oid in files.items()}

    def commit_messages(self, repo_id: str) -> list[str]:
        return [m for _, _, m in self.repos[repo_id]["commits"]]


class Handler(BaseHTTPRequestHandler):
    state: HubState
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    # --- helpers -------------------------------------------------------------------------------------
    def _send(self, code: int, body: bytes = b"", headers: dict | None = None, content_type="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj, code=200, headers=None):
        self._send(code, json.dumps(obj).encode(), headers)

    def _error(self, code: int, error_code: str, message: str):
        self._json({"error": message}, code, {"X-Error-Code": error_code, "X-Error-Message": message})

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _host(self) -> str:
        return f"http://{self.headers['Host']}"

    def _log(self):
        with self.state.lock:
            self.state.requests.append((self.command, urlparse(self.path).path))

    @staticmethod
    def _split_api(path: str, prefix: str = "/api/models/"):
        parts = path[len(prefix):].split("/")
        return "/".join(parts[:2]), parts[2:]

    def _find_repo(self, repo_id: str) -> bool:
        if repo_id not in self.state.repos:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}. {repo_id} does not exist.")
            return False
        return True

    # --- POST ----------------------------------------------------------------------------------------
    def do_POST(self):
        self._log()
        path = unquote(urlparse(self.path).path)
        st = self.state
        if path == "/api/repos/create":
            req = json.loads(self._body() or b"{}")
            name, org = req["name"], req.get("organization") or USER
            repo_id = name if "/" in name else f"{org}/{name}"
            url = f"{self._host()}/{repo_id}"
            with st.lock:
                if repo_id in st.repos:  # the client reads "url" even from the 409 (exist_ok=True)
                    return self._json({"error": "You already created this model repo", "url": url}, 409,
                                      {"X-Error-Code": "RepoExists"})
                sha = hashlib.sha1(f"init {repo_id} {time.time_ns()}".encode()).hexdigest()
                st.repos[repo_id] = {"commits": [(sha, {}, "initial commit")], "private": bool(req.get("private"))}
            return self._json({"url": url, "name": repo_id, "id": repo_id})
        if path == "/api/validate-yaml":
            self._body()
            return self._json({"errors": [], "warnings": []})
        if path.endswith(".git/info/lfs/objects/batch"):
            req = json.loads(self._body())
            objs = []
            for o in req["objects"]:
                if st.has_blob(o["oid"]) and o["oid"] in st.lfs:
                    objs.append({"oid": o["oid"], "size": o["size"]})  # already there: no action
                else:
                    href = f"{self._host()}/lfs-upload/{o['oid']}"
                    objs.append({"oid": o["oid"], "size": o["size"], "authenticated": True,
                                 "actions": {"upload": {"href": href, "expires_in": 3600}}})
            return self._json({"transfer": "basic", "objects": objs, "hash_algo": "sha256"})
        if path.startswith("/api/models/"):
            repo_id, rest = self._split_api(path)
            action = rest[0] if rest else ""
            body = self._body()
            if not self._find_repo(repo_id):
                return None
            if action == "preupload":
                req = json.loads(body)
                files = [{"path": f["path"], "shouldIgnore": False,
                          "uploadMode": "lfs" if f["path"].endswith(LFS_SUFFIXES) or f.get("size", 0) >= LFS_MIN_SIZE
                          else "regular"} for f in req["files"]]
                return self._json({"files": files, "commitOid": st.resolve(repo_id, "main")[0]})
            if action == "commit":
                return self._commit(repo_id, body)
            if action == "paths-info":
                rev = "/".join(rest[1:]) or "main"
                found = st.resolve(repo_id, rev)
                if found is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                ctype = self.headers.get("Content-Type", "")
                req = json.loads(body) if "json" in ctype else {k: v for k, v in parse_qs(body.decode()).items()}
                paths = req.get("paths", [])
                paths = [paths] if isinstance(paths, str) else paths
                _, files = found
                return self._json([self._entry(p, files[p]) for p in paths if p in files])
        self._body()
        return self._error(404, "EntryNotFound", f"no route {path}")

    def _commit(self, repo_id: str, body: bytes):
        st = self.state
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        with st.lock:
            _, files = st.resolve(repo_id, "main")
            files = dict(files)
            message = ""
            for item in lines:
                key, val = item["key"], item["value"]
                if key == "header":
                    message = val.get("summary", "")
                elif key == "file":
                    files[val["path"]] = st.put_blob(base64.b64decode(val["content"]))
                elif key == "lfsFile":
                    if not st.has_blob(val["oid"]):
                        return self._error(400, "BadRequest", f"LFS object {val['oid']} was not uploaded")
                    files[val["path"]] = val["oid"]
                elif key in ("deletedFile", "deletedFolder"):
                    prefix = val["path"].rstrip("/") + "/"
                    for p in [p for p in files if p == val["path"] or (key == "deletedFolder" and p.startswith(prefix))]:
                        files.pop(p)
            n = len(st.repos[repo_id]["commits"])
            sha = hashlib.sha1(f"{repo_id} {message} {time.time_ns()} {n}".encode()).hexdigest()
            st.repos[repo_id]["commits"].append((sha, files, message))
        return self._json({"commitUrl": f"{self._host()}/{repo_id}/commit/{sha}", "commitOid": sha,
                           "success": True, "pullRequestUrl": None})

    # --- PUT / DELETE --------------------------------------------------------------------------------
    def do_PUT(self):
        self._log()
        path = urlparse(self.path).path
        data = self._body()
        if path.startswith("/lfs-upload/"):
            oid = path.rsplit("/", 1)[1]
            if hashlib.sha256(data).hexdigest() != oid:
                return self._error(400, "BadRequest", "LFS content does not match its oid")
            with self.state.lock:
                self.state.put_blob(data)
                self.state.lfs.add(oid)
            return self._send(200, b"")
        return self._error(404, "EntryNotFound", path)

    def do_DELETE(self):
        self._log()
        path = urlparse(self.path).path
        body = self._body()
        if path == "/api/repos/delete":
            req = json.loads(body or b"{}")
            repo_id = req["name"] if "/" in req["name"] else f"{req.get('organization') or USER}/{req['name']}"
            with self.state.lock:
                if self.state.repos.pop(repo_id, None) is None:
                    return self._error(404, "RepoNotFound", f"{repo_id} does not exist")
            return self._send(200, b"")
        return self._error(404, "EntryNotFound", path)

    # --- GET / HEAD ----------------------------------------------------------------------------------
    def do_HEAD(self):
        return self.do_GET()

    def _entry(self, path: str, oid: str) -> dict:
        data = self.state.blob(oid)
        entry = {"type": "file", "path": path, "size": len(data), "oid": _git_blob_sha(data)}
        if oid in self.state.lfs:
            entry["lfs"] = {"oid": oid, "size": len(data), "pointerSize": 134}
        return entry

    def do_GET(self):
        self._log()
        url = urlparse(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        st = self.state
        if path == "/api/whoami-v2":
            return self._json({"type": "user", "name": USER, "fullname": "Local Test User", "orgs": [],
                               "auth": {"type": "access_token", "accessToken": {"role": "write"}}})
        if path.startswith("/api/models/"):
            repo_id, rest = self._split_api(path)
            if not self._find_repo(repo_id):
                return None
            rev, sub = "main", ""
            if rest and rest[0] in ("revision", "tree"):
                rev = rest[1] if len(rest) > 1 else "main"
                sub = "/".join(rest[2:]) if rest[0] == "tree" else ""
            with st.lock:
                found = st.resolve(repo_id, rev)
                if found is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                sha, files = found
                if rest and rest[0] == "tree":
                    prefix = sub.rstrip("/") + "/" if sub else ""
                    recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                    entries, folders = [], set()
                    for p, oid in sorted(files.items()):
                        if not p.startswith(prefix):
                            continue
                        rel = p[len(prefix):]
                        if "/" in rel and not recursive:
                            folders.add(prefix + rel.split("/", 1)[0])
                            continue
                        entries.append(self._entry(p, oid))
                    entries = [{"type": "directory", "path": f, "oid": "0" * 40, "size": 0} for f in sorted(folders)]\
                        + entries
                    if sub and not entries:
                        return self._error(404, "EntryNotFound", f"{sub} does not exist on {rev}")
                    return self._json(entries)
                return self._json({
                    "id": repo_id, "modelId": repo_id, "sha": sha, "private": st.repos[repo_id]["private"],
                    "siblings": [{"rfilename": p} for p in sorted(files)], "tags": [], "downloads": 0,
                    "likes": 0, "disabled": False, "gated": False,
                    "lastModified": "2026-11-22T00:00:00.000Z", "createdAt": "2026-11-22T00:00:00.000Z",
                })
        # /{org}/{name}/resolve/{rev}/{path}
        parts = path.lstrip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id, rev, fpath = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if not self._find_repo(repo_id):
                return None
            with st.lock:
                found = st.resolve(repo_id, rev)
                if found is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                sha, files = found
                if fpath not in files:
                    return self._error(404, "EntryNotFound", f"Entry not found: {fpath} does not exist in "
                                                             f"{repo_id}@{rev}")
                oid = files[fpath]
                data = st.blob(oid)
            is_lfs = oid in st.lfs
            etag = oid if is_lfs else _git_blob_sha(data)
            headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if is_lfs:
                headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
            return self._send(200, data, headers, content_type="application/octet-stream")
        return self._error(404, "EntryNotFound", f"no route {path}")


class LocalHub:
    """Context manager: ``with LocalHub() as hub: hub.endpoint``; repos live in a temp dir removed on exit."""

    def __init__(self, root: str | Path | None = None):
        self._tmp = None if root is not None else tempfile.mkdtemp(prefix="local-hub-")
        self.state = HubState(Path(root if root is not None else self._tmp))
        handler = type("BoundHandler", (Handler,), {"state": self.state})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def files(self, repo_id: str, rev: str = "main") -> dict[str, bytes]:
        return self.state.files(repo_id, rev)


def client_env(hub: LocalHub, cache_dir: str | Path) -> dict[str, str]:
    """Environment variables that point a FRESH process's clients at ``hub`` (read at import time)."""
    return {"HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": DUMMY_TOKEN,
            "HF_HUB_CACHE": str(cache_dir), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0",
            "TRANSFORMERS_OFFLINE": "0", "HF_HUB_DISABLE_IMPLICIT_TOKEN": "0"}


def point_clients_at(hub: LocalHub, cache_dir: str | Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point THIS process's huggingface_hub / transformers clients at ``hub`` (undone by ``monkeypatch``).

    huggingface_hub reads HF_ENDPOINT etc. once at import into ``constants`` and the module-level ``HfApi``
    instance (behind ``create_repo``, ``upload_folder``, ...), so both are patched, plus the env for children.
    """
    from huggingface_hub import constants, hf_api

    for key, value in client_env(hub, cache_dir).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache_dir))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(hf_api.api, "endpoint", hub.endpoint)


@pytest.fixture(scope="module")
def local_hub() -> Iterator[LocalHub]:
    """A fresh local Hub server for the test module."""
    with LocalHub() as hub:
        yield hub


@contextlib.contextmanager
def clients_pointed_at(hub: LocalHub, cache_dir: str | Path) -> Iterator[LocalHub]:
    """Context manager form of :func:`point_clients_at` (for module-scoped fixtures)."""
    with pytest.MonkeyPatch.context() as mp:
        point_clients_at(hub, cache_dir, mp)
        yield hub


@pytest.fixture
def hub_client(local_hub, tmp_path, monkeypatch) -> LocalHub:
    """``local_hub`` with this process's clients pointed at it (endpoint, no Xet, dummy token, private cache)."""
    point_clients_at(local_hub, tmp_path / "hf-cache", monkeypatch)
    return local_hub
