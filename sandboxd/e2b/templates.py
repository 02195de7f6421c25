"""E2B's template builds (the protocol the ``e2b`` SDK 2.x's ``Template.build`` drives), on sandboxd's templates.

The SDK asks for a build (``POST /v3/templates``), uploads each COPY step's files as a tar
archive to the URL ``GET /templates/{id}/files/{hash}`` gives (unless the plane has them: the
hash names their content), starts the build with its steps (``POST
/v2/templates/{id}/builds/{buildID}``) and polls its status and log
(``GET .../builds/{buildID}/status?logsOffset=N``). Here the steps become a Dockerfile, the
uploads one build context, and the build is sandboxd's ``BuildTemplate``: a template is a
snapshot of the tenant's, so ``Sandbox.create(template=name)`` starts from it.

What a template built by E2B has, this one has too: the user ``user`` (created when the base
image lacks it) with its home ``/home/user``, where steps start; a RUN runs as the user of the
step (``root`` when asked), through ``/bin/sh -c``.

An upload URL is a capability: it names a random token the plane issued to one API key for
one hash, and it accepts at most the daemon's build context limit. Uploads are kept per key on
the daemon's disk for the plane's life.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import hashlib
import json
import re
import secrets
import shutil
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import structlog
from google.protobuf import duration_pb2
from sandboxd_protocol.v1 import workspace_service_pb2 as wpb
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..templates import BoundedTarInfo
from .control import Refused, rest_endpoint
from .gateway import Caller, Gateway

__all__ = ["TemplatePlane", "dockerfile_of"]

log = structlog.get_logger(__name__)

E2B_BASE_IMAGES = frozenset({"e2bdev/base", "e2bdev/base:latest", "e2bdev/code-interpreter:latest"})
"""Images the SDK names for E2B's own base (``Template().from_base_image()``): the plane's ``base``."""
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_HASH_RE = re.compile(r"^[0-9a-f]{64}$")
_MAX_STEPS = 1000
_MAX_ARG_BYTES = 64 * 1024
_PER_KEY = 100
"""Build records, and uploads asked for and not yet made, one API key may hold."""
_MAX_RECORDS = 2000
"""Build records, and uploads asked for and not yet made, the plane holds in all."""
_MAX_ENTRIES = 10_000
"""Log entries a build's record keeps (its last ones)."""
_MAX_LINE = 4096
_MAX_TAGS = 10
_TAG_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_MAX_SMALL_BODY = 64 * 1024
_MAX_BUILD_BODY = 8 * 1024 * 1024
_PAGE = 100
_CHUNK = 1 << 20
_UPLOAD_TTL_S = 3600.0
_E2B_HOME = "/home/user"
# Makes E2B's user where the base image lacks it: useradd (Debian, Ubuntu, Fedora), adduser (Alpine).
_ENSURE_USER = (
    "id -u user >/dev/null 2>&1 || useradd -m -d /home/user -s /bin/sh user 2>/dev/null "
    "|| adduser -D -h /home/user user; mkdir -p /home/user && chown user /home/user"
)


def _owner(caller: Caller) -> str:
    """Who a build or upload belongs to: a digest of the API key (the key itself is not kept)."""
    return hashlib.sha256(caller.token.encode()).hexdigest()


@dataclasses.dataclass
class _Build:
    template_id: str
    build_id: str
    owner: str
    tags: list[str]
    status: str = "waiting"
    entries: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    reason: dict[str, Any] | None = None
    task: asyncio.Task[None] | None = None
    finished: float = 0.0
    requested: float = dataclasses.field(default_factory=time.monotonic)
    skipped: int = 0
    """Log entries dropped from the front (the record keeps the last ``_MAX_ENTRIES``)."""

    def add(self, entry: dict[str, Any]) -> None:
        """Add a log entry, dropping the oldest past ``_MAX_ENTRIES``."""
        self.entries.append(entry)
        if len(self.entries) > _MAX_ENTRIES:
            drop = len(self.entries) - _MAX_ENTRIES
            del self.entries[:drop]
            self.skipped += drop


@dataclasses.dataclass(frozen=True)
class _Upload:
    owner: str
    files_hash: str
    expires: float


def _entry(message: str, level: str = "info", step: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
        "level": level,
        "message": message,
    }
    if step is not None:
        entry["step"] = step
    return entry


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value.encode()) > _MAX_ARG_BYTES or "\x00" in value:
        raise Refused(400, f"{what} must be a string of at most {_MAX_ARG_BYTES} bytes with no NUL")
    return value


