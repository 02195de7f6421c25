"""Where the daemon's Unix socket lives by default; shared by the daemon and every client."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["default_socket_path"]


def default_socket_path(environ: Mapping[str, str]) -> str:
    """Return the socket path: ``SANDBOXD_SOCKET``, else a per-user runtime location.

    In order: ``$SANDBOXD_SOCKET``; ``$XDG_RUNTIME_DIR/sandboxd/sandboxd.sock``;
    ``/run/sandboxd/sandboxd.sock`` for root; ``/tmp/sandboxd-<uid>/sandboxd.sock``.
    """
    if environ.get("SANDBOXD_SOCKET"):
        return environ["SANDBOXD_SOCKET"]
    if environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(environ["XDG_RUNTIME_DIR"], "sandboxd", "sandboxd.sock")
    if os.geteuid() == 0:
        return "/run/sandboxd/sandboxd.sock"
    return f"/tmp/sandboxd-{os.geteuid()}/sandboxd.sock"
