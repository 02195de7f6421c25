"""Shared fixtures: a real daemon over the real Docker engine, and cleanup by label.

Every container, volume and network the suite creates carries ``sandboxd.instance=<this
session's id>``; the session finalizer removes whatever carries it and fails
the run if anything is left behind after that.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import secrets
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandboxd.settings import Settings

TEST_INSTANCE = f"test-{secrets.token_hex(4)}"
INSTANCES = {TEST_INSTANCE}
"""Every instance label this run used: the session finalizer cleans and checks them all."""


def new_instance() -> str:
    """A private instance label for a test's own daemon.

    Daemons sharing an instance adopt, reap (idle TTL) and clear orphans of each
    other's workspaces, as they should; a test's extra daemon therefore gets its own.
    """
    instance = f"{TEST_INSTANCE}-{secrets.token_hex(3)}"
    INSTANCES.add(instance)
    return instance


def pytest_configure(config: pytest.Config) -> None:
    """Send the daemon's JSON logs to a file next to the test run, not into every test's output."""
    from sandboxd.logging import configure_logging

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    log_path = Path(config.rootpath) / ".pytest_cache" / f"sandboxd-test{'-' + worker if worker else ''}.log"
    os.environ["SANDBOXD_TEST_LOG"] = str(log_path)
    log_path.parent.mkdir(exist_ok=True)
    config._sandboxd_log = log_path.open("w")  # type: ignore[attr-defined]
    configure_logging(level="info", fmt="json", stream=config._sandboxd_log, cache=False)  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    """Close the log file."""
    import logging

    stream = getattr(config, "_sandboxd_log", None)
    if stream is not None:
        logging.getLogger().handlers.clear()
        stream.close()


LONGEST_FIRST = (
    "test_exec_sessions",
    "test_snapshots",
    "test_shell_parity",
    "test_stream_resume",
    "test_inspect_self_check",
    "test_ctrl_c_startup",
    "test_lifecycle",
    "test_pool",
    "test_reconnect",
    "test_daemon_image",
    "test_any_image",
    "test_pause",
)
"""The files that take longest (a minute or more of a three-worker run, 2026-12-05), longest first.

``./dev test`` deals whole files to its workers (``--dist loadfile``) in collection order: a long
file dealt last is a tail the other workers wait out, so these are dealt first."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the longest files first (a stable sort: every other test keeps its place)."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}

    def place(item: pytest.Item) -> int:
        module = getattr(item, "module", None)
        return rank.get(module.__name__.rsplit(".", 1)[-1] if module else "", len(rank))

    items.sort(key=place)