def _line(value: object, what: str) -> str:
    text = _text(value, what)
    if "\n" in text or "\r" in text:
        raise Refused(400, f"{what} must be one line")
    return text


def _quoted(value: str) -> str:
    """A Dockerfile word in double quotes (ENV, WORKDIR, USER, COPY's paths)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dockerfile_of(body: dict[str, Any], base_image: str) -> tuple[str, list[str], dict[int, str]]:
    """The Dockerfile of a build's steps, the upload hashes it copies from, and which E2B step each Dockerfile step is.

    ``body`` is the SDK's ``TemplateBuildStartV2``. COPY steps copy from ``<filesHash>/<src>`` of
    the context (each upload unpacked under its hash). E2B's steps are named ``"1"`` onwards
    (``"base"`` is the start); the map takes a Dockerfile step (from 1) to the E2B step it serves.

    Raises:
        Refused: 400 for a step this plane cannot express or a malformed one.
    """
    from_image, from_template = body.get("fromImage"), body.get("fromTemplate")
    if bool(from_image) == bool(from_template):
        raise Refused(400, "exactly one of fromImage and fromTemplate must be given")
    if from_template:
        if from_template != "base":
            raise Refused(400, f"fromTemplate {from_template!r}: only E2B's 'base' can be built from here")
        image = base_image
    else:
        image = _line(from_image, "fromImage")
        image = base_image if image in E2B_BASE_IMAGES else image
    if body.get("fromImageRegistry"):
        raise Refused(400, "fromImageRegistry: sandboxd builds from images its engine has; no registry is used")
    steps = body.get("steps") or []
    if not isinstance(steps, list) or len(steps) > _MAX_STEPS:
        raise Refused(400, f"steps must be a list of at most {_MAX_STEPS}")
    user = "user"
    lines = [f"FROM {image}", "USER root", f"RUN {json.dumps(['/bin/sh', '-c', _ENSURE_USER])}"]
    lines += [f"USER {user}", f"WORKDIR {_E2B_HOME}"]
    # Dockerfile steps are numbered from 1 (FROM); these first ones are E2B's base step.
    owner = dict.fromkeys(range(1, len(lines) + 1), "base")
    hashes: list[str] = []

    def add(text: str, step: str) -> None:
        lines.append(text)
        owner[len(lines)] = step

    for index, step in enumerate(steps, start=1):
        if not isinstance(step, dict):
            raise Refused(400, f"step {index} must be an object")
        kind = step.get("type")
        args = step.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise Refused(400, f"step {index}'s args must be a list of strings")
        name = str(index)
        if kind == "RUN":
            if not args:
                raise Refused(400, f"step {index}: RUN needs a command")
            command = _text(args[0], f"step {index}'s command")
            run_as = _line(args[1], f"step {index}'s user") if len(args) > 1 and args[1] else ""
            if run_as:
                add(f"USER {_quoted(run_as)}", name)
            add(f"RUN {json.dumps(['/bin/sh', '-c', command])}", name)
            if run_as:
                add(f"USER {_quoted(user)}", name)
        elif kind == "COPY":
            files_hash = step.get("filesHash")
            if not isinstance(files_hash, str) or not _HASH_RE.fullmatch(files_hash) or len(args) < 2:
                raise Refused(400, f"step {index}: COPY needs a source, a destination and its filesHash")
            src = _line(args[0], f"step {index}'s source")
            while src.startswith("./"):
                src = src[2:]
            src = src or "."
            dest = _line(args[1], f"step {index}'s destination")
            owner_of = _line(args[2], f"step {index}'s user") if len(args) > 2 and args[2] else ""
            mode = args[3] if len(args) > 3 else ""
            if mode and not re.fullmatch(r"[0-7]{3,4}", mode):
                raise Refused(400, f"step {index}: mode {mode!r} is not octal")
            if ".." in Path(src).parts or src.startswith("/"):
                raise Refused(400, f"step {index}: the source {src!r} must be inside the context")
            hashes.append(files_hash)
            chown = f"--chown={_quoted(owner_of)} " if owner_of else ""
            add(f"COPY {chown}{json.dumps([f'{files_hash}/{src}', dest])}", name)
            if mode:
                # The engine's builder has no COPY --chmod: the mode is set as root once copied.
                target = dest + Path(src).name if dest.endswith("/") and "*" not in src else dest
                add("USER root", name)
                add(f"RUN {json.dumps(['chmod', '-R', mode, target])}", name)
                add(f"USER {_quoted(user)}", name)
        elif kind == "ENV":
            if not args or len(args) % 2:
                raise Refused(400, f"step {index}: ENV needs key, value pairs")
            pairs = [
                f"{_line(args[i], f'step {index} key')}={_quoted(_line(args[i + 1], f'step {index} value'))}"
                for i in range(0, len(args), 2)
            ]
            if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", p, re.DOTALL) for p in pairs):
                raise Refused(400, f"step {index}: ENV keys must be names")
            add("ENV " + " ".join(pairs), name)
        elif kind == "WORKDIR":
            if not args:
                raise Refused(400, f"step {index}: WORKDIR needs a path")
            add(f"WORKDIR {_quoted(_line(args[0], f'step {index} path'))}", name)
        elif kind == "USER":
            if not args:
                raise Refused(400, f"step {index}: USER needs a user")
            user = _line(args[0], f"step {index} user")
            add(f"USER {_quoted(user)}", name)
        else:
            raise Refused(
                400, f"step {index}: {kind!r} is not a step this plane builds (RUN, COPY, ENV, WORKDIR, USER)"
            )
    by_step = {number: owner.get(number, "finalize") for number in range(1, len(lines) + 1)}
    return "\n".join(lines) + "\n", hashes, by_step


class TemplatePlane:
    """The template routes' state: uploads kept per key, builds in flight and their logs.

    Args:
        gateway: sandboxd's services.
        base_image: the image of E2B's ``base`` template.
        max_upload_bytes: the largest upload (and build context) accepted, in bytes.
    """

    def __init__(self, gateway: Gateway, *, base_image: str, max_upload_bytes: int) -> None:
        self.gateway = gateway
        self.base_image = base_image
        self.max_upload_bytes = max_upload_bytes
        self._dir = Path(tempfile.mkdtemp(prefix="sandboxd-e2b-uploads-"))
        self._uploads: dict[str, _Upload] = {}
        self._builds: dict[str, _Build] = {}

    def close(self) -> None:
        """Stop the builds in flight and remove the uploads."""
        for build in self._builds.values():
            if build.task is not None:
                build.task.cancel()
        shutil.rmtree(self._dir, ignore_errors=True)

    def routes(self) -> list[Route]:
        """The routes (the upload's is keyed by its URL's token, not by an API key)."""

        def route(path: str, handler: Any, method: str) -> Route:
            return Route(path, rest_endpoint(handler, self.gateway), methods=[method])

        return [
            route("/v3/templates", self.request_build, "POST"),
            route("/templates/{template_id}/files/{files_hash}", self.file_link, "GET"),
            route("/v2/templates/{template_id}/builds/{build_id}", self.start_build, "POST"),
            route("/templates/{template_id}/builds/{build_id}/status", self.build_status, "GET"),
            route("/templates/aliases/{alias}", self.alias, "GET"),
            Route("/_sandboxd/template-uploads/{token}", self.upload, methods=["PUT"]),
        ]

    def _path(self, owner: str, files_hash: str) -> Path:
        return self._dir / f"{owner[:32]}-{files_hash}.tar"

    async def request_build(self, request: Request, gateway: Gateway, caller: Caller) -> Response:
        """``POST /v3/templates``: a build id for ``name`` (its template id); 202."""
        body = await _bounded_json(request, _MAX_SMALL_BODY)
        name = body.get("name") or body.get("alias")
        if not isinstance(name, str):
            raise Refused(400, "name must be a string")
        name, _, tag = name.partition(":")
        if not _NAME_RE.fullmatch(name) or ".." in name:
            raise Refused(
                400,
                f"template name {name[:80]!r}: 1-63 lowercase letters, digits, '.', '_' or '-' from a letter or digit",
            )
        tags = body.get("tags") or ([tag] if tag else ["default"])
        if not isinstance(tags, list) or len(tags) > _MAX_TAGS or not all(_TAG_RE.fullmatch(str(t)) for t in tags):
            raise Refused(
                400, f"tags must be a list of at most {_MAX_TAGS} names of 1-128 letters, digits, '.', '_', '-'"
            )
        await self._check_key(gateway, caller, name)
        build = _Build(template_id=name, build_id=secrets.token_hex(16), owner=_owner(caller), tags=tags)
        self._keep(build)
        return JSONResponse(
            {
                "templateID": name,
                "buildID": build.build_id,
                "public": False,
                "names": [name],
                "tags": tags,
                "aliases": [name],
            },
            status_code=202,
        )

    def _keep(self, build: _Build) -> None:
        """Keep ``build``'s record: at most ``_PER_KEY`` a key, their oldest ended (or never started) going first."""
        now = time.monotonic()
        for stale in [b for b in self._builds.values() if b.task is None and now - b.requested > _UPLOAD_TTL_S]:
            del self._builds[stale.build_id]
        mine = [b for b in self._builds.values() if b.owner == build.owner]
        if len(mine) >= _PER_KEY:
            gone = sorted((b for b in mine if b.finished or b.task is None), key=lambda b: b.finished or b.requested)
            for old in gone[: len(mine) - _PER_KEY + 1]:
                del self._builds[old.build_id]
            if len(mine) - len(gone[: len(mine) - _PER_KEY + 1]) >= _PER_KEY:
                raise Refused(429, f"this key has {_PER_KEY} template builds running; try again once some end")
        if len(self._builds) >= _MAX_RECORDS:
            # Keys without a tokens file are any string: the table as a whole is bounded too.
            ended = sorted((b for b in self._builds.values() if b.finished), key=lambda b: b.finished)
            for old in ended[: len(self._builds) - _MAX_RECORDS + 1]:
                del self._builds[old.build_id]
            if len(self._builds) >= _MAX_RECORDS:
                raise Refused(429, f"{_MAX_RECORDS} template builds are running; try again once some end")
        self._builds[build.build_id] = build

    async def file_link(self, request: Request, gateway: Gateway, caller: Caller) -> Response:
        """``GET /templates/{id}/files/{hash}``: whether the plane has those files, and where to upload them; 201."""
        files_hash = request.path_params["files_hash"]
        if not _HASH_RE.fullmatch(files_hash):
            raise Refused(400, "the files hash must be 64 lowercase hex digits")
        await self._check_key(gateway, caller, request.path_params["template_id"])
        owner = _owner(caller)
        now = time.monotonic()
        self._uploads = {t: u for t, u in self._uploads.items() if u.expires > now}
        if (
            len([u for u in self._uploads.values() if u.owner == owner]) >= _PER_KEY
            or len(self._uploads) >= _MAX_RECORDS
        ):
            raise Refused(429, f"this key has {_PER_KEY} uploads asked for and not made; make them or wait an hour")
        if self._path(owner, files_hash).exists():
            return JSONResponse({"present": True}, status_code=201)
        token = secrets.token_urlsafe(32)
        self._uploads[token] = _Upload(owner=owner, files_hash=files_hash, expires=now + _UPLOAD_TTL_S)
        url = str(request.base_url).rstrip("/") + f"/_sandboxd/template-uploads/{token}"
        return JSONResponse({"present": False, "url": url}, status_code=201)

    async def upload(self, request: Request) -> Response:
        """``PUT`` to an upload URL: the files' tar archive (gzipped or not), bounded before it is read."""
        upload = self._uploads.pop(request.path_params["token"], None)
        if upload is None or upload.expires < time.monotonic():
            return JSONResponse({"code": 404, "message": "no such upload (or it expired)"}, status_code=404)
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_upload_bytes):
            return JSONResponse(
                {"code": 413, "message": f"an upload may be at most {self.max_upload_bytes} bytes"}, status_code=413
            )
        target = self._path(upload.owner, upload.files_hash)
        partial = target.with_suffix(f".{secrets.token_hex(4)}.part")
        size = 0
        try:
            with partial.open("wb") as out:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > self.max_upload_bytes:
                        return JSONResponse(
                            {"code": 413, "message": f"an upload may be at most {self.max_upload_bytes} bytes"},
                            status_code=413,
                        )
                    await asyncio.to_thread(out.write, chunk)
            if not await asyncio.to_thread(_readable_tar, partial, self.max_upload_bytes):
                return JSONResponse(
                    {"code": 400, "message": "the upload is not a tar archive within the limits"}, status_code=400
                )
            partial.replace(target)
            await asyncio.to_thread(self._trim, upload.owner, target)
        finally:
            partial.unlink(missing_ok=True)
        return Response(status_code=200)

    def _trim(self, owner: str, kept: Path) -> None:
        """Keep a key's uploads within the upload limit, and all of them within four: the oldest go first.

        ``kept`` (the upload just made) stays.
        """
        for pattern, limit in ((f"{owner[:32]}-*.tar", self.max_upload_bytes), ("*.tar", 4 * self.max_upload_bytes)):
            paths = sorted(self._dir.glob(pattern), key=lambda path: path.stat().st_mtime)
            total = sum(path.stat().st_size for path in paths)
            for path in paths:
                if total <= limit:
                    break
                if path != kept:
                    total -= path.stat().st_size
                    path.unlink(missing_ok=True)

    async def _check_key(self, gateway: Gateway, caller: Caller, name: str) -> None:
        """Refuse a request whose key the daemon does not take (401), as every other route does by calling it."""
        try:
            await gateway.workspaces.GetSnapshot(wpb.GetSnapshotRequest(name=name[:63]), metadata=caller.metadata())
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise
            # Anything else (no such template, a name that cannot be one) means the key was taken.

    async def start_build(self, request: Request, gateway: Gateway, caller: Caller) -> Response:
        """``POST /v2/templates/{id}/builds/{buildID}``: the steps; the build runs in the background; 202."""
        build = self._own(request, caller)
        if build.status != "waiting":
            raise Refused(409, f"build {build.build_id} was started already")
        build.status = "building"  # claimed before its body is read: a second start is a 409
        try:
            body, dockerfile, hashes, by_step = await self._start_of(request, build)
        except BaseException:
            build.status = "waiting"
            raise
        build.task = asyncio.create_task(
            self._run(build, caller, dockerfile, hashes, by_step, body), name=f"e2b-build-{build.build_id}"
        )
        return Response(status_code=202)

    async def _start_of(self, request: Request, build: _Build) -> tuple[dict[str, Any], str, list[str], dict[int, str]]:
        """A build start's body, its Dockerfile, the uploads it copies from and its step map; 400 when bad."""
        body = await _bounded_json(request, _MAX_BUILD_BODY)
        dockerfile, hashes, by_step = dockerfile_of(body, self.base_image)
        missing = [h for h in hashes if not self._path(build.owner, h).exists()]
        if missing:
            raise Refused(400, f"the files of hash {missing[0]} were not uploaded")
        for field in ("startCmd", "readyCmd"):
            if body.get(field) is not None:
                _text(body[field], field)
        return body, dockerfile, hashes, by_step

    def _own(self, request: Request, caller: Caller) -> _Build:
        build = self._builds.get(request.path_params["build_id"])
        if build is None or build.owner != _owner(caller) or build.template_id != request.path_params["template_id"]:
            raise Refused(404, f"build {request.path_params['build_id'][:80]} was not found")
        return build

    async def _run(
        self,
        build: _Build,
        caller: Caller,
        dockerfile: str,
        hashes: list[str],
        by_step: dict[int, str],
        body: dict[str, Any],
    ) -> None:
        step = "base"
        try:
            with tempfile.TemporaryDirectory(prefix="sandboxd-e2b-context-") as scratch:
                context = Path(scratch) / "context.tar"
                await asyncio.to_thread(
                    _merge,
                    [(h, self._path(build.owner, h)) for h in dict.fromkeys(hashes)],
                    context,
                    self.max_upload_bytes,
                )
                first = wpb.TemplateBuild(
                    name=build.template_id,
                    dockerfile=dockerfile,
                    start_command=body.get("startCmd") or "",
                    ready_command=body.get("readyCmd") or "",
                    force=bool(body.get("force")),
                    timeout=duration_pb2.Duration(seconds=0),
                )
                call = self.gateway.workspaces.BuildTemplate(_requests(first, context), metadata=caller.metadata())
                async for event in call:
                    if event.HasField("log"):
                        step = by_step.get(event.log.step, step) if event.log.step else step
                        build.add(_entry(event.log.text[:_MAX_LINE], step=step))
                    else:
                        cached = " (cached: built from this content already)" if event.cached else ""
                        build.add(_entry(f"Template {build.template_id} is ready{cached}"))
                        build.status = "ready"
        except grpc.aio.AioRpcError as exc:
            message = exc.details() or exc.code().name.lower()
            found = re.search(r"\bstep (\d+)\b", message)
            if found:
                step = by_step.get(int(found.group(1)), step)
            build.add(_entry(message, level="error", step=step))
            build.reason = {"message": message, "step": step}
            build.status = "error"
        except Exception as exc:
            log.exception("e2b.template_build_failed", template=build.template_id)
            build.reason = {"message": f"the build failed: {exc}", "step": step}
            build.status = "error"
        finally:
            if build.status not in ("ready", "error"):
                build.reason = build.reason or {"message": "the build ended without its template", "step": step}
                build.status = "error"
            build.finished = time.monotonic()

    async def build_status(self, request: Request, gateway: Gateway, caller: Caller) -> Response:
        """``GET .../builds/{buildID}/status?logsOffset=N``: the status and up to 100 log entries from N."""
        build = self._own(request, caller)
        try:
            offset = max(0, int(request.query_params.get("logsOffset", "0")))
        except ValueError:
            raise Refused(400, "logsOffset must be a whole number") from None
        # The record keeps a build's last lines: an offset before them starts at the first kept.
        start = max(0, offset - build.skipped)
        entries = build.entries[start : start + _PAGE]
        answer: dict[str, Any] = {
            "templateID": build.template_id,
            "buildID": build.build_id,
            "status": build.status,
            "logs": [],
            "logEntries": entries,
        }
        if build.reason is not None:
            answer["reason"] = {**build.reason, "logEntries": [e for e in build.entries if e["level"] == "error"][-10:]}
        return JSONResponse(answer)

    async def alias(self, request: Request, gateway: Gateway, caller: Caller) -> Response:
        """``GET /templates/aliases/{alias}``: 200 when the caller has a template of that name, else 404."""
        name = request.path_params["alias"].partition(":")[0]
        try:
            await gateway.workspaces.GetSnapshot(wpb.GetSnapshotRequest(name=name), metadata=caller.metadata())
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                raise Refused(404, f"template {name[:80]!r} was not found") from None
            raise
        return JSONResponse({"templateID": name, "public": False})


