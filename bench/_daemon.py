"""A private sandboxd for a benchmark run: its own socket and instance label, stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

INSTANCE = f"bench-{secrets.token_hex(4)}"
"""Label value of everything a benchmark run creates."""
IMAGE = "sandboxd/base:bookworm"


@contextlib.contextmanager
def private_daemon() -> Iterator[str]:
    """Start `sandboxd serve` on a temporary socket; yield the socket path; stop it on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        socket_path = str(Path(tmp) / "bench.sock")
        env = {
            **os.environ,
            "SANDBOXD_SOCKET": socket_path,
            "SANDBOXD_INSTANCE": INSTANCE,
            "SANDBOXD_LOG_LEVEL": "warning",
        }
        daemon = subprocess.Popen([str(Path(sys.executable).with_name("sandboxd")), "serve", "--no-build"], env=env)
        try:
            for _ in range(100):
                if Path(socket_path).exists():
                    break
                time.sleep(0.1)
            yield socket_path
        finally:
            daemon.terminate()
            daemon.wait(30)
