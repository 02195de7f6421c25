"""envd's HTTP routes: ``GET``/``POST /files`` (one file's bytes) and ``/health``.

Errors are envd's shape, ``{"code": HTTP_STATUS, "message": TEXT}`` (``spec/envd/envd.yaml``),
with the statuses the SDK maps to its exceptions: 400 invalid, 401 unauthenticated, 404 not
found, 507 no space.
"""

from __future__ import annotations

import asyncio
import posixpath
import tarfile
import tempfile
import zlib
from collections.abc import AsyncIterator
from typing import IO, Any

import grpc
from sandboxd_protocol.v1 import file_service_pb2 as fpb
from sandboxd_protocol.v1 import workspace_service_pb2 as wpb
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .gateway import Caller, Gateway, http_status
from .tarstream import NotAFileError, file_archive, file_content

__all__ = ["MAX_UPLOAD_BYTES", "file_routes"]

# One uploaded file is spooled (its size goes in the tar header before its bytes): in memory up
# to 1 MiB, then on the daemon's disk, up to this much.
MAX_UPLOAD_BYTES = 1024 * 1024 * 1024
_SPOOL_MEMORY = 1024 * 1024
_FORM_SLACK = 64 * 1024  # a form's boundaries and part headers around the file
# Uploads spooled at once (each to 1 GiB of the daemon's disk); more wait their turn.
_SPOOLING = asyncio.Semaphore(4)
_CHUNK = 256 * 1024


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _rpc_error(exc: grpc.aio.AioRpcError) -> JSONResponse:
    detail = exc.details() or exc.code().name.lower()
    status = 507 if "no space" in detail.lower() else http_status(exc)
    return _error(status, detail)


def _caller(request: Request) -> tuple[str, Caller]:
    sandbox = request.headers.get("e2b-sandbox-id", "").strip()
    token = (request.headers.get("x-access-token") or request.headers.get("x-api-key") or "").strip()
    return sandbox, Caller(token=token)


async def download(request: Request, gateway: Gateway) -> Response:
    """``GET /files?path=P``: the file's bytes (a final symlink followed), streamed."""
    sandbox, caller = _caller(request)
    path = request.query_params.get("path", "")
    if not sandbox or not path:
        return _error(400, "the E2b-Sandbox-Id header and the path parameter are required")
    path = await gateway.resolve(sandbox, caller, path)
    call = gateway.files.Download(
        fpb.DownloadRequest(workspace_id=sandbox, path=path, follow_symlinks=True), metadata=caller.metadata()
    )

    async def archive() -> AsyncIterator[bytes]:
        async for reply in call:
            yield reply.chunk

    try:
        size, content = await file_content(archive())
    except grpc.aio.AioRpcError as exc:
        return _rpc_error(exc)
    except NotAFileError as exc:
        call.cancel()
        return _error(400, f"{path}: {exc}")

    async def body() -> AsyncIterator[bytes]:
        try:
            async for piece in content:
                yield piece
        finally:
            call.cancel()

    return StreamingResponse(body(), media_type="application/octet-stream", headers={"Content-Length": str(size)})


class _TooLarge(Exception):
    pass


def _too_large() -> JSONResponse:
    return _error(413, f"a file is over the {MAX_UPLOAD_BYTES} bytes one upload may carry")


async def _spool(chunks: AsyncIterator[bytes], *, gzipped: bool) -> IO[bytes]:
    spooled: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY)  # noqa: SIM115 - returned
    inflate = zlib.decompressobj(wbits=31) if gzipped else None
    size = 0

    def keep(data: bytes) -> None:
        nonlocal size
        size += len(data)
        if size > MAX_UPLOAD_BYTES:
            spooled.close()
            raise _TooLarge
        spooled.write(data)

    async for chunk in chunks:
        if inflate is None:
            keep(chunk)
            continue
        # Inflated a piece at a time, the loop turning between pieces: a small body that inflates
        # to a gigabyte neither stalls other requests nor passes the bound unseen.
        pending = chunk
        while pending:
            keep(inflate.decompress(pending, _CHUNK))
            pending = inflate.unconsumed_tail
            await asyncio.sleep(0)
    if inflate is not None:
        keep(inflate.flush())
    spooled.seek(0)
    return spooled


