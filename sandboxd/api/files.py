"""FileService servicer: proto in, domain call, proto out."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator

from google.protobuf import timestamp_pb2
from sandboxd_protocol.v1 import file_service_pb2 as fpb
from sandboxd_protocol.v1 import file_service_pb2_grpc as fgrpc

from ..audit import audit_fields
from ..errors import InvalidSpecError
from ..fileops import Entry
from ..files import FileManager
from ._types import Context

__all__ = ["FileServicer"]

_TYPES = {
    "file": fpb.FILE_TYPE_FILE,
    "directory": fpb.FILE_TYPE_DIRECTORY,
    "symlink": fpb.FILE_TYPE_SYMLINK,
    "other": fpb.FILE_TYPE_OTHER,
}


def _info(entry: Entry) -> fpb.FileInfo:
    modified = timestamp_pb2.Timestamp()
    modified.FromDatetime(datetime.datetime.fromtimestamp(entry.mtime, tz=datetime.UTC))
    return fpb.FileInfo(
        name=entry.name,
        path=entry.path,
        type=_TYPES.get(entry.type, fpb.FILE_TYPE_OTHER),
        size_bytes=entry.size,
        mode=entry.mode,
        modify_time=modified,
        link_target=entry.target,
        owner=entry.owner,
        group=entry.group,
    )


class FileServicer(fgrpc.FileServiceServicer):
    """Serves ``sandboxd.v1.FileService``."""

    def __init__(self, files: FileManager) -> None:
        """Serve ``files``."""
        self.files = files

    async def ReadFile(self, request: fpb.ReadFileRequest, context: Context) -> fpb.ReadFileResponse:
        """A page of a text file in cat -n form."""
        path, page = await self.files.read_file(
            request.workspace_id, request.path, offset=request.offset, limit=request.limit
        )
        return fpb.ReadFileResponse(
            content=page.content,
            total_lines=page.total_lines,
            first_line=page.first_line,
            line_count=page.line_count,
            next_offset=page.next_offset,
            lines_truncated=page.lines_truncated,
            path=path,
        )

    async def EditFile(self, request: fpb.EditFileRequest, context: Context) -> fpb.EditFileResponse:
        """Replace an exact string; answer with the diff."""
        path, outcome = await self.files.edit_file(
            request.workspace_id, request.path, request.old_string, request.new_string, replace_all=request.replace_all
        )
        return fpb.EditFileResponse(
            message=outcome.message, replacements=outcome.replacements, diff=outcome.diff, path=path
        )

    async def WriteFile(self, request: fpb.WriteFileRequest, context: Context) -> fpb.WriteFileResponse:
        """Create or overwrite a file atomically."""
        path, outcome = await self.files.write_file(request.workspace_id, request.path, request.content)
        return fpb.WriteFileResponse(
            message=outcome.message,
            created=outcome.created,
            size_bytes=outcome.size_bytes,
            line_count=outcome.line_count,
            diff=outcome.diff,
            path=path,
        )

    async def ListDir(self, request: fpb.ListDirRequest, context: Context) -> fpb.ListDirResponse:
        """List a directory."""
        path, entries = await self.files.list_dir(request.workspace_id, request.path)
        return fpb.ListDirResponse(entries=[_info(e) for e in entries], path=path)

    async def Stat(self, request: fpb.StatRequest, context: Context) -> fpb.StatResponse:
        """Describe one path."""
        entry = await self.files.stat(request.workspace_id, request.path, follow=request.follow_symlinks)
        return fpb.StatResponse(info=_info(entry))

    async def Remove(self, request: fpb.RemoveRequest, context: Context) -> fpb.RemoveResponse:
        """Delete a path."""
        path = await self.files.remove(request.workspace_id, request.path, recursive=request.recursive)
        return fpb.RemoveResponse(path=path)

    async def Move(self, request: fpb.MoveRequest, context: Context) -> fpb.MoveResponse:
        """Rename a path."""
        path = await self.files.move(
            request.workspace_id, request.source_path, request.destination_path, overwrite=request.overwrite
        )
        return fpb.MoveResponse(path=path)

    async def Upload(self, request_iterator: AsyncIterator[fpb.UploadRequest], context: Context) -> fpb.UploadResponse:
        """Extract a tar stream; the first message names the target."""
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("content") != "target":
            msg = "the first Upload message must carry the target"
            raise InvalidSpecError(msg)

        async def chunks() -> AsyncIterator[bytes]:
            async for message in request_iterator:
                if message.WhichOneof("content") != "chunk":
                    msg = "only the first Upload message may carry a target"
                    raise InvalidSpecError(msg)
                yield message.chunk

        audit_fields(workspace_id=first.target.workspace_id, path=first.target.path)
        path, result = await self.files.upload(first.target.workspace_id, first.target.path, chunks())
        return fpb.UploadResponse(entry_count=result.entries, size_bytes=result.size, path=path)

    async def Download(self, request: fpb.DownloadRequest, context: Context) -> AsyncIterator[fpb.DownloadResponse]:
        """Stream a tar archive of a path."""
        async for chunk in self.files.download(request.workspace_id, request.path, follow=request.follow_symlinks):
            yield fpb.DownloadResponse(chunk=chunk)

    async def ReadImage(self, request: fpb.ReadImageRequest, context: Context) -> fpb.ReadImageResponse:
        """An image's bytes, type and size."""
        image = await self.files.read_image(request.workspace_id, request.source)
        return fpb.ReadImageResponse(data=image.data, mime_type=image.mime_type, width=image.width, height=image.height)
