"""The size bounds of the sandboxd API, shared by the daemon and its clients.

Every field a caller sends has a bound the daemon checks before doing any work,
and every RPC has a largest request message: the transport refuses anything
bigger before it is parsed (``RESOURCE_EXHAUSTED``), so a careless or hostile
client cannot make the daemon hold more than these sizes per call. Sizes are in
bytes of UTF-8 (for strings) or of the serialised message.

A workspace's stored spec (its env and labels) stays within a few tens of KiB,
so a page of ``ListWorkspaces`` always fits one message.
"""

from __future__ import annotations

__all__ = [
    "MAX_CAPABILITIES",
    "MAX_COMMAND_BYTES",
    "MAX_EDIT_STRING_BYTES",
    "MAX_ENV_BYTES",
    "MAX_ENV_ENTRIES",
    "MAX_FORWARD_CHUNK_BYTES",
    "MAX_ID_BYTES",
    "MAX_IMAGE_REFERENCE_BYTES",
    "MAX_INPUT_BYTES",
    "MAX_LABELS",
    "MAX_LABELS_BYTES",
    "MAX_LABEL_VALUE_BYTES",
    "MAX_LIST_PAGE_SIZE",
    "MAX_MESSAGE_BYTES",
    "MAX_PATH_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_UPLOAD_CHUNK_BYTES",
    "MAX_URL_BYTES",
    "MAX_WORKSPACE_ENV_BYTES",
    "MAX_WRITE_BYTES",
    "request_limit",
    "utf8_size",
]

_KIB = 1024
_MIB = 1024 * 1024

MAX_COMMAND_BYTES = 120 * _KIB
"""Longest Exec command (it reaches the shell on a pipe; longer scripts belong in a file)."""

MAX_ENV_ENTRIES = 256
"""Most variables in one env map (a workspace's or a call's)."""

MAX_ENV_BYTES = 128 * _KIB
"""Most bytes of one call's env, names and values together (each entry also counts ``=``)."""

MAX_WORKSPACE_ENV_BYTES = 32 * _KIB
"""Most bytes of a workspace's env, names and values together: it is stored with the workspace."""

MAX_LABELS = 64
"""Most labels on a workspace, or in a label selector."""

MAX_LABEL_VALUE_BYTES = 1 * _KIB
"""Longest label value (keys are at most 128 characters)."""

MAX_LABELS_BYTES = 16 * _KIB
"""Most bytes of all labels (or a selector) together, keys and values."""

MAX_ID_BYTES = 64
"""Longest workspace or process id a request may name (real ones are shorter)."""

MAX_IMAGE_REFERENCE_BYTES = 512
"""Longest image reference."""

MAX_CAPABILITIES = 64
"""Most entries in ``security.added_capabilities`` (Linux has about 41)."""

MAX_PATH_BYTES = 4096
"""Longest path in the container (Linux's PATH_MAX)."""

MAX_URL_BYTES = 8 * _KIB
"""Longest ReadImage URL."""

MAX_INPUT_BYTES = 1 * _MIB
"""Most stdin bytes one Input call carries; larger data belongs in a file."""

MAX_WRITE_BYTES = 16 * _MIB
"""Largest WriteFile content, and the largest file EditFile edits (both hold the file whole);
larger files go through Upload and Download (tar streams, ``sandboxctl cp``)."""

MAX_EDIT_STRING_BYTES = 4 * _MIB
"""Longest EditFile ``old_string`` or ``new_string``."""

MAX_UPLOAD_CHUNK_BYTES = 1 * _MIB
"""Largest piece of an Upload stream in one message (the client splits bigger ones)."""

MAX_FORWARD_CHUNK_BYTES = 1 * _MIB
"""Largest piece of a ForwardPort stream in one message (the client splits bigger ones)."""

MAX_LIST_PAGE_SIZE = 1000
"""Most workspaces in one ListWorkspaces page (the default page is 100)."""

_ENVELOPE_BYTES = 64 * _KIB
"""Room for a request's small fields (ids, paths, options) beside its one large field."""

MAX_REQUEST_BYTES: dict[str, int] = {
    "CreateWorkspace": 4 * (MAX_WORKSPACE_ENV_BYTES + MAX_LABELS_BYTES) + _ENVELOPE_BYTES,
    "Exec": MAX_COMMAND_BYTES + 2 * MAX_ENV_BYTES + _ENVELOPE_BYTES,
    "Input": MAX_INPUT_BYTES + _ENVELOPE_BYTES,
    "WriteFile": MAX_WRITE_BYTES + _ENVELOPE_BYTES,
    "EditFile": 2 * MAX_EDIT_STRING_BYTES + _ENVELOPE_BYTES,
    "Upload": MAX_UPLOAD_CHUNK_BYTES + _ENVELOPE_BYTES,
    # A build's first message: its Dockerfile (at most a chunk's size), two commands and labels.
    "BuildTemplate": MAX_UPLOAD_CHUNK_BYTES + 2 * MAX_COMMAND_BYTES + MAX_LABELS_BYTES + _ENVELOPE_BYTES,
    "ForwardPort": MAX_FORWARD_CHUNK_BYTES + _ENVELOPE_BYTES,
}
"""Largest serialised request per RPC name; every other RPC takes at most ``_ENVELOPE_BYTES``.
The caps leave room above the field bounds, so that a field a little over its bound gets a
message naming the field rather than a refusal of the whole message."""

MAX_MESSAGE_BYTES = max(MAX_REQUEST_BYTES.values())
"""The transport's limit on any one request message: the largest legitimate request."""


def request_limit(rpc: str) -> int:
    """Largest serialised request of ``rpc`` (a method name such as ``Exec``), in bytes."""
    return MAX_REQUEST_BYTES.get(rpc, _ENVELOPE_BYTES)


def utf8_size(text: str) -> int:
    """Bytes of ``text`` as these bounds count them (UTF-8; a lone surrogate counts as 3)."""
    return len(text.encode("utf-8", "surrogatepass"))
