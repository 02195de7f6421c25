"""pytest plugin: throwaway sandboxd workspaces as fixtures (registered as ``pytest11`` entry ``sandboxd``).

Fixtures:

``sandboxd_client`` (session)
    A :class:`~sandboxd_client.sync.SyncSandboxClient`. It connects to the
    daemon named by ``--sandboxd-socket`` / ``--sandboxd-address`` or
    ``SANDBOXD_SOCKET`` / ``SANDBOXD_ADDRESS``; with none configured it uses the
    default socket if a daemon answers there, and otherwise starts one for the
    test session (the ``sandboxd`` package must be installed).

``workspace`` (function)
    A fresh :class:`~sandboxd_client.sync.SyncWorkspace`, deleted after the
    test, labelled with the test's node id. ``@pytest.mark.sandboxd(image=...,
    memory_bytes=..., network="bridge", ...)`` passes options to
    ``create_workspace``.

    ``@pytest.mark.sandboxd(snapshot="deps", setup="pip install -r requirements.txt")``
    starts each test's workspace from a snapshot instead: the first test that asks
    for it in the session creates a workspace (with the marker's other options),
    runs ``setup`` in it (it must exit 0), snapshots it and deletes it; every test
    of that snapshot and set-up then forks it, so the set-up runs once per session
    (per xdist worker). The plugin deletes the snapshots it made at the session's
    end. ``snapshot`` without ``setup`` names a snapshot that exists already.

A failing test's report gains a section naming its workspace and the last
commands run in it. Workspaces a crashed earlier run left behind (its pytest
process is gone) are removed when the plugin first connects.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from ._paths import default_socket_path
from .errors import NotFoundError, SandboxError
from .sync import SyncSandboxClient, SyncWorkspace

__all__ = ["PLUGIN_LABEL"]

PLUGIN_LABEL = "pytest.plugin"
"""Label on every workspace the plugin makes (value ``sandboxd``)."""
_INSTANCE = "pytest"
"""Instance label of daemons the plugin starts: shared, so a later run can see a crashed run's leftovers."""
_HISTORY_SHOWN = 10
_WORKSPACE_KEY = pytest.StashKey[SyncWorkspace]()
_SNAPSHOTS_KEY = pytest.StashKey[dict[tuple[str, str], str]]()
"""The snapshots this session made: ``(snapshot, setup)`` of the marker -> the snapshot's real name."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """Options to point the plugin at a daemon."""
    group = parser.getgroup("sandboxd", "sandboxd workspaces")
    group.addoption("--sandboxd-socket", default=None, help="Unix socket of the daemon to use (env SANDBOXD_SOCKET)")
    group.addoption("--sandboxd-address", default=None, help="HOST:PORT of the daemon to use (env SANDBOXD_ADDRESS)")


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker; remember the project's root."""
    _ROOT[:] = [Path(config.rootpath)]
    config.addinivalue_line(
        "markers", "sandboxd(**options): create_workspace options for the sandboxd `workspace` fixture"
    )


def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


_ROOT: list[Path] = []
"""The pytest rootdir of this session (set at configure), which names the project."""


def _owner() -> str:
    """This project: runs of it on the same host share it, wherever they are started from."""
    root = _ROOT[0] if _ROOT else Path.cwd()
    return hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]


def _own_instance() -> str:
    """The instance label of a daemon the plugin starts: one per project and xdist worker.

    Two daemons on one label would adopt each other's workspaces and end each other's
    commands; the same project's next run (same worker) still finds and reaps leftovers.
    """
    return f"{_INSTANCE}-{_owner()[:8]}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


