"""The grpc.aio server: servicers, health checking, reflection, socket set-up, graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import os
import signal
import socket
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from sandboxd_protocol.limits import MAX_MESSAGE_BYTES
from sandboxd_protocol.v1 import (
    file_service_pb2,
    file_service_pb2_grpc,
    network_service_pb2,
    network_service_pb2_grpc,
    process_service_pb2,
    process_service_pb2_grpc,
    workspace_service_pb2,
    workspace_service_pb2_grpc,
)

from ..agentbuild import AgentBuild, ensure_agent, ensure_agent_image
from ..audit import AuditLog
from ..backend.base import Backend
from ..e2b.server import E2BServer
from ..errors import InvalidSpecError, SandboxdError
from ..files import FileManager
from ..forwards import PortForwarder
from ..images import e2b_image_ref, ensure_default_image, ensure_e2b_image
from ..lease import InstanceLease
from ..memory import HeapTrimmer
from ..metrics import LIVE, MetricsServer, Samples, serve_metrics
from ..pool import WarmPool
from ..processes import ProcessTable
from ..secrets import SecretStore
from ..settings import Settings
from ..tenancy import Authenticator
from ..workspaces import WorkspaceManager
from .files import FileServicer
from .interceptors import Drain, server_interceptors
from .network import NetworkServicer
from .processes import ProcessServicer
from .workspaces import WorkspaceServicer

__all__ = ["SERVICE_NAMES", "Daemon", "serve"]

log = structlog.get_logger(__name__)

SERVICE_NAMES = (
    workspace_service_pb2.DESCRIPTOR.services_by_name["WorkspaceService"].full_name,
    process_service_pb2.DESCRIPTOR.services_by_name["ProcessService"].full_name,
    file_service_pb2.DESCRIPTOR.services_by_name["FileService"].full_name,
    network_service_pb2.DESCRIPTOR.services_by_name["NetworkService"].full_name,
)
_MAX_SEND_BYTES = 64 * 1024 * 1024
"""Largest response message (a ListWorkspaces page or a file page is far smaller)."""


@dataclasses.dataclass
class Daemon:
    """A started daemon: the server plus the domain objects behind it."""

    server: grpc.aio.Server
    backend: Backend
    processes: ProcessTable
    workspaces: WorkspaceManager
    files: FileManager
    health: health.aio.HealthServicer
    addresses: list[str]
    audit: AuditLog
    lease: InstanceLease
    drain: Drain
    reaper: asyncio.Task[None] | None = None
    trimmer: asyncio.Task[None] | None = None
    metrics: MetricsServer | None = None
    looker: asyncio.Task[None] | None = None
    gauges: Callable[[], Samples] | None = None
    e2b: E2BServer | None = None

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls (UNAVAILABLE), give in-flight ones ``grace_s`` seconds, then release everything.

        Workspaces and their commands stay as they are, for the next daemon to adopt; the
        instance's lease goes last.
        """
        if self.gauges is not None and self.gauges in LIVE.sources:
            LIVE.sources.remove(self.gauges)
        for task in (self.reaper, self.trimmer, self.looker):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.health.enter_graceful_shutdown()
        # A caller who leaves in the grace still means Ctrl-C; the drain's own end of a call does
        # not: commands' streams yield, and their commands run on.
        await self.drain.run(grace_s, expiring=self.processes.yield_all)
        self.processes.stop_interrupting()
        if self.e2b is not None:
            # After the drain: its end of the E2B plane's streams is no Ctrl-C for their commands.
            await self.e2b.stop()
        # Nothing is in flight now but what the drain has just ended: a moment for its status.
        await self.server.stop(1.0)
        if self.workspaces.pool is not None:
            await self.workspaces.pool.close()
        await self.workspaces.egress.shutdown()
        await self.processes.close()
        await self.workspaces.close()
        await self.files.close()
        await self.lease.release()  # last of all: until now, a successor would fight this one
        await self.backend.close()
        self.audit.close()
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.close)
        log.info("daemon.stopped")


LOOK_INTERVAL_S = 15.0
"""How often the workspaces' states are read for the metrics (one listing of the engine's)."""


