"""Template builds: a first build, the same content again (answered from the image), a workspace from it.

Usage: ``.venv/bin/python bench/template_builds.py``. A private daemon builds three templates FROM the
default image (a COPY of a one-file context and a RUN), builds each again five times with the same
content (every one must come back ``cached``), and creates a workspace from each; it prints the
medians. A first build is the engine's builder; a cached one is the daemon's digest of the content
and one image lookup.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandboxd_client import SandboxClient

from tests.conftest import DaemonThread, make_settings

DOCKERFILE = "FROM sandboxd/base:bookworm\nCOPY f /opt/f\nUSER root\nRUN echo built > /opt/b\n"


def tar_of(files: dict[str, bytes]) -> bytes:
    """An uncompressed tar archive of ``files`` (name -> content)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


async def main() -> None:
    print(datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))
    daemon = DaemonThread(make_settings(Path(tempfile.mkdtemp()))).start()
    firsts: list[float] = []
    cached: list[float] = []
    creates: list[float] = []
    try:
        async with SandboxClient(socket_path=daemon.socket_path, retries=False) as client:
            for i in range(3):
                context = tar_of({"f": f"v{i}-{time.time()}".encode()})
                began = time.monotonic()
                await client.build_template(f"bench{i}", DOCKERFILE, context=context)
                firsts.append(time.monotonic() - began)
                for _ in range(5):
                    began = time.monotonic()
                    again = await client.build_template(f"bench{i}", DOCKERFILE, context=context)
                    cached.append(time.monotonic() - began)
                    assert again.cached
                began = time.monotonic()
                workspace = await client.create_workspace(from_snapshot=f"bench{i}")
                creates.append(time.monotonic() - began)
                await workspace.delete()
                await client.delete_snapshot(f"bench{i}")
    finally:
        daemon.stop()
    print(f"first build: {statistics.median(firsts):.2f} s median of {[round(x, 2) for x in firsts]}")
    print(f"same content again: {statistics.median(cached) * 1000:.1f} ms median, {max(cached) * 1000:.1f} ms max")
    print(f"workspace from the template: {[round(x * 1000) for x in creates]} ms")


if __name__ == "__main__":
    asyncio.run(main())