def _run_labels() -> dict[str, str]:
    return {
        PLUGIN_LABEL: "sandboxd",
        "pytest.owner": _owner(),
        "pytest.host": socket.gethostname(),
        "pytest.boot": _boot_id(),
        "pytest.pid": str(os.getpid()),
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(client: SyncSandboxClient) -> list[str]:
    """Delete workspaces and snapshots of earlier runs of this project on this host whose pytest is gone."""
    removed = []
    mine = {PLUGIN_LABEL: "sandboxd", "pytest.owner": _owner()}
    for info in client.list_workspaces(mine):
        if _stale(info.labels):
            with contextlib.suppress(NotFoundError):
                client.delete_workspace(info.workspace_id)
                removed.append(info.workspace_id)
    for snapshot in client.list_snapshots(mine):
        if _stale(snapshot.labels):
            with contextlib.suppress(NotFoundError):
                client.delete_snapshot(snapshot.name)
                removed.append(snapshot.name)
    return removed


def _stale(labels: Mapping[str, str]) -> bool:
    """Whether what a run labelled so was left by a pytest of this host that is gone."""
    if labels.get("pytest.host") != socket.gethostname():
        return False  # another machine's run: not ours to judge
    pid = int(labels.get("pytest.pid", "0") or 0)
    same_boot = labels.get("pytest.boot") == _boot_id()
    return not (pid == os.getpid() or (same_boot and pid and _alive(pid)))


def _answers(socket_path: str) -> bool:
    if not Path(socket_path).exists():
        return False
    try:
        with SyncSandboxClient(socket_path=socket_path, retries=False) as probe:
            return probe.health() == "SERVING"
    except SandboxError:
        return False


def _set_parent_death_signal() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to SIGTERM the daemon if pytest dies (a SIGKILLed run must not leave it behind)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _own_daemon() -> Iterator[str]:
    """Start `python -m sandboxd serve` on a private socket for this session."""
    try:
        import sandboxd  # noqa: F401 - only to tell whether the daemon is installed
    except ImportError:
        pytest.fail(
            "no sandboxd daemon is configured (--sandboxd-socket, SANDBOXD_SOCKET) or answering on the default "
            "socket, and the `sandboxd` package is not installed to start one"
        )
    with tempfile.TemporaryDirectory(prefix="sandboxd-pytest-") as tmp:
        socket_path = str(Path(tmp) / "sandboxd.sock")
        log = Path(tmp) / "daemon.log"
        env = {**os.environ, "SANDBOXD_SOCKET": socket_path, "SANDBOXD_INSTANCE": _own_instance()}
        # A throwaway daemon keeps its audit trail with it, not in the machine's (unless told),
        # and no warm pool (its members would outlive it, left on the machine after every run).
        env.setdefault("SANDBOXD_AUDIT_LOG", str(Path(tmp) / "audit.jsonl"))
        env.setdefault("SANDBOXD_POOL_SIZE", "0")
        env.setdefault("SANDBOXD_POOL_DEMAND_MEMORY_BYTES", "0")
        with log.open("wb") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "sandboxd", "serve", "--socket", socket_path],
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                preexec_fn=_set_parent_death_signal,
            )
        try:
            deadline = time.monotonic() + 900  # the first start may build the workspace image
            while not _answers(socket_path):
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the sandboxd daemon did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
            yield socket_path
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="session")
def sandboxd_client(request: pytest.FixtureRequest) -> Iterator[SyncSandboxClient]:
    """A blocking client of a sandboxd daemon for the whole session (see the module docstring)."""
    config = request.config
    address = config.getoption("--sandboxd-address") or os.environ.get("SANDBOXD_ADDRESS")
    socket_path = config.getoption("--sandboxd-socket") or os.environ.get("SANDBOXD_SOCKET")
    with contextlib.ExitStack() as stack:
        if not address and not socket_path:
            default = default_socket_path(os.environ)
            socket_path = default if _answers(default) else stack.enter_context(_own_daemon())
        client = stack.enter_context(SyncSandboxClient(address, socket_path=socket_path))
        _reap(client)
        made = config.stash.setdefault(_SNAPSHOTS_KEY, {})
        try:
            yield client
        finally:
            for name in made.values():
                with contextlib.suppress(NotFoundError):
                    client.delete_snapshot(name)
            made.clear()


def _session_snapshot(
    request: pytest.FixtureRequest, client: SyncSandboxClient, name: str, setup: str, options: dict[str, Any]
) -> str:
    """The snapshot ``name`` made by running ``setup`` once this session; its real name."""
    made = request.config.stash.setdefault(_SNAPSHOTS_KEY, {})
    key = (name, setup)
    if key not in made:
        digest = hashlib.sha256(f"{name}\0{setup}\0{os.getpid()}\0{_boot_id()}".encode()).hexdigest()[:12]
        real = f"{name[:40]}-{digest}"
        builder = client.create_workspace(labels={**_run_labels(), "pytest.snapshot": real}, **options)
        try:
            result = builder.exec(setup)
            if result.exit_code != 0:
                pytest.fail(
                    f"@pytest.mark.sandboxd(snapshot={name!r}): the set-up exited {result.exit_code}:\n"
                    f"{(result.stdout + result.stderr)[-2000:]}",
                    pytrace=False,
                )
            builder.snapshot(real, labels=_run_labels())
        finally:
            with contextlib.suppress(NotFoundError):
                builder.delete()
        made[key] = real
    return made[key]


@pytest.fixture
def workspace(request: pytest.FixtureRequest, sandboxd_client: SyncSandboxClient) -> Iterator[SyncWorkspace]:
    """A fresh workspace for one test, deleted afterwards (options from ``@pytest.mark.sandboxd``)."""
    marker = request.node.get_closest_marker("sandboxd")
    if marker is not None and marker.args:
        pytest.fail(f"@pytest.mark.sandboxd takes keyword options only, got {marker.args!r}", pytrace=False)
    options: dict[str, Any] = dict(marker.kwargs) if marker else {}
    labels = {**options.pop("labels", {}), **_run_labels(), "pytest.nodeid": request.node.nodeid[:1024]}
    snapshot, setup = options.pop("snapshot", ""), options.pop("setup", "")
    if setup and not snapshot:
        pytest.fail("@pytest.mark.sandboxd(setup=...) needs snapshot=NAME too", pytrace=False)
    if snapshot:
        if setup:
            snapshot = _session_snapshot(request, sandboxd_client, snapshot, setup, options)
        options = {k: v for k, v in options.items() if k != "image"}  # the snapshot is the image
    try:
        created = sandboxd_client.create_workspace(labels=labels, from_snapshot=snapshot, **options)
    except (TypeError, KeyError, ValueError) as exc:  # a bad option; the daemon's refusals say so themselves
        pytest.fail(f"@pytest.mark.sandboxd{tuple(options.items())!r}: {type(exc).__name__}: {exc}", pytrace=False)
    request.node.stash[_WORKSPACE_KEY] = created
    try:
        yield created
    finally:
        with contextlib.suppress(NotFoundError):
            created.delete()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On failure, name the test's workspace and its last commands in the report."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    created = item.stash.get(_WORKSPACE_KEY, None)
    if created is None or not report.failed:
        return
    lines = [f"workspace {created.workspace_id} (image {created.info.image})"]
    if created.history:
        lines.append(f"last commands (of {len(created.history)}):")
        for command, code in created.history[-_HISTORY_SHOWN:]:
            status = "still running" if code is None else f"exit {code}"
            lines.append(f"  $ {command}    [{status}]")
    else:
        lines.append("no commands were run in it")
    report.sections.append(("sandboxd", "\n".join(lines)))
