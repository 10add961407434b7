"""A small Hub-compatible HTTP server on 127.0.0.1 for testing the REAL huggingface_hub/transformers clients.

Implements what the clients call for create_repo, upload_folder/push_to_hub (regular files and basic LFS),
model info, tree listing, hf_hub_download/snapshot_download and 404s with the Hub's X-Error-Code headers.
Each commit snapshots the whole file set under a new sha, so revisions resolve like git.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class HubState:
    def __init__(self):
        self.repos: dict[str, dict] = {}  # repo_id -> {"commits": [(sha, {path: bytes})], "private": bool}
        self.lfs: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def head(self, repo_id: str):
        return self.repos[repo_id]["commits"][-1]

    def resolve(self, repo_id: str, rev: str):
        commits = self.repos[repo_id]["commits"]
        if rev in ("main", "HEAD"):
            return commits[-1]
        for sha, files in commits:
            if sha == rev:
                return sha, files
        return None


def _sha(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


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

    def _repo_from(self, parts: list[str]) -> str:
        return "/".join(parts[:2])

    # --- routes --------------------------------------------------------------------------------------
    def do_POST(self):
        path = urlparse(self.path).path
        st = self.state
        if path == "/api/repos/create":
            req = json.loads(self._body() or b"{}")
            repo_id = f"{req.get('organization') or 'user'}/{req['name']}" if "/" not in req["name"] else req["name"]
            with st.lock:
                if repo_id in st.repos:  # the client reads "url" even from the 409 (exist_ok=True)
                    url = f"http://{self.headers['Host']}/{repo_id}"
                    return self._json({"error": "You already created this model repo", "url": url}, 409,
                                      {"X-Error-Code": "RepoExists"})
                sha = _sha(f"init {repo_id} {time.time()}".encode())
                st.repos[repo_id] = {"commits": [(sha, {})], "private": bool(req.get("private"))}
            return self._json({"url": f"http://{self.headers['Host']}/{repo_id}", "name": repo_id})
        if path == "/api/validate-yaml":
            self._body()
            return self._json({"errors": [], "warnings": []})
        if path.endswith(".git/info/lfs/objects/batch"):
            repo_id = path[1:].removesuffix(".git/info/lfs/objects/batch")
            req = json.loads(self._body())
            objs = [{"oid": o["oid"], "size": o["size"], "authenticated": True,
                     "actions": {"upload": {"href": f"http://{self.headers['Host']}/lfs-upload/{o['oid']}"}}}
                    for o in req["objects"] if o["oid"] not in st.lfs]
            objs += [{"oid": o["oid"], "size": o["size"]} for o in req["objects"] if o["oid"] in st.lfs]
            return self._json({"transfer": "basic", "objects": objs})
        if path.startswith("/api/models/"):
            parts = path[len("/api/models/"):].split("/")
            repo_id, action = self._repo_from(parts), parts[2] if len(parts) > 2 else ""
            if repo_id not in st.repos:
                self._body()
                return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            if action == "preupload":
                req = json.loads(self._body())
                files = [{"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(".safetensors") else "regular",
                          "shouldIgnore": False} for f in req["files"]]
                return self._json({"files": files})
            if action == "commit":
                return self._commit(repo_id)
        self._body()
        return self._error(404, "EntryNotFound", f"no route {path}")

    def _commit(self, repo_id: str):
        st = self.state
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        with st.lock:
            _, files = st.head(repo_id)
            files = dict(files)
            message = ""
            for item in lines:
                key, val = item["key"], item["value"]
                if key == "header":
                    message = val.get("summary", "")
                elif key == "file":
                    files[val["path"]] = base64.b64decode(val["content"])
                elif key == "lfsFile":
                    if val["oid"] not in st.lfs:
                        return self._error(400, "BadRequest", f"LFS object {val['oid']} was not uploaded")
                    files[val["path"]] = st.lfs[val["oid"]]
                elif key == "deletedFile":
                    files.pop(val["path"], None)
            sha = _sha(f"{repo_id} {message} {time.time()} {len(st.repos[repo_id]['commits'])}".encode())
            st.repos[repo_id]["commits"].append((sha, files))
        host = self.headers["Host"]
        return self._json({"commitUrl": f"http://{host}/{repo_id}/commit/{sha}", "commitOid": sha,
                           "success": True, "pullRequestUrl": None})

    def do_PUT(self):
        path = urlparse(self.path).path
        if path.startswith("/lfs-upload/"):
            oid = path.rsplit("/", 1)[1]
            data = self._body()
            if hashlib.sha256(data).hexdigest() != oid:
                return self._error(400, "BadRequest", "LFS content does not match its oid")
            self.state.lfs[oid] = data
            return self._send(200, b"")
        self._body()
        return self._error(404, "EntryNotFound", path)

    def do_HEAD(self):
        return self.do_GET()

    def do_GET(self):
        path = unquote(urlparse(self.path).path)
        st = self.state
        if path.startswith("/api/models/"):
            parts = path[len("/api/models/"):].split("/")
            repo_id = self._repo_from(parts)
            if repo_id not in st.repos:
                return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            rev = "main"
            if len(parts) > 3 and parts[2] in ("revision", "tree"):
                rev = parts[3]
            found = st.resolve(repo_id, rev)
            if found is None:
                return self._error(404, "RevisionNotFound", f"Revision {rev} not found")
            sha, files = found
            if len(parts) > 2 and parts[2] == "tree":
                return self._json([{"type": "file", "path": p, "size": len(b), "oid": _sha(b)} for p, b in sorted(files.items())])
            return self._json({"id": repo_id, "modelId": repo_id, "sha": sha, "private": st.repos[repo_id]["private"],
                               "siblings": [{"rfilename": p} for p in sorted(files)], "tags": [], "downloads": 0,
                               "likes": 0, "lastModified": "2026-11-22T00:00:00.000Z"})
        # /{org}/{name}/resolve/{rev}/{path}
        parts = path.lstrip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id, rev, fpath = self._repo_from(parts), parts[3], "/".join(parts[4:])
            if repo_id not in st.repos:
                return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            found = st.resolve(repo_id, rev)
            if found is None:
                return self._error(404, "RevisionNotFound", f"Revision {rev} not found")
            sha, files = found
            if fpath not in files:
                return self._error(404, "EntryNotFound", f"{fpath} does not exist in {repo_id}@{rev}")
            data = files[fpath]
            etag = hashlib.sha256(data).hexdigest() if fpath.endswith(".safetensors") else _sha(data)
            headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if fpath.endswith(".safetensors"):
                headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
            return self._send(200, data, headers, content_type="application/octet-stream")
        return self._error(404, "EntryNotFound", f"no route {path}")


class LocalHub:
    """Context manager: ``with LocalHub() as hub: hub.endpoint``."""

    def __init__(self):
        self.state = HubState()
        handler = type("BoundHandler", (Handler,), {"state": self.state})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LocalHub:
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