def _readable_tar(path: Path, limit: int) -> bool:
    """Whether ``path`` is a tar archive (gzipped or not) whose members hold at most ``limit`` bytes in all."""
    total = 0
    try:
        with tarfile.open(path, "r:*", tarinfo=BoundedTarInfo) as tar:
            for member in tar:
                total += member.size
                if total > limit:
                    return False
    except (tarfile.TarError, OSError, EOFError):
        return False
    return True


def _merge(uploads: list[tuple[str, Path]], out: Path, limit: int) -> None:
    """One uncompressed tar: each upload's members under ``<hash>/``, links kept inside it, at most ``limit`` bytes.

    A member named outside its upload (absolute, or through ``..``), a device and a link that
    points outside are left out: the context holds only what the upload itself describes.
    """
    total = 0
    with tarfile.open(out, "w") as merged:
        for files_hash, path in uploads:
            with tarfile.open(path, "r:*", tarinfo=BoundedTarInfo) as tar:
                for member in tar:
                    name = member.name.lstrip("/")
                    parts = Path(name).parts
                    if not name or ".." in parts or member.isdev() or member.isfifo():
                        continue
                    if (member.issym() or member.islnk()) and (
                        member.linkname.startswith("/") or ".." in Path(member.linkname).parts
                    ):
                        continue
                    total += member.size
                    if total > limit:
                        msg = f"the build's files are past the limit of {limit} bytes"
                        raise ValueError(msg)
                    copy = member.replace(name=f"{files_hash}/{name}", deep=False)
                    if member.islnk():
                        copy = copy.replace(linkname=f"{files_hash}/{member.linkname}", deep=False)
                    merged.addfile(copy, tar.extractfile(member) if member.isfile() else None)


async def _bounded_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, read only up to ``limit`` bytes (413 past them)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Refused(413, f"the request body may be at most {limit} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise Refused(413, f"the request body may be at most {limit} bytes")
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        raise Refused(400, "the request body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "the request body must be a JSON object")
    return body


async def _requests(first: wpb.TemplateBuild, context: Path) -> AsyncIterator[wpb.BuildTemplateRequest]:
    yield wpb.BuildTemplateRequest(build=first)
    with context.open("rb") as data:
        while chunk := await asyncio.to_thread(data.read, _CHUNK):
            yield wpb.BuildTemplateRequest(context_chunk=chunk)