class _Gauges:
    """This daemon's gauges for the metrics: what it holds, and what the engine said last."""

    def __init__(self, workspaces: WorkspaceManager, processes: ProcessTable, lease: InstanceLease) -> None:
        self.workspaces, self.processes, self.lease = workspaces, processes, lease
        self.states: list[tuple[str, str]] = []
        self.engine_up = 0.0

    async def look_forever(self) -> None:
        """Read the workspaces' states every ``LOOK_INTERVAL_S`` (an engine outage is a 0)."""
        while True:
            try:
                self.states = await self.workspaces.backend.container_states()
                self.engine_up = 1.0
            except SandboxdError:
                self.engine_up = 0.0
            except Exception:  # the metrics must never take the daemon down
                log.exception("metrics.look_failed")
            await asyncio.sleep(LOOK_INTERVAL_S)

    def __call__(self) -> Samples:
        samples: Samples = {
            ("sandboxd_engine_up", ()): self.engine_up,
            ("sandboxd_lease_held", ()): float(self.lease.held),
        }
        for state, runtime in self.states:
            key = ("sandboxd_workspaces", (("runtime", runtime or "default"), ("state", state)))
            samples[key] = samples.get(key, 0.0) + 1
        for state, count in self.processes.session_counts().items():
            samples[("sandboxd_sessions", (("state", state),))] = float(count)
        samples[("sandboxd_output_held_bytes", ())] = float(self.processes.budget.held)
        if self.workspaces.pool is not None:
            for status in self.workspaces.pool.status():
                name = status.pool_class.name
                samples[("sandboxd_pool_members", (("pool_class", name), ("state", "ready")))] = float(status.ready)
                samples[("sandboxd_pool_members", (("pool_class", name), ("state", "starting")))] = float(
                    status.starting
                )
        return samples


REAP_INTERVAL_S = 1.0
"""How often idle workspaces are looked for; a TTL is honoured to within about this."""


async def _reap_forever(workspaces: WorkspaceManager, audit: AuditLog, lease: InstanceLease) -> None:
    """Remove workspaces idle past their TTL, for the daemon's whole life (engine outages included).

    Only while the daemon holds its instance's lease: without it, they may be another's.
    """
    swept_at = time.monotonic()
    while True:
        await asyncio.sleep(REAP_INTERVAL_S)
        if not lease.held:
            continue
        try:
            if time.monotonic() - swept_at >= workspaces.settings.snapshot_sweep_s:
                swept_at = time.monotonic()
                if swept := await workspaces.backend.sweep_snapshot_debris():
                    log.warning("snapshot.debris_removed", names=swept)
            await workspaces.reap_idle(audit)
        except SandboxdError as exc:
            log.warning("workspace.reap_failed", error=exc.message)
        except Exception:  # the reaper must outlive any one failure
            log.exception("workspace.reap_failed")


