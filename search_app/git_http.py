"""Read-only git smart HTTP of a search's baseline, for workers that do not share the web node's disk.

`GET /git/searches/<search_id>.git/info/refs?service=git-upload-pack` and
`POST /git/searches/<search_id>.git/git-upload-pack`, nothing else: receive-pack and dumb HTTP
are refused. The repository is advertised with exactly one ref, `refs/crucible/baseline`, at the
search's frozen baseline commit, and dulwich's upload-pack lets a client want only advertised
refs, so a fetch gets the baseline's history and nothing else of the repository.

Each request shows the search's fetch token (runtime_app/mirrors.py: an HMAC of the secret key
and the search's pk) as the HTTP Basic password or a Bearer token. No token, a wrong one or
another search's gets 401, as does an unknown search. Token auth only: no cookie is read, so
the view is CSRF-exempt.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import io
from collections.abc import Iterable
from typing import Any

from django.http import HttpRequest, HttpResponse
from dulwich.errors import GitProtocolError, HangupException
from dulwich.objects import ObjectID
from dulwich.refs import DictRefsContainer, Ref
from dulwich.repo import BaseRepo
from dulwich.server import Backend, BackendRepo, UploadPackHandler
from dulwich.web import GunzipFilter, HTTPGitApplication

from runtime_app.git import GitError, repo_open
from runtime_app.mirrors import BASELINE_REF, fetch_token
from search_app.models import Search

SERVICE = "git-upload-pack"
MAX_REQUEST_BYTES = 16 << 20  # a fetch's wants and haves; far more than a baseline fetch sends


class _OneRepoBackend(Backend):
    def __init__(self, repo: BackendRepo) -> None:
        self.repo = repo

    def open_repository(self, path: str) -> BackendRepo:
        return self.repo


def _presented_token(request: HttpRequest) -> str:
    """The token in the Authorization header (Basic password or Bearer), or ''."""
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return ""
        return decoded.partition(":")[2]
    return ""


def _text(status: int, message: str, **headers: str) -> HttpResponse:
    return HttpResponse(f"{message}\n", status=status, content_type="text/plain", headers=headers)


def _unauthorized() -> HttpResponse:
    return _text(401, "a valid fetch token for this search is required",
                 **{"WWW-Authenticate": 'Basic realm="Crucible git"'})


def git_respond(request: HttpRequest, search_id: str, rest: str) -> HttpResponse:
    """Answer one smart-HTTP request for a search's baseline (the view in views.py is this)."""
    if rest == "info/refs":
        if request.method != "GET":
            return _text(405, "GET only")
        if request.GET.get("service") != SERVICE:  # dumb HTTP, or receive-pack's advertisement
            return _text(403, f"only {SERVICE} is served here")
    elif rest == SERVICE:
        if request.method != "POST":
            return _text(405, "POST only")
    elif rest == "git-receive-pack":
        return _text(403, "read-only: pushing is refused")
    else:
        return _text(404, "not served: this endpoint speaks git smart HTTP upload-pack only")
    search = Search.objects.filter(search_id=search_id).only(
        "pk", "repository_path", "baseline_commit").first()
    presented = _presented_token(request)
    expected = fetch_token(search.pk) if search is not None else ""
    if search is None or not presented or not expected or not hmac.compare_digest(
            presented.encode(), expected.encode()):
        return _unauthorized()
    body = b""
    if request.method == "POST":
        body = request.read(MAX_REQUEST_BYTES + 1)
        if len(body) > MAX_REQUEST_BYTES:
            return _text(413, "request too large")
    try:
        real = repo_open(search.repository_path)
    except GitError:
        return _text(404, "the search's repository is not on this web node")
    try:
        if ObjectID(search.baseline_commit.encode()) not in real.object_store:
            return _text(404, "the search's baseline is no longer in its repository")
        return _serve(request, real, search.baseline_commit, rest, body)
    finally:
        real.close()


def _serve(request: HttpRequest, real: Any, commit: str, rest: str, body: bytes) -> HttpResponse:
    """Run dulwich's upload-pack over a view of the repository whose only ref is the baseline."""
    refs = DictRefsContainer({Ref(BASELINE_REF.encode()): commit.encode()})
    # dulwich types BaseRepo.object_store wider than its own BackendRepo asks; this one is a DiskObjectStore.
    app = HTTPGitApplication(_OneRepoBackend(BaseRepo(real.object_store, refs)))  # type: ignore[arg-type]
    app.handlers = {SERVICE.encode(): UploadPackHandler}  # not receive-pack, which dulwich adds by default
    environ = {
        "REQUEST_METHOD": request.method, "PATH_INFO": f"/{rest}",
        "QUERY_STRING": request.META.get("QUERY_STRING", ""),
        "CONTENT_TYPE": request.META.get("CONTENT_TYPE", ""), "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
    }
    encoding = request.headers.get("Content-Encoding", "")
    if encoding:
        environ["HTTP_CONTENT_ENCODING"] = encoding
    chunks: list[bytes] = []
    started: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started.update(status=int(status.split()[0]), headers=headers)
        return chunks.append

    result: Iterable[bytes] = GunzipFilter(app)(environ, start_response)
    try:
        for chunk in result:  # dulwich writes through start_response's callable as it iterates
            chunks.append(chunk)
    except (GitProtocolError, HangupException, OSError, EOFError) as error:  # a malformed request
        return _text(400, f"bad git request: {error}")
    response = HttpResponse(b"".join(chunks), status=started.get("status", 500))
    for name, value in started.get("headers", []):
        response[name] = value
    return response