async def _read(spooled: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := spooled.read(_CHUNK):
        yield chunk


async def _upload(gateway: Gateway, caller: Caller, sandbox: str, path: str, spooled: IO[bytes]) -> dict[str, Any]:
    path = await gateway.resolve(sandbox, caller, path)
    directory, name = posixpath.split(path.rstrip("/"))
    if not name:
        msg = f"{path!r} names no file"
        raise ValueError(msg)
    size = spooled.seek(0, 2)
    spooled.seek(0)

    async def requests() -> AsyncIterator[fpb.UploadRequest]:
        yield fpb.UploadRequest(target=fpb.UploadTarget(workspace_id=sandbox, path=directory or "."))
        async for piece in file_archive(name, size, _read(spooled)):
            yield fpb.UploadRequest(chunk=piece)

    await gateway.files.Upload(requests(), metadata=caller.metadata())
    stat = await gateway.files.Stat(fpb.StatRequest(workspace_id=sandbox, path=path), metadata=caller.metadata())
    return {"name": stat.info.name, "type": "file", "path": stat.info.path}


async def upload(request: Request, gateway: Gateway) -> Response:
    """``POST /files``: write one file or more; 200 and what was written.

    The body is multipart parts named ``file`` (each its filename's path, or ``path`` when there
    is one), or one ``application/octet-stream`` body (gzip allowed) for ``path``. Returns 200
    and ``[{"name", "type": "file", "path"}]``, one per file written.
    """
    sandbox, caller = _caller(request)
    path = request.query_params.get("path", "")
    if not sandbox:
        return _error(400, "the E2b-Sandbox-Id header is required")
    try:
        # Who asks, and for which of their sandboxes, before a byte of the body is read.
        await gateway.workspace(sandbox, caller)
    except grpc.aio.AioRpcError as exc:
        return _rpc_error(exc)
    async with _SPOOLING:
        return await _receive(request, gateway, sandbox, caller, path)


async def _receive(request: Request, gateway: Gateway, sandbox: str, caller: Caller, path: str) -> Response:
    written = []
    try:
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            # The form is spooled whole before its parts are read: its size is bounded first.
            length = request.headers.get("content-length", "")
            if not length.isdigit():
                return _error(411, "a multipart upload needs a Content-Length")
            if int(length) > MAX_UPLOAD_BYTES + _FORM_SLACK:
                return _too_large()
            async with request.form(max_files=1000) as form:
                parts = [part for part in form.getlist("file") if isinstance(part, UploadFile)]
                if not parts:
                    return _error(400, "the form has no part named file")
                for part in parts:
                    target = path if path and len(parts) == 1 else part.filename or ""
                    if not target:
                        return _error(400, "a part has no filename and no path was given")
                    part.file.seek(0, 2)
                    if part.file.tell() > MAX_UPLOAD_BYTES:
                        return _too_large()
                    written.append(await _upload(gateway, caller, sandbox, target, part.file))
        else:
            if not path:
                return _error(400, "the path parameter is required")
            gzipped = request.headers.get("content-encoding", "").lower() == "gzip"
            spooled = await _spool(request.stream(), gzipped=gzipped)
            with spooled:
                written.append(await _upload(gateway, caller, sandbox, path, spooled))
    except grpc.aio.AioRpcError as exc:
        return _rpc_error(exc)
    except _TooLarge:
        return _too_large()
    except (ValueError, zlib.error) as exc:
        return _error(400, str(exc))
    except tarfile.TarError as exc:
        return _error(400, str(exc))
    return JSONResponse(written)


async def health(request: Request, gateway: Gateway) -> Response:
    """``GET /health``: 204 while the sandbox runs; 502 "was not found" (the SDK's not running) else."""
    sandbox, caller = _caller(request)
    if not sandbox:
        return Response(status_code=204)  # the plane itself answers
    try:
        workspace = await gateway.workspace(sandbox, caller)
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
            return _error(502, f"the sandbox {sandbox} was not found")
        return _rpc_error(exc)
    if workspace.state != wpb.WORKSPACE_STATE_RUNNING:
        return _error(502, f"the sandbox {sandbox} was not found running")
    return Response(status_code=204)


def file_routes(gateway: Gateway) -> list[Route]:
    """The envd HTTP routes."""

    async def get(request: Request) -> Response:
        return await download(request, gateway)

    async def post(request: Request) -> Response:
        return await upload(request, gateway)

    async def healthy(request: Request) -> Response:
        return await health(request, gateway)

    return [
        Route("/files", get, methods=["GET"]),
        Route("/files", post, methods=["POST"]),
        Route("/health", healthy, methods=["GET"]),
    ]