def _read_pem(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        msg = f"cannot read the {what} {path}: {exc.strerror}"
        raise InvalidSpecError(msg) from None


def _tcp_credentials(settings: Settings, authenticator: Authenticator) -> grpc.ServerCredentials:
    """TLS credentials for the TCP listener: TCP never goes unencrypted or unauthenticated.

    Raises:
        InvalidSpecError: no certificate and key, or neither tokens nor a client CA.
    """
    if not (settings.tls_cert_file and settings.tls_key_file):
        msg = (
            f"refusing to listen on {settings.listen_address} without TLS: set --tls-cert and --tls-key "
            "(SANDBOXD_TLS_CERT_FILE, SANDBOXD_TLS_KEY_FILE)"
        )
        raise InvalidSpecError(msg)
    if not (authenticator.required or settings.tls_client_ca_file):
        msg = (
            f"refusing to listen on {settings.listen_address} without authentication: set --tokens-file "
            "(bearer tokens) or --tls-client-ca (mutual TLS)"
        )
        raise InvalidSpecError(msg)
    pair = (_read_pem(settings.tls_key_file, "TLS key"), _read_pem(settings.tls_cert_file, "TLS certificate"))
    client_ca = _read_pem(settings.tls_client_ca_file, "client CA") if settings.tls_client_ca_file else None
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def _start_e2b(settings: Settings, authenticator: Authenticator) -> E2BServer | None:
    """The E2B plane's server, bound, when ``e2b_address`` is set (off loopback only with TLS and tokens).

    Cleartext is for a loopback address only; any other needs the TLS certificate and tokens.

    Raises:
        InvalidSpecError: a non-loopback address without TLS or tokens, or a malformed address.
        SandboxdError: the address cannot be bound.
    """
    address = settings.e2b_address
    if not address:
        return None
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit():
        msg = f"--e2b-listen {address!r} is not HOST:PORT"
        raise InvalidSpecError(msg)
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    tls = bool(settings.tls_cert_file and settings.tls_key_file)
    if not loopback and not (tls and authenticator.required):
        msg = (
            f"refusing to serve the E2B API on {address} without TLS and tokens: set --tls-cert, --tls-key "
            "and --tokens-file, or listen on a loopback address"
        )
        raise InvalidSpecError(msg)
    try:
        return E2BServer(
            address,
            settings.socket_path,
            base_image=e2b_image_ref(),
            max_timeout_s=settings.max_exec_timeout_s,
            certfile=settings.tls_cert_file if tls else None,
            keyfile=settings.tls_key_file if tls else None,
            max_upload_bytes=settings.template_context_bytes,
        )
    except OSError as exc:
        msg = f"cannot serve the E2B API on {address}: {exc.strerror or exc}"
        raise SandboxdError(msg) from None


def _prepare_socket(path: Path) -> None:
    """Create the socket's directory (0700, unless a shared sticky one) and clear a stale socket; refuse a live one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"cannot create the socket's directory {path.parent}: {exc.strerror}"
        raise SandboxdError(msg) from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        msg = (
            f"cannot create the socket in {path.parent}: uid {os.geteuid()} may not write there "
            "(give the directory to that uid, or choose another with --socket)"
        )
        raise SandboxdError(msg)
    parent = path.parent.stat()
    if parent.st_uid == os.geteuid() and not parent.st_mode & stat.S_ISVTX:
        # A shared sticky directory (/tmp, when root puts the socket there) is never narrowed:
        # the socket's own 0600 keeps others out, and the directory is everyone's.
        path.parent.chmod(0o700)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            msg = f"{path} exists and is not a socket; refusing to replace it"
            raise SandboxdError(msg)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # stale: nobody listens
        else:
            msg = f"another daemon is already listening on {path}"
            raise SandboxdError(msg)
        finally:
            probe.close()


async def _find_agent(
    settings: Settings, backend: Backend, progress: Callable[[str], None] | None
) -> AgentBuild | None:
    """The current agent, built when missing; None (logged) when it cannot be had."""
    try:
        return await ensure_agent(
            backend,
            route=settings.image_route,
            progress=progress or (lambda line: log.info("agent.progress", line=line)),
        )
    except SandboxdError as exc:
        log.error("agent.unavailable", error=exc.message)  # noqa: TRY400 - the message is the story
        return None


async def start(
    settings: Settings,
    backend: Backend,
    *,
    environ: Mapping[str, str] | None = None,
    agent: AgentBuild | None = None,
    progress: Callable[[str], None] | None = None,
) -> Daemon:
    """Build the servicers over ``backend``, clear orphans, adopt workspaces, and start listening.

    Args:
        settings: daemon settings.
        backend: the container engine.
        environ: the daemon's environment, read for ``SANDBOXD_SECRET_<NAME>`` secrets.
        agent: the in-container agent; None finds it (building it when missing, with
            ``progress`` lines). If it cannot be had the daemon serves anyway and creates fail,
            saying why.
        progress: receives agent-build progress lines.

    Raises:
        SandboxdError: the socket is taken, a port cannot be bound, TCP lacks TLS or
            authentication, or the tokens or secrets file cannot be read.
    """
    secret_store = SecretStore(settings.secrets_file, environ or {})
    authenticator = Authenticator(settings.tokens_file)
    authenticator.load()
    credentials = _tcp_credentials(settings, authenticator) if settings.listen_address else None
    audit = AuditLog(settings.audit_log, mask=secret_store.mask_text)
    # Before touching any container: a socket that cannot be made stops the start at once.
    socket_path = Path(settings.socket_path)
    await asyncio.to_thread(_prepare_socket, socket_path)
    lease = InstanceLease(
        backend,
        settings,
        [f"unix:{socket_path}", *([settings.listen_address] if settings.listen_address else [])],
        image=agent.image if agent is not None else "",
    )
    # First of all, before the agent is looked for (that runs a container): a second daemon is
    # refused at once, and another daemon's workspaces are never this one's to touch. The
    # agent's image may be missing yet (a first start builds it): the lease is asked for again.
    held = await lease.take(quiet=True)
    try:
        if agent is None:
            agent = await _find_agent(settings, backend, progress)
        processes = ProcessTable(backend, settings)
        workspaces = WorkspaceManager(backend, settings, processes, secrets=secret_store, agent=agent)
        workspaces.pool = WarmPool(  # a bad pool file stops the start
            workspaces.members,
            workspaces.pool_classes(),
            demand_memory_bytes=settings.pool_demand_memory_bytes,
            demand_idle_s=settings.pool_demand_idle_s,
            keep_on_close=settings.pool_on_stop == "keep",
        )
    except BaseException:
        await asyncio.shield(lease.release())
        raise
    try:
        await _adopt(backend, workspaces, audit, lease, held=held)
        lease.keep()
        workspaces.pool.start()
        listening = _Listening(settings, authenticator, audit, socket_path, credentials)
        return await listening.serve(backend, processes, workspaces, lease)
    except BaseException:
        # A start that fails (a port taken, say) must not keep the label from its next try.
        await asyncio.shield(_abandon_start(workspaces, lease))
        raise


async def _adopt(
    backend: Backend, workspaces: WorkspaceManager, audit: AuditLog, lease: InstanceLease, *, held: bool
) -> None:
    """Remove orphaned containers and adopt this instance's workspaces, once the lease is held.

    An engine that fails meanwhile is logged, not raised: it may be back later, and calls get
    UNAVAILABLE until then.
    """
    if not (held or await lease.take()):
        log.error("daemon.adopt_skipped", reason="the instance's lease is not held yet")
        return
    try:
        orphans = await backend.remove_orphans()
        if orphans:
            log.warning("daemon.orphans_removed", names=orphans)
        log.info("daemon.adopted", workspaces=await workspaces.adopt(audit))
    except SandboxdError as exc:
        # The engine may be down now and back later: serve anyway, calls get UNAVAILABLE meanwhile.
        log.error("daemon.adopt_failed", error=exc.message)  # noqa: TRY400


@dataclasses.dataclass(frozen=True)
class _Listening:
    """What the listening half of :func:`start` is given: who may call, what is recorded, where."""

    settings: Settings
    authenticator: Authenticator
    audit: AuditLog
    socket_path: Path
    credentials: grpc.ServerCredentials | None

    async def serve(
        self, backend: Backend, processes: ProcessTable, workspaces: WorkspaceManager, lease: InstanceLease
    ) -> Daemon:
        """Add the servicers to a new server, bind its addresses, start it and the metrics.

        Raises:
            SandboxdError: an address cannot be bound.
        """
        settings = self.settings
        trimmer = HeapTrimmer()
        drain = Drain()
        server = _new_server(server_interceptors(self.authenticator, self.audit, trimmer, drain))
        workspace_service_pb2_grpc.add_WorkspaceServiceServicer_to_server(
            WorkspaceServicer(workspaces, processes=processes), server
        )
        process_service_pb2_grpc.add_ProcessServiceServicer_to_server(ProcessServicer(workspaces, processes), server)
        files = FileManager(backend, workspaces)
        file_service_pb2_grpc.add_FileServiceServicer_to_server(FileServicer(files), server)
        network_service_pb2_grpc.add_NetworkServiceServicer_to_server(
            NetworkServicer(PortForwarder(workspaces), workspaces), server
        )
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
        addresses = _listen(server, self.socket_path, settings.listen_address, self.credentials)
        e2b = _start_e2b(settings, self.authenticator)
        metrics_server, gauges, looker = _start_metrics(settings, workspaces, processes, lease)
        await server.start()
        for name in ("", *SERVICE_NAMES):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        if e2b is not None:
            await e2b.start()
        log.info(
            "daemon.listening",
            addresses=addresses,
            instance=settings.instance,
            tokens=self.authenticator.required,
            mutual_tls=bool(settings.tls_client_ca_file),
            audit_log=settings.audit_log,
        )
        return Daemon(
            server=server,
            backend=backend,
            processes=processes,
            workspaces=workspaces,
            files=files,
            health=health_servicer,
            addresses=addresses,
            audit=self.audit,
            lease=lease,
            drain=drain,
            reaper=asyncio.create_task(_reap_forever(workspaces, self.audit, lease), name="idle-reaper"),
            trimmer=asyncio.create_task(trimmer.run(), name="heap-trimmer"),
            metrics=metrics_server,
            looker=looker,
            gauges=gauges,
            e2b=e2b,
        )


def _new_server(interceptors: Sequence[grpc.aio.ServerInterceptor]) -> grpc.aio.Server:
    """A grpc.aio server with the daemon's message bounds; calls go through ``interceptors``, outermost first."""
    return grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_send_message_length", _MAX_SEND_BYTES),
            # The largest legitimate request: anything bigger is refused by the transport before
            # it is parsed (RESOURCE_EXHAUSTED), and each RPC's own smaller cap is checked on the
            # raw bytes (see interceptors.bounds).
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )


def _start_metrics(
    settings: Settings, workspaces: WorkspaceManager, processes: ProcessTable, lease: InstanceLease
) -> tuple[MetricsServer | None, _Gauges | None, asyncio.Task[None] | None]:
    """With a metrics address: its server, this daemon's gauges, and the task that reads the engine.

    Returns:
        ``(server, gauges, looker)``, all None without ``settings.metrics_address``.
    """
    if not settings.metrics_address:
        return None, None, None
    metrics_server = serve_metrics(settings.metrics_address)
    gauges = _Gauges(workspaces, processes, lease)
    LIVE.sources.append(gauges)
    looker = asyncio.create_task(gauges.look_forever(), name="metrics-look")
    log.info("metrics.listening", address=metrics_server.address)
    return metrics_server, gauges, looker


def _listen(
    server: grpc.aio.Server, socket_path: Path, tcp_address: str, credentials: grpc.ServerCredentials | None
) -> list[str]:
    """Bind the Unix socket (0600) and, with credentials, the TCP address; return the addresses.

    Raises:
        SandboxdError: one of them cannot be bound.
    """
    addresses = []
    old_umask = os.umask(0o177)  # the socket is born 0600, not chmod-ed after the fact
    try:
        server.add_insecure_port(f"unix:{socket_path}")
    except RuntimeError as exc:
        msg = f"cannot listen on {socket_path}: {exc}"
        raise SandboxdError(msg) from None
    finally:
        os.umask(old_umask)
    os.chmod(socket_path, 0o600)  # belt and braces: some gRPC versions create it later
    addresses.append(f"unix:{socket_path}")
    if credentials is not None:
        try:
            port = server.add_secure_port(tcp_address, credentials)
        except RuntimeError:
            port = 0
        if port == 0:
            msg = f"cannot listen on {tcp_address}"
            raise SandboxdError(msg)
        host = tcp_address.rsplit(":", 1)[0]
        addresses.append(f"{host}:{port}")
    return addresses


