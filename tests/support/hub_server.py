"""A local Hugging Face Hub for tests: the real `huggingface_hub` client (and transformers through it) talks HTTP to
an in-memory server on 127.0.0.1, so pushes and downloads run end to end without the internet.

Use the `hub_server` fixture (`from hub_server import hub_server`). It starts the server on a free port, points the
client at it (environment for subprocesses, and the module-level copies the client and transformers took at import:
see `point_client_at`), turns offline mode off, sets a token (`HF_TOKEN`), and gives the test a `LocalHub` whose
state (repos, commits, branches, request log) the test can inspect, plus fault injection (`fail_next`).

Endpoints covered (model repos only; `{repo}` is `namespace/name`, `{rev}` a branch name or a commit sha, either
URL-quoted as the client sends them). The kind in brackets names the endpoint in the request log and in `fail_next`:

    POST /api/repos/create                          [create-repo]    {name, organization, visibility|private, type}:
                                                                     an initial commit holding `.gitattributes` on
                                                                     `main`, like the Hub; 409 if it exists
    GET  /api/models/{repo}                         [repo-info]      ModelInfo: id, sha, private, siblings, tags,
    GET  /api/models/{repo}/revision/{rev}          [repo-info]      cardData/pipeline_tag/library_name read off the
                                                                     README.md front matter; `?blobs=true` adds sizes
    GET  /api/models/{repo}/tree/{rev}[/{path}]     [tree]           `?recursive=`; files and directories, one page
    GET  /api/models/{repo}/refs                    [refs]           branches (no tags, converts or pull requests)
    GET  /api/models/{repo}/commits/{rev}           [commits]        the history of a revision, newest first
    POST /api/models/{repo}/branch/{branch}         [branch]         `{startingPoint}` optional (default: main's head);
                                                                     409 if the branch exists
    POST /api/models/{repo}/preupload/{rev}         [preupload]      answers uploadMode "regular" for every file (so
                                                                     no LFS or Xet transfer ever happens) and the
                                                                     git oid of the file already at `rev` (the client
                                                                     skips unchanged files)
    POST /api/models/{repo}/commit/{rev}            [commit]         NDJSON: header {summary, description,
                                                                     parentCommit}, file {path, content,
                                                                     encoding: base64}, deletedFile, deletedFolder;
                                                                     `lfsFile` and `?create_pr=1` are refused (400)
    HEAD /{repo}/resolve/{rev}/{path}               [resolve-head]   X-Repo-Commit, ETag (git blob sha1, quoted),
    GET  /{repo}/resolve/{rev}/{path}               [resolve-get]    Content-Length; no X-Linked-*/Xet headers;
                                                                     GET honours `Range: bytes=a-[b]`
    POST /api/validate-yaml                         [validate-yaml]  parses the README front matter and checks the
                                                                     metadata types the Hub checks (license,
                                                                     pipeline_tag, tags, datasets, model-index)
    GET  /api/agent-harnesses                       [agent-harnesses] the empty registry (the client fetches it once
                                                                     per process to build its user agent)

Errors carry the Hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound) so the client raises the same
exception types as against the Hub. Private repos answer 401 RepoNotFound to requests without a token; every write
needs a token. Anything else answers 404 and is recorded in `LocalHub.unhandled`, so a test can assert that the client
needed nothing the server lacks.

Fault injection: `hub.fail_next("commit", times=6)` makes the next 6 commit requests answer HTTP 500 after their body
has been read and before anything is applied, i.e. a server that fails in the middle of an upload. Note that the
client retries some requests itself (preupload always; the commit of `upload_folder` when `hf_xet` is installed),
up to 5 retries with exponential backoff: see `fast_client_retries` to keep such tests fast.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
import yaml

DEFAULT_NAMESPACE = "test-user"  # where `create_repo("name")` without a namespace puts the repo
TOKEN = "hf_local_test_token"
EMPTY_SHA = "0" * 40
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"
YAML_BLOCK = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")  # as repocard.py
# Metadata values the validator knows (a subset of the Hub's lists, enough for transformers models).
LICENSES = {
    "apache-2.0", "mit", "bsd-2-clause", "bsd-3-clause", "cc-by-4.0", "cc-by-sa-4.0", "cc-by-nc-4.0", "cc0-1.0",
    "gpl-3.0", "lgpl-3.0", "agpl-3.0", "mpl-2.0", "openrail", "creativeml-openrail-m", "llama2", "llama3",
    "gemma", "unlicense", "other", "unknown",
}  # fmt: skip
PIPELINE_TAGS = {
    "text-generation", "fill-mask", "text2text-generation", "text-classification", "token-classification",
    "question-answering", "feature-extraction", "sentence-similarity", "summarization", "translation",
    "zero-shot-classification", "table-question-answering", "image-classification", "automatic-speech-recognition",
}  # fmt: skip


def git_blob_sha1(content: bytes) -> str:
    """The git object id of a file, which is what the Hub reports as oid/ETag for regular (non-LFS) files."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    description: str
    files: dict[str, bytes]  # full snapshot of the tree at this commit
    date: str
    operations: list[dict] = field(default_factory=list)  # what the client sent, content replaced by its length