class DaemonThread:
    """A sandboxd daemon serving on its own event loop in a background thread."""

    def __init__(self, settings: Settings, environ: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.environ = environ or {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sandboxd-test-daemon", daemon=True)
        self.daemon = None

    def start(self) -> DaemonThread:
        from sandboxd.api.server import start
        from sandboxd.backend.docker import DockerBackend

        self.thread.start()
        backend = DockerBackend(
            docker_host=self.settings.docker_host,
            instance=self.settings.instance,
            retries=self.settings.docker_retries,
        )
        self.daemon = asyncio.run_coroutine_threadsafe(
            start(self.settings, backend, environ=self.environ), self.loop
        ).result(60)
        return self

    def run(self, coro, timeout: float = 120):  # type: ignore[no-untyped-def]
        """Run ``coro`` on the daemon's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.daemon is not None:
            self.run(self.daemon.stop(1.0), timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()
        # What the stopped daemon still held when its loop closed (a stream cancelled mid-open) is
        # collected now, with it, rather than blamed on whichever later test the collector runs in.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()

    @property
    def socket_path(self) -> str:
        return self.settings.socket_path


def make_settings(tmp_dir: Path, **overrides: object) -> Settings:
    """Settings for a test daemon: private socket, a private instance label (unless given), no retries."""
    base = Settings.from_env(
        {k: v for k, v in os.environ.items() if k == "DOCKER_HOST"},
        socket_path=str(tmp_dir / "sandboxd.sock"),
        instance=new_instance(),
        docker_retries=False,
        kill_grace_s=1.0,
        audit_log=str(tmp_dir / "audit.jsonl"),
        pool_size=0,  # the warm pool's own tests turn it on: elsewhere members would be in the counts
        pool_demand_memory_bytes=0,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


@contextlib.contextmanager
def spawned_daemon(
    tmp_dir: Path, instance: str = "", **env: str
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """Run `python -m sandboxd` as its own process (for RSS and signal tests).

    Yields the process, its socket path and the file its log goes to. ``instance``
    defaults to a private one; pass the same one to play a restart.
    """
    instance = instance or new_instance()
    socket_path = str(tmp_dir / "run" / "sandboxd.sock")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    log_path = tmp_dir / "daemon.log"
    full_env = {
        **os.environ,
        "SANDBOXD_LOG_FORMAT": "json",
        "SANDBOXD_AUDIT_LOG": str(tmp_dir / "audit.jsonl"),
        "SANDBOXD_POOL_SIZE": "0",
        "SANDBOXD_POOL_DEMAND_MEMORY_BYTES": "0",
        **env,
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sandboxd", "--socket", socket_path, "--instance", instance, "--no-build"],
            env=full_env,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 30
        while not _accepts(socket_path):  # not mere existence: a killed daemon leaves its socket file
            if time.monotonic() > deadline or process.poll() is not None:
                pytest.fail(f"the daemon did not start: {log_path.read_text()}")
            time.sleep(0.05)
        yield process, socket_path, log_path
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _accepts(socket_path: str) -> bool:
    import socket

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(socket_path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    msg = f"no VmRSS for {pid}"
    raise AssertionError(msg)


@pytest.fixture(scope="session")
def docker_client():  # type: ignore[no-untyped-def]
    """The Docker SDK client the suite uses to check and clean up; fails (never skips) without an engine."""
    import docker

    client = docker.from_env()
    try:
        client.ping()
    except Exception as exc:
        pytest.fail(f"these tests need a running Docker engine: {exc}")
    yield client
    # A daemon killed at a test's end (SIGKILL) takes its lease with it, but not at once: the
    # engine ends and removes it within moments, which are waited for (a lease left longer is
    # a leftover like any other).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        container.labels.get("sandboxd.instance") in INSTANCES
        for container in client.containers.list(all=True, filters={"label": "sandboxd.lease"}, ignore_removed=True)
    ):
        time.sleep(0.1)
    leftovers, volumes, networks = [], [], []
    for instance in sorted(INSTANCES):
        selector = {"label": f"sandboxd.instance={instance}"}
        leftovers += client.containers.list(all=True, filters=selector, ignore_removed=True)
        volumes += client.volumes.list(filters=selector)
        networks += client.networks.list(filters=selector)
        for container in client.containers.list(all=True, filters=selector, ignore_removed=True):
            with contextlib.suppress(docker.errors.NotFound):  # one its daemon was removing
                if container.status == "paused":
                    container.unpause()  # gVisor cannot remove a paused sandbox
                container.remove(force=True, v=True)
        for volume in client.volumes.list(filters=selector):
            volume.remove(force=True)
        for network in client.networks.list(filters=selector):
            network.remove()
    client.close()
    named = [f"{c.name} ({c.status}, made {c.attrs.get('Created', '?')})" for c in leftovers]
    assert not leftovers and not volumes and not networks, (
        f"left behind: {named} {[v.name for v in volumes]} {[n.name for n in networks]}"
    )


@pytest.fixture(scope="session")
def default_image(docker_client) -> str:  # type: ignore[no-untyped-def]
    """The default workspace image, built once if missing (offline route when no registry)."""
    from sandboxd.backend.docker import DockerBackend
    from sandboxd.images import ensure_default_image

    settings = Settings.from_env(os.environ)

    async def ensure() -> str:
        backend = DockerBackend(docker_host=settings.docker_host, instance=TEST_INSTANCE)
        try:
            return await ensure_default_image(
                backend, settings.default_image, route=settings.image_route, progress=lambda _line: None
            )
        finally:
            await backend.close()

    return asyncio.run(ensure())


@pytest.fixture(scope="session")
def e2b_image(default_image: str) -> str:
    """E2B's base template image (``images/e2b``), built once if missing, from the default image."""
    from sandboxd.backend.docker import DockerBackend
    from sandboxd.images import ensure_e2b_image

    settings = Settings.from_env(os.environ)

    async def ensure() -> str:
        backend = DockerBackend(docker_host=settings.docker_host, instance=TEST_INSTANCE)
        try:
            return await ensure_e2b_image(
                backend, default_image, route=settings.image_route, progress=lambda _line: None
            )
        finally:
            await backend.close()

    return asyncio.run(ensure())


_DERIVED_IMAGES = {
    # The default image without bash: commands must fall back to `sh -c`.
    "sandboxd-test/nobash:1": "USER root\nRUN rm -f /usr/bin/bash /bin/bash\nUSER sandbox\n",
    # The default image without Python: everything works (nothing of sandboxd needs it).
    "sandboxd-test/nopython:1": "USER root\nRUN rm -f /usr/bin/python3* /usr/bin/python\nUSER sandbox\n",
}


@pytest.fixture
def e2b_env(e2b_daemon: DaemonThread, monkeypatch: pytest.MonkeyPatch) -> str:
    """The E2B SDK's settings pointed at the ``e2b_daemon`` of the test's module (its E2B plane); its URL."""
    url = f"http://{e2b_daemon.daemon.e2b.address}"
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.setenv("E2B_API_KEY", "unused-without-a-tokens-file")
    return url


@pytest.fixture(scope="session")
def derived_images(docker_client, default_image: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Small images derived from the default one, built once (the build cache makes reruns instant)."""
    import io

    built = {}
    for tag, steps in _DERIVED_IMAGES.items():
        dockerfile = f"FROM {default_image}\n{steps}".encode()
        docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True, forcerm=True)
        built[tag.split("/")[1].split(":")[0]] = tag
    return built


@pytest.fixture(scope="session")
def daemon(default_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonThread]:
    """One daemon for the whole session, on a private Unix socket."""
    thread = DaemonThread(make_settings(tmp_path_factory.mktemp("daemon"), instance=TEST_INSTANCE)).start()
    yield thread
    thread.stop()


@pytest.fixture
async def client(daemon: DaemonThread):  # type: ignore[no-untyped-def]
    """A connected async client (one per test, on the test's event loop)."""
    from sandboxd_client import SandboxClient

    async with SandboxClient(socket_path=daemon.socket_path, retries=False) as connected:
        yield connected


RUNTIME_SUITES = frozenset(
    {
        "test_agent",
        "test_any_image",
        "test_ctrl_c_startup",
        "test_exec_basic",
        "test_exec_sessions",
        "test_files",
        "test_forward",
        "test_pause",
        "test_shell_parity",
    }
)
"""Modules whose ``workspace`` tests run under every OCI runtime: runc and gVisor's runsc."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run the exec, Ctrl-C and file suites once per runtime (``-k runsc`` picks gVisor's half)."""
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in RUNTIME_SUITES and "workspace" in metafunc.fixturenames:
        metafunc.parametrize("runtime", ["runc", pytest.param("runsc", marks=pytest.mark.runsc)])


def _engine_runtimes() -> set[str]:
    import docker

    client = docker.from_env()
    try:
        return set(client.info().get("Runtimes") or {})
    finally:
        client.close()


@pytest.fixture(scope="session")
def runsc_available() -> bool:
    """Whether the engine has gVisor's runtime; CI (``SANDBOXD_REQUIRE_RUNSC=1``) insists on it."""
    if "runsc" in _engine_runtimes():
        return True
    if os.environ.get("SANDBOXD_REQUIRE_RUNSC") == "1":
        pytest.fail("the engine has no runsc runtime; run scripts/install-runsc (as root)")
    return False


@pytest.fixture(scope="session")
def checkpoints_available(runsc_available: bool) -> bool:
    """Whether memory snapshots can be taken: gVisor, and the engine's checkpoints on (experimental).

    CI (``SANDBOXD_REQUIRE_RUNSC=1``) insists on both (``scripts/enable-checkpoints``).
    """
    import docker

    client = docker.from_env()
    try:
        on = bool(client.info().get("ExperimentalBuild"))
    finally:
        client.close()
    if runsc_available and on:
        return True
    if os.environ.get("SANDBOXD_REQUIRE_RUNSC") == "1":
        pytest.fail("the engine's checkpoints are off; run scripts/enable-checkpoints (as root)")
    return False


@pytest.fixture
def runtime() -> str:
    """The OCI runtime of the ``workspace`` fixture (parametrised for ``RUNTIME_SUITES``)."""
    return ""


KEPT_WORKSPACE_SUITES = frozenset({"test_agent_tools", "test_exec_basic", "test_files", "test_files_abuse"})
"""Modules whose ``workspace`` tests share one workspace per runtime, put back as new after each.

Their tests touch only ``/workspace``, ``/tmp`` and their own commands: the put-back restores
those and kills the daemon's sessions, but not the home directory, ``/etc`` or a process that
left its session (a module whose tests change those keeps fresh workspaces). A create and delete cost
0.3 CPU-seconds under runc and 0.6 under gVisor on the suite's two cores; putting a workspace
back costs one ``docker exec``."""


@dataclasses.dataclass
class _Kept:
    """A workspace kept for a module's tests, and what it looked like new."""

    workspace_id: str
    container_id: str
    workspace_stat: str
    """``/workspace``'s ``uid:gid mode``."""
    tmp_entries: list[str]
    """What ``/tmp`` held."""


def _docker_exec(docker_client, container_id: str, user: str, script: str, *args: str) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """``sh -c script`` as ``user`` in the container, by the engine (not through sandboxd)."""
    result = docker_client.containers.get(container_id).exec_run(["sh", "-c", script, "sh", *args], user=user)
    return result.exit_code, result.output.decode("utf-8", "replace")


_PUT_BACK = """
owner=$1 mode=$2
shift 2
cd /workspace && find . -mindepth 1 -delete 2>/dev/null
[ "$(stat -c %a /workspace)" = "$mode" ] || chmod "$mode" /workspace
cd /tmp || exit 1
for entry in .* *; do
  case "$entry" in .|..) continue ;; esac
  [ -e "$entry" ] || [ -L "$entry" ] || continue
  keep=no
  for kept in "$@"; do [ "$entry" = "$kept" ] && keep=yes; done
  [ "$keep" = yes ] || rm -rf -- "$entry" 2>/dev/null || echo "left: /tmp/$entry"
done
[ -z "$(ls -A /workspace)" ] || echo "left: /workspace"
[ "$(stat -c '%u:%g %a' /workspace)" = "$owner $mode" ] || echo "left: /workspace's owner or mode"
"""
"""Put a workspace's ``/workspace`` and ``/tmp`` back as they were; says what it could not."""


@pytest.fixture(scope="module")
def _kept_workspaces(daemon: DaemonThread) -> Iterator[dict[str, _Kept]]:
    """The module's kept workspaces by runtime; deleted at its end."""
    kept: dict[str, _Kept] = {}
    yield kept
    if not kept:
        return
    from sandboxd_client import NotFoundError, SandboxClient

    async def delete() -> None:
        async with SandboxClient(socket_path=daemon.socket_path, retries=False) as client:
            for each in kept.values():
                with contextlib.suppress(NotFoundError):
                    await client.delete_workspace(each.workspace_id)

    asyncio.run(delete())


async def _put_back(client, docker_client, kept: _Kept) -> bool:  # type: ignore[no-untyped-def]
    """Make a kept workspace as new: its commands killed, ``/workspace`` and ``/tmp`` as they were.

    As the workspace's user first (its files in the sticky ``/tmp`` are its own to remove: the
    workspace's root has no CAP_FOWNER), then as root for what root made.
    """
    try:
        for process in await client.list_processes(kept.workspace_id):
            if process.running:
                await client.kill(process.process_id, grace_s=0)
        owner, mode = kept.workspace_stat.split()
        for user in (owner, "0:0"):
            code, out = await asyncio.to_thread(
                _docker_exec, docker_client, kept.container_id, user, _PUT_BACK, owner, mode, *kept.tmp_entries
            )
            if code == 0 and not out:
                return True
    except Exception as exc:  # a test that deleted, paused or broke its workspace: it is not kept
        warnings.warn(f"workspace {kept.workspace_id} not put back: {exc!r}", stacklevel=1)
        return False
    warnings.warn(f"workspace {kept.workspace_id} not put back: {out}", stacklevel=1)
    return False


@pytest.fixture
async def workspace(client, runtime: str, request: pytest.FixtureRequest) -> AsyncIterator[object]:  # type: ignore[no-untyped-def]
    """A default workspace: a fresh one per test, or in ``KEPT_WORKSPACE_SUITES`` one put back as new."""
    marker = request.node.get_closest_marker("workspace")
    options = dict(marker.kwargs) if marker else {}
    if runtime == "runsc" and not request.getfixturevalue("runsc_available"):
        pytest.skip("the engine has no runsc runtime (scripts/install-runsc registers it)")
    module = request.module.__name__.rsplit(".", 1)[-1]
    if options or module not in KEPT_WORKSPACE_SUITES:
        if runtime:
            options.setdefault("runtime", runtime)
        created = await client.create_workspace(labels={"test": request.node.name}, **options)
        yield created
        await client.delete_workspace(created.workspace_id)
        return
    from sandboxd_client import NotFoundError

    docker_client = request.getfixturevalue("docker_client")
    kept_by_runtime: dict[str, _Kept] = request.getfixturevalue("_kept_workspaces")
    kept = kept_by_runtime.get(runtime)
    if kept is None:
        created = await client.create_workspace(labels={"test": module}, **({"runtime": runtime} if runtime else {}))
        code, out = await asyncio.to_thread(
            _docker_exec, docker_client, created.info.container_id, "0:0", "stat -c '%u:%g %a' /workspace && ls -A /tmp"
        )
        assert code == 0, out
        first, *entries = out.splitlines()
        kept = kept_by_runtime[runtime] = _Kept(created.workspace_id, created.info.container_id, first, entries)
    handle = await client.get_workspace(kept.workspace_id)
    yield handle
    if not await _put_back(client, docker_client, kept):
        del kept_by_runtime[runtime]
        with contextlib.suppress(NotFoundError):
            await client.delete_workspace(kept.workspace_id)


@pytest.fixture
def workspace_id(daemon: DaemonThread) -> Iterator[str]:
    """A workspace for tests that drive the CLI from a subprocess (made and removed with its own client)."""
    from sandboxd_client import SandboxClient

    async def create() -> str:
        async with SandboxClient(socket_path=daemon.socket_path, retries=False) as client:
            return (await client.create_workspace(labels={"test": "cli"})).workspace_id

    async def delete(workspace: str) -> None:
        async with SandboxClient(socket_path=daemon.socket_path, retries=False) as client:
            await client.delete_workspace(workspace)

    created = asyncio.run(create())
    yield created
    asyncio.run(delete(created))
