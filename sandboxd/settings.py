"""Daemon configuration: one frozen dataclass, read from a mapping, never at import time."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Literal, get_args, get_origin, get_type_hints

from sandboxd_protocol.paths import default_socket_path

from .errors import InvalidSpecError, quoted

__all__ = ["ImageRoute", "Settings"]

ImageRoute = Literal["auto", "registry", "offline"]
LogFormat = Literal["auto", "json", "console"]

_GIB = 1024**3
_MIB = 1024**2


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the daemon can be told. Every field maps to ``SANDBOXD_<FIELD>``."""

    socket_path: str = ""
    """Unix socket to listen on (mode 0600); empty means ``default_socket_path()``."""

    listen_address: str = ""
    """Optional ``HOST:PORT`` to listen on over TCP in addition to the socket."""

    docker_host: str = "unix:///var/run/docker.sock"
    """Docker engine address (``unix://`` or ``tcp://``); ``DOCKER_HOST`` also sets it."""

    instance: str = "default"
    """Label value that marks this daemon's containers; two daemons on one engine differ here."""

    default_image: str = "sandboxd/base:bookworm"
    """Image for workspaces that name none."""

    build_default_image: bool = True
    """Build the default image on start when it is missing or its recipe changed."""

    image_route: ImageRoute = "auto"
    """How to get the Debian base: a registry pull, an offline debootstrap, or try both."""

    default_memory_bytes: int = 1 * _GIB
    """Memory limit of a workspace that sets none, in bytes."""

    default_cpu_millis: int = 1000
    """CPU quota of a workspace that sets none, in thousandths of a CPU."""

    default_pids: int = 512
    """Process/thread limit of a workspace that sets none."""

    default_disk_bytes: int = 0
    """Size cap of /workspace for workspaces that set none, in bytes; 0 means no cap."""

    max_memory_bytes: int = 16 * _GIB
    """Largest memory limit a caller may ask for, in bytes."""

    exec_timeout_s: float = 1800.0
    """Timeout of a command that sets none, in seconds."""

    max_exec_timeout_s: float = 86400.0
    """Longest timeout a caller may ask for, in seconds."""

    output_buffer_bytes: int = 1 * _MIB
    """Undelivered output held per process before dropping, in bytes."""

    max_output_buffer_bytes: int = 16 * _MIB
    """Largest ``max_output_bytes`` a caller may ask for, in bytes."""

    output_memory_bytes: int = 256 * _MIB
    """The daemon's budget for command output it holds, in bytes: output on its way from the
    agents to the calls streaming it, and output of sessions nobody streams. Callers reading
    at once share it (each is let at least 256 KiB ahead of what it has taken); past it, the
    output a session nobody streams has received is let go and sent again by its agent,
    which keeps every byte until a caller takes it. Commands are never refused for it."""

    workspace_max_sessions: int = 64
    """Live process sessions per workspace (one agent's: its background commands and the
    exited ones whose output is still kept): a new command past it evicts the workspace's
    least recently used exited session, else its least recently used idle one; when every
    one is in use by a call it is refused."""

    kill_grace_s: float = 2.0
    """Time between SIGTERM and SIGKILL when a command is killed, in seconds."""

    heartbeat_interval_s: float = 15.0
    """Longest silence on an Exec/Input stream before a heartbeat event, in seconds."""

    shutdown_grace_s: float = 5.0
    """Time in-flight calls get to finish on SIGTERM, in seconds."""

    docker_timeout_s: float = 60.0
    """Timeout of a single Docker API call, in seconds."""

    docker_retries: bool = True
    """Retry idempotent Docker calls on transient failures (tests may turn it off)."""

    log_level: str = "info"
    """Lowest log level written."""

    log_format: LogFormat = "auto"
    """``json`` off a terminal and ``console`` on one when ``auto``."""

    tokens_file: str = ""
    """Bearer tokens (hashed) and their tenants; when set, every call must carry a token."""

    tls_cert_file: str = ""
    """PEM server certificate for the TCP listener (TCP refuses to start without TLS)."""

    tls_key_file: str = ""
    """PEM private key of ``tls_cert_file``."""

    tls_client_ca_file: str = ""
    """PEM CA bundle; when set, TCP clients must present a certificate it signed (mutual TLS)."""

    audit_log: str = ""
    """JSON-lines audit trail of every state-changing call; empty means the default path
    (``/var/lib/sandboxd/audit.jsonl`` as root, ``~/.local/state/sandboxd/audit.jsonl`` otherwise);
    ``off`` disables it."""

    secrets_file: str = ""
    """JSON object of secret names to values, for ``secret:NAME`` env references
    (``SANDBOXD_SECRET_<NAME>`` in the daemon's environment also works)."""

    default_runtime: Literal["runc", "runsc"] = "runc"
    """OCI runtime of workspaces that name none."""

    runsc_network: bool = False
    """Whether the engine's runsc can join Docker networks. ``scripts/install-runsc`` registers it
    with ``--network=none`` (it cannot on engines like this one), so bridge workspaces under runsc
    are refused rather than silently left offline."""

    metrics_address: str = ""
    """``HOST:PORT`` to serve Prometheus metrics on (``/metrics``); empty: none. Loopback unless
    told: the endpoint has no authentication."""

    e2b_address: str = ""
    """``HOST:PORT`` to serve the E2B-compatible API on (REST control plane and envd, one port);
    empty: none. Cleartext only on a loopback address; elsewhere it needs the TLS certificate
    and the tokens file, as ``listen_address`` does."""

    egress_network: str = "bridge"
    """The Docker network ALLOWLIST workspaces' egress proxies reach the world through (the proxy
    resolves names there: on a network of your own, its containers' names and aliases)."""

    agent_transport: Literal["auto", "bridge"] = "auto"
    """How the daemon reaches a workspace's agent. ``auto``: straight to the agent's socket where
    this machine sees it (an engine on a local Unix socket, a daemon that is root, a runtime that
    shows the container's sockets on the host: runc, or runsc with ``--host-uds=create``), else
    through one ``docker exec`` of the bridge; ``bridge``: always the bridge."""

    pool_size: int = 2
    """Started, idle workspaces of the default spec kept ready for CreateWorkspace (the warm pool's
    ``default`` class); 0 keeps none."""

    pool_on_stop: Literal["keep", "remove"] = "keep"
    """What a daemon that stops does with its configured classes' ready members: ``keep`` them
    for its next start (which takes them back, saving their starts), or ``remove`` them, so that
    the engine holds none of this daemon's containers once it has stopped (demand members always
    go). A daemon killed outright removes nothing; its next start does."""

    pool_file: str = ""
    """YAML list of more warm-pool classes (``sandboxd.pool.read_pool_file``); empty: none."""

    pool_demand_memory_bytes: int = 2 * _GIB
    """Budget of the warm pool's demand classes, in bytes of their members' memory limits: a spec
    that no class serves and that CreateWorkspace is asked for again (another runtime, image or
    limit) gets warm members of its own within it (``sandboxd.pool``); 0 makes none."""

    pool_demand_idle_s: float = 600.0
    """A demand class nobody asked for in this long, in seconds, is let go with its members."""

    default_idle_ttl_s: float = 0.0
    """Remove a workspace after this long without calls, in seconds; 0 means never."""

    tenant_max_workspaces: int = 0
    """Most workspaces one tenant may have at once; 0 means no limit."""

    tenant_max_memory_bytes: int = 0
    """Most memory, summed over one tenant's workspace limits, in bytes; 0 means no limit."""

    max_snapshot_bytes: int = 16 * _GIB
    """Largest /workspace a snapshot takes, as an archive, in bytes (a capped workspace's bound is
    about twice its cap): a sparse file counts at its full length."""

    snapshot_sweep_s: float = 60.0
    """How often what a snapshot cut short left (a daemon killed mid-snapshot: the engine finishes
    its commit or checkpoint after the next daemon's start) is looked for and removed, in seconds."""

    tenant_max_snapshots: int = 0
    """Most snapshots one tenant may keep; 0 means no limit."""

    template_build_timeout_s: float = 1800.0
    """Longest a template build may take (BuildTemplate's own timeout may be shorter), in seconds."""

    template_context_bytes: int = 1 * _GIB
    """Largest build context a template build accepts, in bytes; refused as it arrives past that."""

    template_build_network: Literal["default", "none"] = "default"
    """The network of template build steps: the engine's default bridge (what package installs
    need; the steps reach what the host's containers reach), or none."""

    template_build_memory_bytes: int = 4 * _GIB
    """Memory each step of a template build may use, in bytes."""

    template_ready_timeout_s: float = 120.0
    """Longest a workspace started from a template waits for its ready command to succeed, in seconds."""

    template_max_bytes: int = 16 * _GIB
    """Largest image a template build may make, in bytes; a bigger one is removed and the build fails."""

    tenant_max_sessions: int = 0
    """Live process sessions per tenant across its workspaces; 0 means no cap but each
    workspace's. Past it, a new command evicts the tenant's own sessions as a full workspace
    does, and is refused when all are in use by calls."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: object) -> Settings:
        """Build settings from ``SANDBOXD_*`` variables in ``environ``, then ``overrides``.

        Args:
            environ: the environment mapping (pass ``os.environ`` explicitly).
            **overrides: field values that win over the environment (e.g. CLI flags);
                ``None`` values are ignored.

        Returns:
            The settings, with ``socket_path`` resolved.

        Raises:
            InvalidSpecError: a value does not parse as its field's type, or a setting that is gone is set.
        """
        for name, instead in _GONE.items():
            if name in environ:
                msg = f"{name} is no longer read: {instead}"
                raise InvalidSpecError(msg)
        hints = get_type_hints(cls)
        values: dict[str, object] = {}
        if "DOCKER_HOST" in environ:
            values["docker_host"] = environ["DOCKER_HOST"]
        for field in dataclasses.fields(cls):
            raw = environ.get(f"SANDBOXD_{field.name.upper()}")
            if raw is not None:
                values[field.name] = _parse(field.name, hints[field.name], raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)  # type: ignore[arg-type]
        if not _INSTANCE_RE.fullmatch(settings.instance):
            # It names containers (sandboxd-<instance>-<id>, the lease): the engine's rule for names.
            msg = (
                f"instance {quoted(settings.instance)} is not a valid instance label: 1-63 of letters, digits, "
                "'_', '.' and '-', starting with a letter or digit"
            )
            raise InvalidSpecError(msg)
        if not settings.socket_path:
            settings = dataclasses.replace(settings, socket_path=default_socket_path(environ))
        if not settings.audit_log:
            settings = dataclasses.replace(settings, audit_log=default_audit_path(environ))
        return settings


def default_audit_path(environ: Mapping[str, str]) -> str:
    """Where the audit trail goes when no path is set."""
    if os.geteuid() == 0:
        return "/var/lib/sandboxd/audit.jsonl"
    home = environ.get("HOME") or os.path.expanduser("~")
    state = environ.get("XDG_STATE_HOME") or os.path.join(home, ".local", "state")
    return os.path.join(state, "sandboxd", "audit.jsonl")


_GONE = {
    "SANDBOXD_MAX_SESSIONS": (
        "the process session cap is per workspace (SANDBOXD_WORKSPACE_MAX_SESSIONS, default 64; "
        "SANDBOXD_TENANT_MAX_SESSIONS caps a tenant), and the daemon as a whole is bounded by the memory "
        "its held output may take (SANDBOXD_OUTPUT_MEMORY_BYTES); unset it"
    ),
}
"""Settings an earlier release read, and what took their place: a daemon told one refuses to
start rather than run without it silently."""

_INSTANCE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _parse(name: str, kind: object, raw: str) -> object:
    value: object = raw
    if kind is bool:
        lowered = raw.strip().lower()
        value = True if lowered in _TRUE else False if lowered in _FALSE else None
    elif kind in (int, float):
        try:
            value = kind(raw)
        except ValueError:
            value = None
    elif get_origin(kind) is Literal and raw not in get_args(kind):
        value = None
    if value is None:
        msg = f"SANDBOXD_{name.upper()}={raw!r} is not a valid value"
        raise InvalidSpecError(msg)
    return value
