"""Running sandboxd's own stdlib-only scripts inside a workspace container.

Both the process supervisor (``supervisor.py``) and the file operations
(``fileops.py``) are sent with each ``docker exec`` as ``python3 -I -S -c``:
isolated mode ignores the user's ``PYTHON*`` variables and ``site``, so nothing
in the workspace can change how they run.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from collections.abc import Mapping
from typing import Any

from .errors import FailedPreconditionError, InvalidSpecError, QuotaExceededError, SandboxdError

__all__ = [
    "MAX_ARGUMENT_BYTES",
    "MAX_CONTAINER_MESSAGE_CHARS",
    "PROTECTED_PYTHON",
    "PROTECTED_PYTHON_PROBE",
    "PROTECTED_PYTHON_SETUP",
    "engine_refusal",
    "looks_like_frames",
    "script_argv",
]


_PRELUDE = "try:\n    import ctypes\n    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\nexcept Exception:\n    pass\n"
"""First thing every in-container script does: PR_SET_DUMPABLE 0. The commands run as the same
user; dumpable, the script's pipes to the daemon could be opened through ``/proc/PID/fd`` and
its replies forged. The window left is the interpreter's start-up, a few milliseconds."""


@functools.cache
def _source(name: str) -> str:
    return _PRELUDE + importlib.resources.files("sandboxd").joinpath(name).read_text()


MAX_CONTAINER_MESSAGE_CHARS = 16384
"""Longest error message taken from an in-container helper: room for the request's paths (4 KiB
each), which the RPC layer then shortens for the caller."""

MAX_ARGUMENT_BYTES = 131072 - 1
"""Linux caps each argv string at 32 pages (MAX_ARG_STRLEN), the terminating NUL included."""


PROTECTED_PYTHON = "/usr/local/libexec/sandboxd/python3"
"""The helpers' execute-only interpreter, when the workspace has one."""

PROTECTED_PYTHON_SETUP = f"""
set -u
dir={PROTECTED_PYTHON.rsplit("/", 1)[0]}
src=$(readlink -f "$(command -v python3)") || exit 1
mkdir -p "$dir" && chmod 0711 "$dir" && [ ! -L "$dir" ] && [ "$(stat -c '%u' "$dir")" = 0 ] || exit 1
cp "$src" "$dir/python3.new" && chmod 0711 "$dir/python3.new" && mv -f "$dir/python3.new" "$dir/python3"
"""
"""Run by the container's root (no capabilities) at every start: an execute-only copy of python3.
A process started from a binary its user cannot read is non-dumpable from ``execve`` on, so the
helpers' pipes to the daemon cannot be opened through ``/proc`` even during the interpreter's
start-up. On a read-only root the directory is a tmpfs of its own."""

PROTECTED_PYTHON_PROBE = f"""
p={PROTECTED_PYTHON}
i=0
while [ ! -e "$p" ] && [ "$i" -lt 10 ]; do sleep 0.05; i=$((i + 1)); done
[ ! -L "$p" ] && [ "$(stat -c '%u %a' "$p")" = "0 711" ] && "$p" -I -S -c pass && echo "$p"
"""
"""Run as the workspace user before the daemon's first command there: prints the interpreter's
path when it is root's, execute-only, and runs. It waits up to 0.5 s for a fresh container's
setup (a copy of a few MB, done long before a first command can arrive); a container without
one (made before it existed, or whose image defeats it) costs that once, then gets ``python3``."""


def script_argv(name: str, config: Mapping[str, Any], *, tokens: bool = False, python: str = "python3") -> list[str]:
    """Return the argv that runs ``sandboxd/<name>`` with ``config``.

    Args:
        name: the script (``supervisor.py`` or ``fileops.py``).
        config: its configuration.
        tokens: pass ``config`` as ``KEY VALUE ...`` argv strings (a nested ``env``
            mapping as ``env:NAME VALUE``; booleans ``1``/``0``) instead of one JSON
            string, so the script needs no ``json`` import (the supervisor's case).
        python: the interpreter (the workspace's execute-only copy when it has one).

    Raises:
        InvalidSpecError: an argument is longer than one argv string may be.
    """
    if tokens:
        arguments = []
        for key, value in config.items():
            if isinstance(value, Mapping):
                for sub_key, sub_value in value.items():
                    arguments += [f"{key}:{sub_key}", str(sub_value)]
            else:
                arguments += [key, ("1" if value else "0") if isinstance(value, bool) else str(value)]
    else:
        arguments = [json.dumps(config, ensure_ascii=False)]
    for argument in arguments:
        if len(argument.encode("utf-8", "surrogatepass")) > MAX_ARGUMENT_BYTES:
            msg = (
                f"the request is too long to pass to the container ({len(argument)} characters in one part; "
                f"at most {MAX_ARGUMENT_BYTES} bytes): put large content in a file with write_file"
            )
            raise InvalidSpecError(msg)
    return [python, "-I", "-S", "-c", _source(name), *arguments]


def looks_like_frames(first_chunk: bytes, kinds: bytes) -> bool:
    """Whether an exec's first stdout bytes start a frame of one of ``kinds``.

    Anything else is the engine speaking (e.g. "exec: python3: not found").
    """
    return len(first_chunk) > 0 and first_chunk[0] in kinds


def engine_refusal(text: bytes) -> SandboxdError:
    """Turn the engine's own error text from a failed exec into a clear precondition error."""
    detail = text.decode("utf-8", "replace").strip().splitlines()[0][:300] if text.strip() else "no detail"
    lowered = detail.lower()
    if "resource temporarily unavailable" in lowered or "read init-p" in lowered:
        # runc could not fork its init (EAGAIN), or that init died at once: what a full pids
        # cgroup does to `docker exec` (a fork bomb, say).
        return QuotaExceededError(
            f"the container could not start a new process; the workspace is likely at its process limit ({detail})"
        )
    if "python3" in detail and ("not found" in detail or "no such file" in detail.lower()):
        return FailedPreconditionError(
            f"the workspace image has no python3, which sandboxd needs in every workspace ({detail})"
        )
    return FailedPreconditionError(f"the container engine could not run the operation: {detail}")
