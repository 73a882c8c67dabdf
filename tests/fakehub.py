"""A local stand-in for the Hugging Face Hub, speaking the wire protocol huggingface_hub 2.4 uses.

Two stdlib ``ThreadingHTTPServer``s bound to 127.0.0.1 on free ports:

* ``hub`` (``FakeHub.url``) - the Hub itself: the JSON API, ``/resolve`` and the git-LFS batch API;
* ``cdn`` (``FakeHub.cdn_url``) - where LFS content lives (downloads) and where LFS uploads are PUT.
  It is a *different origin* (other port), exactly like the real Hub's CDN / S3, so the client
  stops at the 302 of ``HEAD /resolve``, reads the metadata off it (``X-Linked-Etag``,
  ``X-Linked-Size``, ``X-Repo-Commit``) and drops its ``Authorization`` header for the CDN.

Endpoints (``{repo}`` is ``name`` or ``namespace/name``, ``{rev}`` a branch or a 40-hex commit):

    GET  /api/models/{repo}                      model info (``sha``, ``siblings``; ``?blobs=True``
    GET  /api/models/{repo}/revision/{rev}       adds size / blobId / lfs to siblings)
    GET  /api/models/{repo}/refs                 branches / tags / converts (``?include_prs=1``: pullRequests)
    GET  /api/models/{repo}/tree/{rev}[/{path}]  tree listing (``recursive``, cursor pagination via ``Link``)
    POST /api/models/{repo}/paths-info/{rev}     form-encoded ``paths``; same entries as the tree
    HEAD|GET /{repo}/resolve/{rev}/{path}        regular file: 200 + ETag (git blob id), Range;
                                                 LFS file: 302 to the CDN + X-Linked-Etag/Size
    HEAD|GET (cdn) /lfs/{sha256}                 LFS content, ``Range`` -> 206
    POST /api/repos/create                       409 when the repo exists
    POST /api/models/{repo}/branch/{branch}      409 when the branch exists
    POST /api/validate-yaml                      README front matter check
    POST /api/models/{repo}/preupload/{rev}      upload mode (lfs / regular) per file
    POST /{repo}.git/info/lfs/objects/batch      git-LFS batch API (basic transfer + verify action)
    PUT  (cdn) /upload/{sha256}                  the LFS upload itself (Content-Length or chunked)
    POST /{repo}.git/info/lfs/objects/verify     checks size and sha256 of what was PUT
    POST /api/models/{repo}/commit/{rev}         NDJSON commit (header, file, lfsFile, deletedFile);
                                                 ``?create_pr=1``: onto a new ``refs/pr/N`` from ``rev``
    GET  /api/models/{repo}/xet-{read,write}-token/{rev}   501: this fake does not speak Xet

Xet is never advertised: no ``X-Xet-Hash`` header / ``xet-auth`` link on ``/resolve`` and no
``xetHash`` in tree entries, so downloads use plain HTTP. Uploads cannot be steered by the
server in huggingface_hub 2.4 (it picks Xet whenever ``hf_xet`` is importable): tests must set
``huggingface_hub.constants.HF_HUB_DISABLE_XET = True`` (what ``HF_HUB_DISABLE_XET=1`` does at
import time); if they forget, the xet-token endpoint answers 501 and the upload fails loudly.

Commit ids are sha1s of the commit's content (parent, files, message, a counter), branches are
mutable pointers, every request is recorded with all its headers (``FakeHub.requests``), and tests
can corrupt what the CDN serves for a blob (``serve_corrupted``), cut a download once after N bytes
(``drop_connection_once``), list a file without any checksum (``withhold_checksums``) or run a
hook while the server is handling a request (``on``). ``isolate_hf_client`` points huggingface_hub's
state (home, cache, token files) at a temp dir for one test; ``write_keypair`` makes the keys of
signed uploads.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"
DEFAULT_GITATTRIBUTES = (
    "*.7z filter=lfs diff=lfs merge=lfs -text\n"
    "*.bin filter=lfs diff=lfs merge=lfs -text\n"
    "*.ckpt filter=lfs diff=lfs merge=lfs -text\n"
    "*.gguf filter=lfs diff=lfs merge=lfs -text\n"
    "*.h5 filter=lfs diff=lfs merge=lfs -text\n"
    "*.npy filter=lfs diff=lfs merge=lfs -text\n"
    "*.onnx filter=lfs diff=lfs merge=lfs -text\n"
    "*.pt filter=lfs diff=lfs merge=lfs -text\n"
    "*.pth filter=lfs diff=lfs merge=lfs -text\n"
    "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    "*.tar.* filter=lfs diff=lfs merge=lfs -text\n"
    "*.zip filter=lfs diff=lfs merge=lfs -text\n"
)
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024  # the Hub stores anything bigger than 10 MB in LFS


def write_keypair(folder, stem: str = "key"):
    """(private, public) EC P-256 PEM files in ``folder``: what signed uploads are signed and
    checked with (model-signing's key signer takes this curve)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = folder / f"{stem}.pem", folder / f"{stem}.pub.pem"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


def isolate_hf_client(home, monkeypatch) -> None:
    """huggingface_hub's state in ``home`` for one test: HF_HOME / HF_HUB_CACHE / the token files
    (the constants are read at import time, so they are monkeypatched, not only the env vars), no
    HF_TOKEN / HF_ENDPOINT from the developer's environment, Xet disabled (this fake speaks LFS only)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(home))
    for name, value in {
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_HUB_DISABLE_XET": True,  # = HF_HUB_DISABLE_XET=1 at import: uploads use LFS, which the fake speaks
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
    }.items():
        monkeypatch.setattr(constants, name, value)
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


@dataclass
class Entry:
    path: str
    size: int
    blob_id: str  # git oid: of the content (regular) or of the LFS pointer (LFS)
    sha256: str | None = None  # LFS oid; None for regular files
    pointer_size: int | None = None
    content: bytes | None = None  # regular files only; LFS content lives in FakeHub.lfs
    withheld: bool = False  # listings give no checksum for it (empty oid, no LFS metadata)

    def tree_json(self) -> dict:
        if self.withheld:
            return {"type": "file", "oid": "", "size": self.size, "path": self.path}
        d: dict = {"type": "file", "oid": self.blob_id, "size": self.size, "path": self.path}
        if self.sha256 is not None:
            d["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": self.pointer_size}
        return d


@dataclass
class Commit:
    oid: str
    parent: str | None
    message: str
    description: str
    files: dict[str, Entry]
    date: float


@dataclass
class Repo:
    repo_id: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
    created: float = field(default_factory=time.time)


@dataclass
class RecordedRequest:
    server: str  # "hub" or "cdn"
    method: str
    path: str  # raw request target, query string included
    headers: dict[str, str]  # lower-cased names
    body: bytes | None  # None for bodies not kept (uploads)

    @property
    def route(self) -> str:
        return unquote(urlsplit(self.path).path)


class HubHTTPError(Exception):
    def __init__(self, status: int, message: str, error_code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.error_code, self.headers = status, message, error_code, headers or {}


class _Response:
    def __init__(self, status=200, body: bytes | dict | list | None = b"", headers: dict | None = None,
                 content_type="application/json"):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self.status, self.body, self.headers = status, body or b"", dict(headers or {})
        self.headers.setdefault("Content-Type", content_type)
        self.drop_after: int | None = None  # write this many body bytes, then cut the connection
        self.after_send: Callable[[], None] | None = None


class FakeHub:
    """In-memory Hub. Use as a context manager or call ``start()`` / ``stop()``."""

    def __init__(self, tokens: tuple[str, ...] = ()):
        self.valid_tokens = set(tokens)
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}  # sha256 -> content (the LFS store)
        self.pending_uploads: dict[str, bytes] = {}  # PUT but not yet verified
        self.requests: list[RecordedRequest] = []
        self.corrupted: dict[str, bytes] = {}  # sha256 -> bytes served instead of the real content
        self.drops: dict[str, int] = {}  # sha256 -> cut the next GET of it after this many bytes
        self.tree_page_size = 1000
        self._hooks: list[tuple[str, re.Pattern, Callable[[RecordedRequest], None], bool]] = []
        self._lock = threading.RLock()
        self._counter = 0
        self._servers: list[ThreadingHTTPServer] = []
        self.url = self.cdn_url = ""

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> FakeHub:
        for name in ("hub", "cdn"):
            server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self, name))
            server.daemon_threads = True
            server.handle_error = lambda request, client_address: None  # client hang-ups are expected
            # stop() waits for each loop to notice the shutdown: a short poll keeps every test's teardown short
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.005}, daemon=True).start()
            self._servers.append(server)
        self.url = f"http://127.0.0.1:{self._servers[0].server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self._servers[1].server_address[1]}"
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- test helpers: content -----------------------------------------------------------------

    def create_repo(self, repo_id: str, private: bool = False) -> Repo:
        with self._lock:
            if repo_id in self.repos:
                raise ValueError(f"repo {repo_id} exists")
            repo = self.repos[repo_id] = Repo(repo_id=repo_id, private=private)
            # Like the real Hub: a new repo starts with one commit holding .gitattributes.
            self._commit(repo, "main", {".gitattributes": DEFAULT_GITATTRIBUTES.encode()}, "initial commit", "")
            return repo

    def commit(self, repo_id: str, files: dict[str, bytes | None], message: str = "update",
               branch: str = "main") -> str:
        """Commit ``files`` (``None`` deletes) on ``branch``; creates the repo if needed. Returns the oid.

        Paths are stored verbatim: a test may commit ``../evil`` to check that clients refuse it.
        """
        with self._lock:
            repo = self.repos.get(repo_id) or self.create_repo(repo_id)
            return self._commit(repo, branch, files, message, "")

    def head(self, repo_id: str, branch: str = "main") -> str:
        return self.repos[repo_id].branches[branch]

    def history(self, repo_id: str, branch: str = "main") -> list[Commit]:
        """Commits reachable from ``branch``, newest first."""
        repo = self.repos[repo_id]
        out, oid = [], repo.branches.get(branch)
        while oid is not None:
            out.append(repo.commits[oid])
            oid = repo.commits[oid].parent
        return out

    def file(self, repo_id: str, path: str, rev: str = "main") -> bytes:
        repo = self.repos[repo_id]
        entry = repo.commits[self._resolve_rev(repo, rev)].files[path]
        return entry.content if entry.sha256 is None else self.lfs[entry.sha256]

    def entry(self, repo_id: str, path: str, rev: str = "main") -> Entry:
        repo = self.repos[repo_id]
        return repo.commits[self._resolve_rev(repo, rev)].files[path]

    def serve_corrupted(self, repo_id: str, path: str, rev: str = "main") -> bytes:
        """From now on the CDN serves different bytes (same size) for this LFS file, while the Hub
        keeps advertising the original sha256. Returns the bytes that will be served."""
        entry = self.entry(repo_id, path, rev)
        if entry.sha256 is None:
            raise ValueError("serve_corrupted only applies to LFS files")
        good = self.lfs[entry.sha256]
        bad = bytes([good[0] ^ 0xFF]) + good[1:] if good else b"x"
        self.corrupted[entry.sha256] = bad
        return bad

    def withhold_checksums(self, repo_id: str, path: str, rev: str = "main") -> None:
        """From now on the tree listings give no checksum for this file (no LFS sha256, empty git
        oid), so a client cannot verify it; downloads are unchanged."""
        self.entry(repo_id, path, rev).withheld = True

    def drop_connection_once(self, repo_id: str, path: str, after_bytes: int, rev: str = "main") -> None:
        """The next GET of this LFS file sends ``after_bytes`` bytes of the body, then the server
        closes the connection (Content-Length promised the whole file)."""
        entry = self.entry(repo_id, path, rev)
        if entry.sha256 is None:
            raise ValueError("drop_connection_once only applies to LFS files")
        self.drops[entry.sha256] = after_bytes

    def on(self, method: str, route_regex: str, fn: Callable[[RecordedRequest], None], once: bool = True) -> None:
        """Run ``fn(request)`` while handling a matching request, after its response is computed
        and before it is sent (so the client cannot race ahead of the state change), outside the
        server's lock (so ``fn`` may wait for another request)."""
        self._hooks.append((method.upper(), re.compile(route_regex), fn, once))

    def requests_to(self, method: str, route_regex: str) -> list[RecordedRequest]:
        rx = re.compile(route_regex)
        return [r for r in list(self.requests) if r.method == method and rx.search(r.route)]

    # --- internals: model ----------------------------------------------------------------------

    def _lfs_patterns(self, files: dict[str, Entry]) -> list[str]:
        ga = files.get(".gitattributes")
        text = ga.content.decode(errors="replace") if ga is not None and ga.content is not None else ""
        return [line.split()[0] for line in text.splitlines() if "filter=lfs" in line and line.split()]

    def _is_lfs(self, files: dict[str, Entry], path: str, size: int, sample: bytes = b"") -> bool:
        if path == ".gitattributes":
            return False
        name = path.rsplit("/", 1)[-1]
        if any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in self._lfs_patterns(files)):
            return True
        return size >= LFS_SIZE_THRESHOLD or b"\0" in sample

    def _make_entry(self, files: dict[str, Entry], path: str, data: bytes) -> Entry:
        if self._is_lfs(files, path, len(data), data[:512]):
            oid = hashlib.sha256(data).hexdigest()
            self.lfs.setdefault(oid, data)
            pointer = LFS_POINTER.format(oid=oid, size=len(data)).encode()
            return Entry(path, len(data), git_blob_id(pointer), oid, len(pointer))
        return Entry(path, len(data), git_blob_id(data), content=data)

    def _commit(self, repo: Repo, branch: str, changes: dict, message: str, description: str,
                prebuilt: dict[str, Entry] | None = None, deleted_folders: tuple[str, ...] = ()) -> str:
        parent = repo.branches.get(branch)
        files = dict(repo.commits[parent].files) if parent else {}
        for folder in deleted_folders:
            prefix = folder.rstrip("/") + "/"
            for p in [p for p in files if p.startswith(prefix)]:
                del files[p]
        # .gitattributes first: it decides which of the other files are LFS
        for path in sorted(changes, key=lambda p: p != ".gitattributes"):
            data = changes[path]
            if data is None:
                files.pop(path, None)
            else:
                files[path] = self._make_entry(files, path, data)
        files.update(prebuilt or {})
        self._counter += 1
        digest = hashlib.sha1(json.dumps(
            [parent, sorted((p, e.blob_id) for p, e in files.items()), message, description, self._counter]
        ).encode()).hexdigest()
        repo.commits[digest] = Commit(digest, parent, message, description, files, time.time())
        repo.branches[branch] = digest
        return digest

    def _resolve_rev(self, repo: Repo, rev: str) -> str:
        if rev in repo.branches:
            return repo.branches[rev]
        if rev in repo.commits:
            return rev
        if re.fullmatch(r"[0-9a-f]{7,39}", rev):
            matches = [oid for oid in repo.commits if oid.startswith(rev)]
            if len(matches) == 1:
                return matches[0]
        raise HubHTTPError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def _tree_entries(self, commit: Commit, path: str, recursive: bool) -> list[dict]:
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        if prefix and prefix.rstrip("/") in commit.files:
            return [commit.files[prefix.rstrip("/")].tree_json()]
        dirs: set[str] = set()
        out: list[dict] = []
        for p, e in commit.files.items():
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):]
            parts = rest.split("/")
            for i in range(1, len(parts)):
                d = prefix + "/".join(parts[:i])
                if recursive or i == 1:
                    dirs.add(d)
            if recursive or len(parts) == 1:
                out.append(e.tree_json())
        if prefix and not out and not dirs:
            raise HubHTTPError(404, f"{path} does not exist on this revision", "EntryNotFound")
        folder_json = [
            {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d} for d in dirs
        ]
        return sorted(folder_json + out, key=lambda d: d["path"])

    # --- internals: request handling -----------------------------------------------------------

    def _find_repo(self, segments: list[str]) -> tuple[Repo | None, str, list[str]]:
        """Split leading path segments into (repo, repo_id, rest). Prefers existing repos."""
        for n in (2, 1):
            if len(segments) >= n and "/".join(segments[:n]) in self.repos:
                rid = "/".join(segments[:n])
                return self.repos[rid], rid, segments[n:]
        n = 2 if len(segments) >= 2 else 1
        return None, "/".join(segments[:n]), segments[n:]

    def _token(self, req: RecordedRequest) -> str | None:
        auth = req.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None

    def _check_read(self, repo: Repo | None, repo_id: str, req: RecordedRequest) -> Repo:
        if repo is None:
            raise HubHTTPError(404, f"Repository not found: {repo_id}", "RepoNotFound")
        if repo.private and self._token(req) not in self.valid_tokens:
            raise HubHTTPError(401, "Repository not found", "RepoNotFound")
        return repo

    def _check_write(self, req: RecordedRequest) -> None:
        token = self._token(req)
        if token is None:
            raise HubHTTPError(401, "You must be authenticated to do this (no token sent)")
        if token not in self.valid_tokens:
            raise HubHTTPError(401, "Invalid credentials in Authorization header")

    def handle(self, server: str, req: RecordedRequest) -> _Response:
        with self._lock:
            self.requests.append(req)
            try:
                resp = self._dispatch_cdn(req) if server == "cdn" else self._dispatch_hub(req)
            except HubHTTPError as e:
                headers = {"X-Error-Message": e.message, **e.headers}
                if e.error_code:
                    headers["X-Error-Code"] = e.error_code
                resp = _Response(e.status, {"error": e.message}, headers)
            hooks = [h for h in self._hooks if h[0] == req.method and h[1].search(req.route)]
            for hook in hooks:
                if hook[3]:  # once
                    self._hooks.remove(hook)
        for _method, _rx, fn, _once in hooks:  # outside the lock: a hook may wait for another request
            fn(req)
        return resp

    def _dispatch_hub(self, req: RecordedRequest) -> _Response:
        split = urlsplit(req.path)
        raw = [s for s in split.path.split("/") if s != ""]
        seg = [unquote(s) for s in raw]
        query = parse_qs(split.query)
        m = req.method

        if seg[:2] == ["api", "repos"] and seg[2:] == ["create"] and m == "POST":
            return self._create_repo(req)
        if seg[:2] == ["api", "validate-yaml"] and m == "POST":
            return self._validate_yaml(req)
        if seg[:2] == ["api", "models"] and len(seg) >= 3:
            repo, repo_id, rest = self._find_repo(seg[2:])
            return self._api_model(req, m, repo, repo_id, rest, query)
        # git-LFS: /{repo}.git/info/lfs/objects/{batch,verify}
        if len(seg) >= 5 and seg[-4:-1] == ["info", "lfs", "objects"]:
            repo_id = "/".join(seg[:-4])
            if repo_id.endswith(".git"):
                repo_id = repo_id[:-4]
            if m == "POST" and seg[-1] == "batch":
                return self._lfs_batch(req, repo_id)
            if m == "POST" and seg[-1] == "verify":
                return self._lfs_verify(req, repo_id)
        # /{repo}/resolve/{rev}/{path...}: split on the raw segments (rev is %2F-quoted by clients)
        if "resolve" in seg and m in ("GET", "HEAD"):
            i = seg.index("resolve")
            repo, repo_id, _ = self._find_repo(seg[:i])
            if len(seg) > i + 2:
                return self._resolve(req, repo, repo_id, seg[i + 1], "/".join(seg[i + 2:]))
        raise HubHTTPError(404, f"fakehub: no route for {m} {split.path}")

    def _api_model(self, req, m, repo, repo_id, rest, query) -> _Response:
        if not rest and m == "GET":
            return self._model_info(req, repo, repo_id, None, query)
        if len(rest) == 2 and rest[0] == "revision" and m == "GET":
            return self._model_info(req, repo, repo_id, rest[1], query)
        if rest == ["refs"] and m == "GET":
            return self._refs(req, repo, repo_id, query)
        if rest and rest[0] == "tree" and len(rest) >= 2 and m == "GET":
            return self._tree(req, repo, repo_id, rest[1], "/".join(rest[2:]), query)
        if len(rest) == 2 and rest[0] == "paths-info" and m == "POST":
            return self._paths_info(req, repo, repo_id, rest[1])
        if len(rest) == 2 and rest[0] == "preupload" and m == "POST":
            return self._preupload(req, repo, repo_id, rest[1])
        if len(rest) == 2 and rest[0] == "commit" and m == "POST":
            return self._commit_endpoint(req, repo, repo_id, rest[1], query)
        if len(rest) == 2 and rest[0] == "branch" and m == "POST":
            return self._create_branch(req, repo, repo_id, rest[1])
        if rest and rest[0] in ("xet-write-token", "xet-read-token"):
            raise HubHTTPError(
                501, "fakehub does not implement Xet storage: set HF_HUB_DISABLE_XET=1 "
                "(huggingface_hub.constants.HF_HUB_DISABLE_XET = True) to use the LFS protocol"
            )
        raise HubHTTPError(404, f"fakehub: no route for {m} /api/models/{repo_id}/{'/'.join(rest)}")

    def _model_info(self, req, repo, repo_id, rev, query) -> _Response:
        repo = self._check_read(repo, repo_id, req)
        oid = self._resolve_rev(repo, rev or "main")
        commit = repo.commits[oid]
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for p in sorted(commit.files):
            e = commit.files[p]
            s: dict = {"rfilename": p}
            if blobs:
                s.update(size=e.size, blobId=e.blob_id)
                if e.sha256:
                    s["lfs"] = {"size": e.size, "sha256": e.sha256, "pointerSize": e.pointer_size}
            siblings.append(s)
        author = repo_id.split("/")[0] if "/" in repo_id else None
        info = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "modelId": repo_id,
            "author": author, "sha": oid, "lastModified": _iso(commit.date), "createdAt": _iso(repo.created),
            "private": repo.private, "disabled": False, "gated": False, "downloads": 0, "likes": 0,
            "tags": [], "siblings": siblings,
        }
        readme = commit.files.get("README.md")
        card = _front_matter(readme.content) if readme is not None and readme.content is not None else None
        if card is not None:  # the Hub parses the README's YAML into cardData
            info["cardData"] = card
        return _Response(200, info)

    def _refs(self, req, repo, repo_id, query) -> _Response:
        """The repo's git refs as the Hub lists them: branches (``main`` first), tags (none here),
        converts, and with ``?include_prs=1`` the pull requests' ``refs/pr/N``. llama.cpp's ``-hf``
        resolves a repo to a commit through this list (common/hf-cache.cpp, get_repo_commit)."""
        repo = self._check_read(repo, repo_id, req)
        branches = sorted((b for b in repo.branches if not b.startswith("refs/")), key=lambda b: (b != "main", b))
        out: dict = {"branches": [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": repo.branches[b]}
                                  for b in branches], "converts": [], "tags": []}
        if query.get("include_prs", ["0"])[0] not in ("0", "false", ""):
            out["pullRequests"] = [{"name": b, "ref": b, "targetCommit": oid}
                                   for b, oid in sorted(repo.branches.items()) if b.startswith("refs/pr/")]
        return _Response(200, out)

    def _tree(self, req, repo, repo_id, rev, path, query) -> _Response:
        repo = self._check_read(repo, repo_id, req)
        oid = self._resolve_rev(repo, rev)
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        entries = self._tree_entries(repo.commits[oid], path, recursive)
        cursor = int(query.get("cursor", ["0"])[0])
        page = entries[cursor:cursor + self.tree_page_size]
        headers = {}
        if cursor + self.tree_page_size < len(entries):
            nxt = (f"{self.url}/api/models/{repo_id}/tree/{quote(rev, safe='')}"
                   f"{'/' + quote(path) if path else ''}?recursive={recursive}&cursor={cursor + self.tree_page_size}")
            headers["Link"] = f'<{nxt}>; rel="next"'
        return _Response(200, page, headers)

    def _paths_info(self, req, repo, repo_id, rev) -> _Response:
        repo = self._check_read(repo, repo_id, req)
        commit = repo.commits[self._resolve_rev(repo, rev)]
        form = parse_qs((req.body or b"").decode())
        out = []
        for p in form.get("paths", []):
            p = p.strip("/")
            if p in commit.files:
                out.append(commit.files[p].tree_json())
            elif any(f.startswith(p + "/") for f in commit.files):
                out.append({"type": "directory", "oid": hashlib.sha1(p.encode()).hexdigest(), "size": 0, "path": p})
        return _Response(200, out)

    def _resolve(self, req, repo, repo_id, rev, path) -> _Response:
        repo = self._check_read(repo, repo_id, req)
        oid = self._resolve_rev(repo, rev)
        entry = repo.commits[oid].files.get(path)
        if entry is None:
            raise HubHTTPError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": oid})
        if entry.sha256 is not None:
            # LFS: redirect to the CDN (another origin), metadata on the redirect itself
            location = f"{self.cdn_url}/lfs/{entry.sha256}?repo={quote(repo_id)}&file={quote(path)}"
            return _Response(302, b"", {
                "Location": location,
                "X-Repo-Commit": oid,
                "X-Linked-Etag": f'"{entry.sha256}"',
                "X-Linked-Size": str(entry.size),
                "ETag": f'"{entry.blob_id}"',
                "Accept-Ranges": "bytes",
            }, content_type="text/plain; charset=utf-8")
        return self._serve_bytes(req, entry.content or b"", {"ETag": f'"{entry.blob_id}"', "X-Repo-Commit": oid})

    def _serve_bytes(self, req, data: bytes, headers: dict, drop_after: int | None = None) -> _Response:
        headers = {"Accept-Ranges": "bytes", **headers}
        total = len(data)
        rng = req.headers.get("range")
        status, body = 200, data
        if rng:
            mm = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", rng)
            if not mm or (not mm.group(1) and not mm.group(2)):
                raise HubHTTPError(416, f"bad range {rng!r}", headers={"Content-Range": f"bytes */{total}"})
            if mm.group(1):
                start = int(mm.group(1))
                end = int(mm.group(2)) if mm.group(2) else total - 1
            else:
                start, end = max(total - int(mm.group(2)), 0), total - 1
            end = min(end, total - 1)
            if start > end or start >= total:
                raise HubHTTPError(416, f"range {rng!r} not satisfiable", headers={"Content-Range": f"bytes */{total}"})
            status, body = 206, data[start:end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{total}"
        resp = _Response(status, body if req.method == "GET" else b"", headers, "application/octet-stream")
        resp.headers["Content-Length"] = str(len(body))
        if req.method == "GET":
            resp.drop_after = drop_after
        return resp

    def _dispatch_cdn(self, req: RecordedRequest) -> _Response:
        split = urlsplit(req.path)
        seg = [unquote(s) for s in split.path.split("/") if s]
        if len(seg) == 2 and seg[0] == "lfs" and req.method in ("GET", "HEAD"):
            oid = seg[1]
            if oid not in self.lfs:
                raise HubHTTPError(404, "NoSuchKey")
            data = self.corrupted.get(oid, self.lfs[oid])
            drop = None
            if req.method == "GET" and oid in self.drops:
                drop = self.drops.pop(oid)
            return self._serve_bytes(req, data, {"ETag": f'"{oid}"'}, drop_after=drop)
        if len(seg) == 2 and seg[0] == "upload" and req.method == "PUT":
            data = req.body or b""
            self.pending_uploads[seg[1]] = data
            return _Response(200, b"", {"ETag": f'"{hashlib.md5(data).hexdigest()}"'})
        raise HubHTTPError(404, f"fakehub cdn: no route for {req.method} {split.path}")

    # --- write endpoints -----------------------------------------------------------------------

    def _json_body(self, req) -> dict:
        try:
            return json.loads(req.body or b"{}")
        except ValueError:
            raise HubHTTPError(400, "body is not JSON") from None

    def _create_repo(self, req) -> _Response:
        self._check_write(req)
        body = self._json_body(req)
        if body.get("type") not in (None, "model"):
            raise HubHTTPError(400, "fakehub only hosts model repos")
        name, org = body.get("name"), body.get("organization")
        if not name:
            raise HubHTTPError(400, "name is required")
        repo_id = f"{org}/{name}" if org else name
        url = f"{self.url}/{repo_id}"
        if repo_id in self.repos:  # the real Hub's 409 carries the url too (the client reads it)
            return _Response(409, {"error": "You already created this model repo", "url": url},
                             {"X-Error-Message": "You already created this model repo"})
        self.create_repo(repo_id, private=body.get("visibility") == "private" or bool(body.get("private")))
        return _Response(200, {"url": url, "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()[:24]})

    def _create_branch(self, req, repo, repo_id, branch) -> _Response:
        self._check_write(req)
        repo = self._check_read(repo, repo_id, req)
        if branch in repo.branches:
            raise HubHTTPError(409, f"Reference refs/heads/{branch} already exists")
        start = self._json_body(req).get("startingPoint")
        repo.branches[branch] = self._resolve_rev(repo, start or "main")
        return _Response(200, {})

    def _validate_yaml(self, req) -> _Response:
        content = self._json_body(req).get("content", "")
        if content.startswith("---"):
            lines = content.splitlines()
            if not any(line.strip() == "---" for line in lines[1:]):
                return _Response(400, {"errors": [{"message": "YAML front matter is not closed with ---"}],
                                       "warnings": []})
        return _Response(200, {"errors": [], "warnings": []})

    def _preupload(self, req, repo, repo_id, rev) -> _Response:
        self._check_write(req)
        repo = self._check_read(repo, repo_id, req)
        head = self._resolve_rev(repo, rev)
        files = repo.commits[head].files
        out = []
        for f in self._json_body(req).get("files", []):
            sample = base64.b64decode(f.get("sample", ""))
            lfs = self._is_lfs(files, f["path"], int(f["size"]), sample)
            existing = files.get(f["path"])
            oid = None
            if existing is not None:
                oid = existing.sha256 if existing.sha256 is not None else existing.blob_id
            out.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                        "oid": oid})
        return _Response(200, {"files": out, "commitOid": head})

    def _lfs_batch(self, req, repo_id) -> _Response:
        self._check_write(req)
        if repo_id not in self.repos:
            raise HubHTTPError(404, f"Repository not found: {repo_id}", "RepoNotFound")
        body = self._json_body(req)
        if body.get("operation") != "upload":
            raise HubHTTPError(400, "fakehub's LFS batch API only supports uploads")
        objects = []
        for obj in body.get("objects", []):
            oid, size = obj["oid"], int(obj["size"])
            item: dict = {"oid": oid, "size": size, "authenticated": True}
            if oid not in self.lfs:
                item["actions"] = {
                    "upload": {"href": f"{self.cdn_url}/upload/{oid}", "header": {}},
                    "verify": {"href": f"{self.url}/{repo_id}.git/info/lfs/objects/verify", "header": {}},
                }
            objects.append(item)
        return _Response(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
                         content_type="application/vnd.git-lfs+json")

    def _lfs_verify(self, req, repo_id) -> _Response:
        self._check_write(req)
        body = self._json_body(req)
        oid, size = body.get("oid"), body.get("size")
        data = self.pending_uploads.get(oid)
        if data is None:
            raise HubHTTPError(404, f"object {oid} was not uploaded")
        if len(data) != size or hashlib.sha256(data).hexdigest() != oid:
            raise HubHTTPError(422, f"uploaded object does not match oid {oid} / size {size}")
        self.lfs[oid] = self.pending_uploads.pop(oid)
        return _Response(200, {})

    def _commit_endpoint(self, req, repo, repo_id, rev, query) -> _Response:
        self._check_write(req)
        repo = self._check_read(repo, repo_id, req)
        if rev not in repo.branches:
            raise HubHTTPError(404, f"Invalid rev id: {rev} (commits go to a branch)", "RevisionNotFound")
        pr_num = None
        if query.get("create_pr"):  # a pull request against branch `rev`: its own ref refs/pr/N from rev's head
            pr_num = 1 + sum(b.startswith("refs/pr/") for b in repo.branches)
            base, rev = rev, f"refs/pr/{pr_num}"
        if not req.headers.get("content-type", "").startswith("application/x-ndjson"):
            raise HubHTTPError(400, "commit payload must be application/x-ndjson")
        header, changes, prebuilt, deleted_folders = None, {}, {}, []
        for line in (req.body or b"").splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                header = value
            elif key == "file":
                if value.get("encoding") != "base64":
                    raise HubHTTPError(400, "file content must be base64")
                changes[value["path"]] = base64.b64decode(value["content"])
            elif key == "lfsFile":
                oid = value["oid"]
                if value.get("algo") != "sha256" or oid not in self.lfs:
                    raise HubHTTPError(400, f"LFS object {oid} for {value['path']} was never uploaded")
                if "size" in value and int(value["size"]) != len(self.lfs[oid]):
                    raise HubHTTPError(400, f"LFS object {oid} has size {len(self.lfs[oid])}, not {value['size']}")
                pointer = LFS_POINTER.format(oid=oid, size=len(self.lfs[oid])).encode()
                prebuilt[value["path"]] = Entry(value["path"], len(self.lfs[oid]), git_blob_id(pointer), oid,
                                                len(pointer))
            elif key == "deletedFile":
                changes[value["path"]] = None
            elif key == "deletedFolder":
                deleted_folders.append(value["path"])
            else:
                raise HubHTTPError(400, f"unknown commit operation {key!r}")
        if header is None or not header.get("summary"):
            raise HubHTTPError(400, "commit header with a summary is required")
        if pr_num is not None:
            repo.branches[rev] = repo.branches[base]
        parent = header.get("parentCommit")
        if parent and not repo.branches[rev].startswith(parent):
            raise HubHTTPError(412, f"parent commit {parent} is not the head of {rev}")
        oid = self._commit(repo, rev, changes, header["summary"], header.get("description", ""), prebuilt,
                           tuple(deleted_folders))
        return _Response(200, {"success": True, "commitOid": oid, "commitUrl": f"{self.url}/{repo_id}/commit/{oid}",
                               "hookOutput": "",
                               "pullRequestUrl": f"{self.url}/{repo_id}/discussions/{pr_num}" if pr_num else None})


def _front_matter(readme: bytes) -> dict | None:
    """The YAML block at the top of a README (``---`` ... ``---``), as the Hub reads it."""
    import yaml

    text = readme.decode("utf-8", "replace")
    if not text.startswith("---\n") or "\n---" not in text[4:]:
        return None
    data = yaml.safe_load(text[4:].split("\n---", 1)[0])
    return data if isinstance(data, dict) else None


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return bytes(out)
            out += handler.rfile.read(size)
            handler.rfile.readline()  # CRLF after each chunk
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def _make_handler(hub: FakeHub, server_name: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fakehub/1.0"
        # Headers and body go out in two writes: with Nagle on, the body waits for the client's
        # delayed ACK of the headers (~40 ms on Linux) on every response.
        disable_nagle_algorithm = True

        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def _handle(self) -> None:
            body = _read_body(self) if self.command in ("POST", "PUT") else None
            req = RecordedRequest(
                server=server_name, method=self.command, path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
            resp = hub.handle(server_name, req)
            if self.command == "PUT":
                req.body = None  # uploads are kept in hub.pending_uploads / hub.lfs, not in the log
            self.send_response(resp.status)
            for k, v in resp.headers.items():
                self.send_header(k, v)
            if "Content-Length" not in resp.headers:
                self.send_header("Content-Length", str(len(resp.body)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if resp.drop_after is not None:
                self.wfile.write(resp.body[: resp.drop_after])
                self.wfile.flush()
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            self.wfile.write(resp.body)

        do_GET = do_HEAD = do_POST = do_PUT = _handle

    return Handler
