"""envd's ``EntryInfo`` for sandboxd's ``FileInfo``."""

from __future__ import annotations

import posixpath
import stat as stat_module

from protobuf.wkt.google.protobuf import timestamp_pb
from sandboxd_protocol.v1 import file_service_pb2 as fpb

from .envd.filesystem import filesystem_pb as efs

__all__ = ["entry_info"]

_TYPES = {
    fpb.FILE_TYPE_FILE: (efs.FileType.FILE, stat_module.S_IFREG),
    fpb.FILE_TYPE_DIRECTORY: (efs.FileType.DIRECTORY, stat_module.S_IFDIR),
    fpb.FILE_TYPE_SYMLINK: (efs.FileType.SYMLINK, stat_module.S_IFLNK),
}


def _absolute(link: str, target: str) -> str:
    """A link's target as envd gives it: an absolute path (a relative one is the link's directory's)."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(link), target))


def entry_info(info: fpb.FileInfo, *, target: fpb.FileInfo | None = None) -> efs.EntryInfo:
    """Envd's ``EntryInfo`` for a sandboxd ``FileInfo``.

    Args:
        info: the entry itself (a symlink not followed).
        target: for a symlink, what it points to: its type, size and mode are reported, as envd
            does, with ``is_symlink`` and ``symlink_target`` (absolute) saying it is a link.
    """
    shown = target if target is not None else info
    kind, bits = _TYPES.get(shown.type, (efs.FileType.UNSPECIFIED, 0))
    modified = timestamp_pb.Timestamp(seconds=shown.modify_time.seconds, nanos=shown.modify_time.nanos)
    is_link = info.type == fpb.FILE_TYPE_SYMLINK
    return efs.EntryInfo(
        name=info.name,
        type=kind,
        path=info.path,
        size=shown.size_bytes,
        mode=shown.mode,  # envd's mode is the permission bits; its permissions string has the type
        permissions=stat_module.filemode(shown.mode | bits),
        owner=shown.owner,
        group=shown.group,
        modified_time=modified,
        symlink_target=_absolute(info.path, info.link_target) if is_link else None,
        is_symlink=is_link,
    )