async def _abandon_start(workspaces: WorkspaceManager, lease: InstanceLease) -> None:
    """Undo a start that failed after taking the lease: the pool's tasks, the agents' links, the lease."""
    with contextlib.suppress(Exception):
        if workspaces.pool is not None:
            await workspaces.pool.close()
        await workspaces.close()
    await lease.release()


async def _build_images(settings: Settings, backend: Backend, progress: Callable[[str], None] | None) -> None:
    """Find or build the workspace image and, at the same time, the agent's.

    The default workspace image (and E2B's, when its plane is on) and the agent's image are
    built at once on a first start: they share one Debian base and overlap after it. Neither
    runs a container, so both may come before the instance's lease.

    A failure is logged, not raised: the daemon serves anyway (workspaces on other images work,
    and a create says what is missing); the agent's is tried again, and reported, at its start.
    """
    say = progress or (lambda line: log.info("image.progress", line=line))

    async def workspace_images() -> None:
        try:
            await ensure_default_image(backend, settings.default_image, route=settings.image_route, progress=say)
            if settings.e2b_address:
                await ensure_e2b_image(backend, settings.default_image, route=settings.image_route, progress=say)
        except SandboxdError as exc:
            log.error("image.unavailable", image=settings.default_image, error=exc.message)  # noqa: TRY400

    async def agent_image() -> None:
        with contextlib.suppress(SandboxdError):
            await ensure_agent_image(backend, route=settings.image_route, progress=say)

    await asyncio.gather(workspace_images(), agent_image())


async def serve(
    settings: Settings,
    backend: Backend,
    *,
    build_image: bool = True,
    progress: Callable[[str], None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Run the daemon until SIGTERM or SIGINT, then stop gracefully.

    Args:
        settings: daemon settings.
        backend: the container engine.
        build_image: find or build the default workspace image before serving.
        progress: receives image-build progress lines.
        environ: the daemon's environment (``SANDBOXD_SECRET_<NAME>`` secrets).
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(number: int) -> None:
        if stop.is_set():
            # A second SIGTERM (or Ctrl-C) must not cut the drain short: commands and streams
            # would lose what the grace is for. SIGKILL is there for an immediate end.
            log.warning("daemon.already_stopping", signal=signal.Signals(number).name)
        stop.set()

    # From the first moment: a signal during the start (an image build) is a graceful stop too.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        if build_image and settings.build_default_image:
            await _build_images(settings, backend, progress)
        if stop.is_set():
            return  # stopped before it served: nothing to drain
        daemon = await start(settings, backend, environ=environ, progress=progress)
        # A signal, or the lease gone to another daemon (after an engine restart): either ends it.
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(daemon.lease.taken.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            log.info("daemon.stopping", grace_s=settings.shutdown_grace_s)
            await daemon.stop(settings.shutdown_grace_s)
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(Path(settings.socket_path).unlink)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
    if daemon.lease.taken.is_set():
        raise SandboxdError(daemon.lease.refusal)