@dataclass
class Repo:
    repo_id: str
    private: bool
    created_at: str
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit | None:
        """A branch name, a full commit sha or an unambiguous prefix of at least 7 characters."""
        if revision in self.branches:
            return self.commits[self.branches[revision]]
        if revision in self.commits:
            return self.commits[revision]
        if re.fullmatch(r"[0-9a-f]{7,39}", revision):
            matches = [oid for oid in self.commits if oid.startswith(revision)]
            if len(matches) == 1:
                return self.commits[matches[0]]
        return None

    def history(self, revision: str = "main") -> list[Commit]:
        """Commits reachable from `revision`, newest first."""
        commit, history = self.resolve(revision), []
        while commit is not None:
            history.append(commit)
            commit = self.commits.get(commit.parent) if commit.parent else None
        return history


@dataclass
class RequestRecord:
    method: str
    path: str
    kind: str
    status: int
    token: str | None


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None, **body):
        super().__init__(message)
        self.status, self.message, self.code, self.headers, self.body = status, message, code, headers or {}, body


class LocalHub:
    """In-memory Hub state and the HTTP server around it. Thread-safe: one lock around every state change."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[RequestRecord] = []
        self.unhandled: list[str] = []
        self._faults: dict[str, list[int]] = {}  # kind -> [remaining, status]
        self._lock = threading.RLock()
        self._counter = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def start(self) -> LocalHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="local-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- test helpers ----------------------------------------------------------------------------------------------

    def fail_next(self, kind: str, times: int = 1, status: int = 500) -> None:
        """Answer `status` to the next `times` requests of `kind` (see the module docstring for the kinds)."""
        with self._lock:
            self._faults[kind] = [times, status]

    def repo(self, repo_id: str) -> Repo:
        return self.repos[repo_id]

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        commit = self.repos[repo_id].resolve(revision)
        if commit is None:
            raise KeyError(f"{repo_id} has no revision {revision!r}")
        return dict(commit.files)

    def count(self, kind: str, status: int | None = None) -> int:
        return sum(1 for r in self.requests if r.kind == kind and (status is None or r.status == status))

    # -- request handling (called from server threads) -------------------------------------------------------------

    def _take_fault(self, kind: str) -> int | None:
        with self._lock:
            fault = self._faults.get(kind)
            if fault and fault[0] > 0:
                fault[0] -= 1
                return fault[1]
        return None

    def _new_oid(self, *parts) -> str:
        with self._lock:
            self._counter += 1
            return hashlib.sha1(json.dumps([self._counter, *parts], default=str).encode()).hexdigest()

    def _get_repo(self, repo_id: str, token: str | None, write: bool = False) -> Repo:
        repo = self.repos.get(repo_id)
        if write and token is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        if repo is None or (repo.private and token is None):
            # The Hub answers the same for a missing repo and for a private one without credentials.
            raise HubError(401 if repo is not None else 404, "Repository not found", "RepoNotFound")
        return repo

    def _resolve(self, repo: Repo, revision: str) -> Commit:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    def create_repo(self, body: dict, token: str | None, base: str) -> dict:
        if token is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        if body.get("type", "model") not in (None, "model"):
            raise HubError(400, f"this test server only hosts model repos, not {body['type']!r}")
        name = body.get("name") or ""
        if not re.fullmatch(r"[\w.-]{1,96}", name) or "--" in name or ".." in name:
            raise HubError(400, f"Invalid repo name {name!r}")
        repo_id = f"{body.get('organization') or DEFAULT_NAMESPACE}/{name}"
        private = body.get("visibility") == "private" or bool(body.get("private"))
        with self._lock:
            if repo_id in self.repos:
                # the client reads "url" from this answer too (create_repo with exist_ok=True)
                raise HubError(409, "You already created this model repo", url=f"{base}/{repo_id}")
            repo = Repo(repo_id=repo_id, private=private, created_at=_now())
            files = {".gitattributes": GITATTRIBUTES}
            oid = self._new_oid(repo_id, "initial commit")
            repo.commits[oid] = Commit(oid, None, "initial commit", "", files, repo.created_at)
            repo.branches["main"] = oid
            self.repos[repo_id] = repo
        return {"url": f"{base}/{repo_id}", "name": repo_id, "id": repo_id}

    def repo_info(self, repo: Repo, revision: str, blobs: bool) -> dict:
        commit = self._resolve(repo, revision)
        metadata = _front_matter(commit.files.get("README.md", b"").decode("utf-8", "replace")) or {}
        siblings = []
        for path, content in sorted(commit.files.items()):
            sibling = {"rfilename": path}
            if blobs:
                sibling.update(size=len(content), blobId=git_blob_sha1(content))
            siblings.append(sibling)
        namespace = repo.repo_id.split("/")[0]
        tags = list(metadata.get("tags") or []) if isinstance(metadata, dict) else []
        info = {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": namespace,
            "sha": commit.oid,
            "lastModified": commit.date,
            "createdAt": repo.created_at,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": tags,
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(len(c) for c in commit.files.values()),
        }
        if isinstance(metadata, dict) and metadata:
            info["cardData"] = metadata
            for key in ("library_name", "pipeline_tag"):
                if key in metadata:
                    info[key] = metadata[key]
        if "config.json" in commit.files:
            try:
                config = json.loads(commit.files["config.json"])
                info["config"] = {k: config[k] for k in ("architectures", "model_type", "auto_map") if k in config}
            except ValueError:
                pass
        return info

    def tree(self, repo: Repo, revision: str, path: str, recursive: bool) -> list[dict]:
        commit = self._resolve(repo, revision)
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        if prefix and not any(p.startswith(prefix) for p in commit.files):
            raise HubError(404, f"{path} does not exist on {revision}", "EntryNotFound")
        entries, folders = [], set()
        for file_path, content in sorted(commit.files.items()):
            if not file_path.startswith(prefix):
                continue
            rest = file_path[len(prefix) :]
            parts = rest.split("/")
            for depth in range(1, len(parts)):  # the folders on the way
                if depth > 1 and not recursive:
                    break
                folder = prefix + "/".join(parts[:depth])
                if folder not in folders:
                    folders.add(folder)
                    entries.append(
                        {
                            "type": "directory",
                            "oid": hashlib.sha1(folder.encode()).hexdigest(),
                            "size": 0,
                            "path": folder,
                        }
                    )
            if len(parts) == 1 or recursive:
                entries.append(
                    {"type": "file", "oid": git_blob_sha1(content), "size": len(content), "path": file_path}
                )
        return entries

    def create_branch(self, repo: Repo, branch: str, body: dict) -> dict:
        if not re.fullmatch(r"[\w./-]+", branch) or branch.startswith(("refs/", "/")) or ".." in branch:
            raise HubError(400, f"Invalid branch name {branch!r}")
        with self._lock:
            if branch in repo.branches:
                raise HubError(409, f"Reference already exists: refs/heads/{branch}")
            start = self._resolve(repo, body.get("startingPoint") or "main")
            repo.branches[branch] = start.oid
        return {}

    def preupload(self, repo: Repo, revision: str, body: dict) -> dict:
        commit = self._resolve(repo, revision)
        files = []
        for item in body.get("files", []):
            existing = commit.files.get(item["path"])
            files.append(
                {
                    "path": item["path"],
                    "uploadMode": "regular",
                    "shouldIgnore": False,
                    "oid": git_blob_sha1(existing) if existing is not None else None,
                }
            )
        return {"files": files, "commitOid": commit.oid}

    def commit(self, repo: Repo, revision: str, raw: bytes, query: dict, base: str) -> dict:
        if query.get("create_pr"):
            raise HubError(400, "pull requests are not supported by this test server")
        lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "the commit payload must start with a header line")
        header = lines[0]["value"]
        summary = (header.get("summary") or "").strip()
        if not summary:
            raise HubError(400, "commit summary (message) is required")
        operations = []
        with self._lock:
            if revision not in repo.branches:
                raise HubError(404, f"Invalid rev id: {revision} (commits go to a branch)", "RevisionNotFound")
            head = repo.commits[repo.branches[revision]]
            parent = header.get("parentCommit")
            if parent and not head.oid.startswith(parent):
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(head.files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value", {})
                path = value.get("path", "")
                if key == "file":
                    if value.get("encoding") != "base64":
                        raise HubError(400, f"unsupported encoding {value.get('encoding')!r} for {path}")
                    content = base64.b64decode(value["content"])
                    files[path] = content
                    operations.append({"key": key, "path": path, "encoding": "base64", "size": len(content)})
                elif key == "lfsFile":
                    raise HubError(400, f"{path}: lfsFile is not supported (preupload answers uploadMode 'regular')")
                elif key == "deletedFile":
                    if path not in files:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                    del files[path]
                    operations.append({"key": key, "path": path})
                elif key == "deletedFolder":
                    prefix = path.rstrip("/") + "/"
                    for existing in [p for p in files if p.startswith(prefix)]:
                        del files[existing]
                    operations.append({"key": key, "path": path})
                else:
                    raise HubError(400, f"unknown commit operation {key!r}")
            oid = self._new_oid(
                repo.repo_id, head.oid, summary, sorted((p, git_blob_sha1(c)) for p, c in files.items())
            )
            repo.commits[oid] = Commit(
                oid, head.oid, summary, header.get("description", ""), files, _now(), operations
            )
            repo.branches[revision] = oid
        return {
            "success": True,
            "commitOid": oid,
            "commitUrl": f"{base}/{repo.repo_id}/commit/{oid}",
            "hookOutput": "",
        }

    def validate_yaml(self, body: dict) -> tuple[int, dict]:
        content = body.get("content") or ""
        errors, warnings = [], []
        match = YAML_BLOCK.search(content)
        if match is None:
            warnings.append({"message": "empty or missing yaml metadata in repo card"})
            return 200, {"errors": errors, "warnings": warnings}
        try:
            metadata = yaml.safe_load(match.group(2))
        except yaml.YAMLError as error:
            return 400, {"errors": [{"message": f"invalid YAML: {error}"}], "warnings": []}
        if metadata is None:
            warnings.append({"message": "empty or missing yaml metadata in repo card"})
        elif not isinstance(metadata, dict):
            errors.append({"message": '"metadata" must be a YAML mapping'})
        else:
            errors.extend({"message": m} for m in metadata_errors(metadata))
        return (400 if errors else 200), {"errors": errors, "warnings": warnings}


def _front_matter(text: str):
    match = YAML_BLOCK.search(text)
    if match is None:
        return None
    try:
        return yaml.safe_load(match.group(2))
    except yaml.YAMLError:
        return None


def _is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def metadata_errors(metadata: dict) -> list[str]:
    """The checks the Hub applies to model card metadata, for the fields a transformers model card uses."""
    errors = []
    license = metadata.get("license")
    if license is not None and license not in LICENSES:
        errors.append(f'"license" must be one of the Hub license ids, got {license!r}')
    if "pipeline_tag" in metadata and metadata["pipeline_tag"] not in PIPELINE_TAGS:
        errors.append(f'"pipeline_tag" must be a Hub task id, got {metadata["pipeline_tag"]!r}')
    for key in ("tags", "datasets", "metrics"):
        if key in metadata and not (_is_str_list(metadata[key]) or isinstance(metadata[key], str)):
            errors.append(f'"{key}" must be a string or a list of strings')
    if "library_name" in metadata and not isinstance(metadata["library_name"], str):
        errors.append('"library_name" must be a string')
    model_index = metadata.get("model-index")
    if model_index is not None:
        if not isinstance(model_index, list):
            return errors + ['"model-index" must be an array']
        for i, model in enumerate(model_index):
            if not isinstance(model, dict) or not isinstance(model.get("name"), str):
                errors.append(f'"model-index[{i}].name" is required and must be a string')
                continue
            for j, result in enumerate(model.get("results") or []):
                where = f"model-index[{i}].results[{j}]"
                task, dataset, metrics = result.get("task"), result.get("dataset"), result.get("metrics")
                if not isinstance(task, dict) or not isinstance(task.get("type"), str):
                    errors.append(f'"{where}.task.type" is required')
                if not isinstance(dataset, dict) or not all(isinstance(dataset.get(k), str) for k in ("type", "name")):
                    errors.append(f'"{where}.dataset" needs string "type" and "name"')
                if not isinstance(metrics, list) or not metrics:
                    errors.append(f'"{where}.metrics" must be a non-empty array')
                    continue
                for k, metric in enumerate(metrics):
                    if (
                        not isinstance(metric, dict)
                        or not isinstance(metric.get("type"), str)
                        or "value" not in metric
                    ):
                        errors.append(f'"{where}.metrics[{k}]" needs a string "type" and a "value"')
    return errors


ROUTES = [
    # (method, regex on the raw path, kind); named groups are URL-unquoted before use
    ("POST", r"/api/repos/create", "create-repo"),
    ("POST", r"/api/validate-yaml", "validate-yaml"),
    ("GET", r"/api/agent-harnesses", "agent-harnesses"),
    ("GET", r"/api/models/(?P<repo>[^/]+/[^/]+)", "repo-info"),
    ("GET", r"/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)", "repo-info"),
    ("GET", r"/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", "tree"),
    ("GET", r"/api/models/(?P<repo>[^/]+/[^/]+)/refs", "refs"),
    ("GET", r"/api/models/(?P<repo>[^/]+/[^/]+)/commits/(?P<rev>[^/]+)", "commits"),
    ("POST", r"/api/models/(?P<repo>[^/]+/[^/]+)/branch/(?P<rev>[^/]+)", "branch"),
    ("POST", r"/api/models/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/]+)", "preupload"),
    ("POST", r"/api/models/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/]+)", "commit"),
    ("HEAD", r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve-head"),
    ("GET", r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve-get"),
]
ROUTES = [(method, re.compile(pattern + r"/?"), kind) for method, pattern, kind in ROUTES]


def _make_handler(hub: LocalHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the Hub; every response carries Content-Length
        timeout = 60  # an idle keep-alive connection is closed after this

        def log_message(self, format, *args):  # quiet
            pass

        def do_GET(self):
            self._dispatch("GET")

        def do_HEAD(self):
            self._dispatch("HEAD")

        def do_POST(self):
            self._dispatch("POST")

        def do_PUT(self):
            self._dispatch("PUT")

        def do_DELETE(self):
            self._dispatch("DELETE")

        # -- plumbing ---------------------------------------------------------------------------------------------

        def _read_body(self) -> bytes:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        break
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                return b"".join(chunks)
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _send(self, status: int, body: bytes = b"", headers: dict | None = None, content_type="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD" and body:
                self.wfile.write(body)

        def _json(self, status: int, data, headers: dict | None = None):
            self._send(status, json.dumps(data).encode(), headers)

        def _dispatch(self, method: str):
            raw = self._read_body()  # always read it: an unread body would corrupt the next request on this socket
            split = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            auth = self.headers.get("Authorization") or ""
            token = auth[len("Bearer ") :].strip() if auth.lower().startswith("bearer ") else None
            for route_method, pattern, kind in ROUTES:  # noqa: B007  (kind is read after the loop: the matched route)
                match = pattern.fullmatch(split.path)
                if route_method == method and match:
                    break
            else:
                hub.unhandled.append(f"{method} {self.path}")
                hub.requests.append(RequestRecord(method, self.path, "unhandled", 404, token))
                return self._json(404, {"error": f"{method} {split.path} is not implemented by the local hub"})
            params = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
            status = hub._take_fault(kind)
            if status is not None:
                hub.requests.append(RequestRecord(method, self.path, kind, status, token))
                return self._json(status, {"error": f"Internal Error (injected fault on {kind})"})
            try:
                status = self._handle(kind, params, query, raw, token)
            except HubError as error:
                headers = {"X-Error-Message": error.message, **error.headers}
                if error.code:
                    headers["X-Error-Code"] = error.code
                self._json(error.status, {"error": error.message, **error.body}, headers)
                status = error.status
            except (ValueError, KeyError) as error:  # malformed request body
                self._json(400, {"error": f"Bad request: {error!r}"})
                status = 400
            hub.requests.append(RequestRecord(method, self.path, kind, status, token))

        def _handle(self, kind: str, params: dict, query: dict, raw: bytes, token: str | None) -> int:
            base = hub.url
            if kind == "create-repo":
                return self._reply(200, hub.create_repo(json.loads(raw or b"{}"), token, base))
            if kind == "validate-yaml":
                status, data = hub.validate_yaml(json.loads(raw or b"{}"))
                return self._reply(status, data)
            if kind == "agent-harnesses":
                return self._reply(200, {"standardEnvVars": [], "harnesses": {}})
            write = kind in ("branch", "preupload", "commit")
            repo = hub._get_repo(params["repo"], token, write=write)
            if kind == "repo-info":
                blobs = query.get("blobs", "").lower() in ("1", "true")
                return self._reply(200, hub.repo_info(repo, params.get("rev", "main"), blobs))
            if kind == "tree":
                recursive = query.get("recursive", "").lower() in ("1", "true")
                return self._reply(200, hub.tree(repo, params["rev"], params.get("path", ""), recursive))
            if kind == "refs":
                branches = [
                    {"name": name, "ref": f"refs/heads/{name}", "targetCommit": oid}
                    for name, oid in sorted(repo.branches.items())
                ]
                return self._reply(200, {"branches": branches, "converts": [], "tags": [], "pullRequests": []})
            if kind == "commits":
                history = [
                    {
                        "id": c.oid,
                        "title": c.title,
                        "message": c.description,
                        "date": c.date,
                        "authors": [{"user": DEFAULT_NAMESPACE}],
                    }
                    for c in repo.history(hub._resolve(repo, params["rev"]).oid)
                ]
                return self._reply(200, history)
            if kind == "branch":
                return self._reply(200, hub.create_branch(repo, params["rev"], json.loads(raw or b"{}")))
            if kind == "preupload":
                return self._reply(200, hub.preupload(repo, params["rev"], json.loads(raw or b"{}")))
            if kind == "commit":
                return self._reply(200, hub.commit(repo, params["rev"], raw, query, base))
            if kind in ("resolve-head", "resolve-get"):
                return self._resolve_file(repo, params["rev"], params["path"])
            raise AssertionError(kind)

        def _reply(self, status: int, data) -> int:
            self._json(status, data)
            return status

        def _resolve_file(self, repo: Repo, revision: str, path: str) -> int:
            commit = hub._resolve(repo, revision)
            if path not in commit.files:
                raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit.oid})
            content = commit.files[path]
            headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{git_blob_sha1(content)}"', "Accept-Ranges": "bytes"}
            status = 200
            range_header = self.headers.get("Range")
            if self.command == "GET" and range_header:
                start, _, end = range_header.removeprefix("bytes=").partition("-")
                start, end = int(start or 0), int(end) if end else len(content) - 1
                headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
                content, status = content[start : end + 1], 206
            self._send(status, content, headers, content_type="application/octet-stream")
            return status

    return Handler


def point_client_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, hf_home: Path) -> None:
    """Point `huggingface_hub` and transformers, in this process and in subprocesses started from it, at `endpoint`,
    online, with a token, and with every cache under `hf_home` (never the user's own cache)."""
    import huggingface_hub
    import huggingface_hub.utils._http as hub_http
    from huggingface_hub import constants

    hf_home = Path(hf_home)
    # subprocesses read these at import
    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "HF_TOKEN": TOKEN,
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
        "HF_MODULES_CACHE": str(hf_home / "modules"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # this process read them at import: constants are module globals, read at call time through `constants.X`
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(constants, "HF_URL_HOSTS", constants.HF_URL_HOSTS | {"127.0.0.1"})
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # `is_offline_mode()` (transformers uses it) reads this
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_ASSETS_CACHE", str(hf_home / "assets"))
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(hf_home / ".agent_harnesses.json"))
    # copies taken at import: the module-level HfApi behind `huggingface_hub.upload_folder` & co., the redirect
    # allow-list, and transformers' shared HfApi (built lazily, then cached with the endpoint of its time)
    monkeypatch.setattr(huggingface_hub.hf_api.api, "endpoint", endpoint)
    monkeypatch.setattr(hub_http, "_HUB_ORIGINS", hub_http._HUB_ORIGINS | {hub_http._url_origin(endpoint)})
    try:
        import transformers.utils.hub as transformers_hub

        monkeypatch.setattr(transformers_hub, "_hf_api", None)
    except ImportError:  # pragma: no cover
        pass


def fast_client_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the client's retry-with-backoff (1, 2, 4, 8, 8 s between 6 tries) wait 0 s, keeping the number of tries."""
    from huggingface_hub.utils import _http

    for function in (_http.http_backoff, _http.http_stream_backoff, _http._http_backoff_base):
        defaults = function.__kwdefaults__
        if defaults and "base_wait_time" in defaults:
            monkeypatch.setitem(defaults, "base_wait_time", 0.0)
            monkeypatch.setitem(defaults, "max_wait_time", 0.0)


@pytest.fixture
def hub_server(monkeypatch, tmp_path_factory):
    """A running `LocalHub`, with this process's and subprocesses' Hub client pointed at it."""
    hub = LocalHub().start()
    point_client_at(monkeypatch, hub.url, tmp_path_factory.mktemp("hf_home"))
    try:
        yield hub
    finally:
        hub.stop()
