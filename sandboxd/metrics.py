"""Prometheus metrics of the daemon, with prometheus_client (never hand-written exposition).

Off unless ``SANDBOXD_METRICS_ADDRESS`` / ``--metrics-listen HOST:PORT`` is set; then
``/metrics`` is served there (the loopback unless told otherwise). Label values are few and
fixed: RPC method names, gRPC code names, runtimes, outcome words. Never a workspace id, a
process id or a tenant token, so the number of series stays bounded whatever callers do.

The metric objects live in this module's own registry: several daemons in one process (the
test suite's) count into the same series, which one exposition serves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .errors import InvalidSpecError

__all__ = [
    "AUDIT_WRITE_FAILURES",
    "DOCKER_CALLS",
    "DOCKER_RETRIES",
    "EGRESS_DENIALS",
    "EXEC_START_SECONDS",
    "FORWARDS_OPEN",
    "FORWARD_BYTES",
    "LIVE",
    "OOM_KILLS",
    "OUTPUT_BYTES",
    "OUTPUT_DROPPED_BYTES",
    "OUTPUT_GIVEN_BACK_BYTES",
    "PROCESS_ENDS",
    "REGISTRY",
    "RPC_REQUESTS",
    "RPC_SECONDS",
    "SESSIONS_EVICTED",
    "MetricsServer",
    "Samples",
    "serve_metrics",
]

REGISTRY = CollectorRegistry(auto_describe=True)

RPC_REQUESTS = Counter(
    "sandboxd_rpc_requests", "RPCs finished, by method and gRPC code.", ["method", "code"], registry=REGISTRY
)
RPC_SECONDS = Histogram(
    "sandboxd_rpc_duration_seconds",
    "How long RPCs took, by method (a stream: until it ended).",
    ["method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
EXEC_START_SECONDS = Histogram(
    "sandboxd_exec_start_seconds",
    "From an Exec call's arrival to its command running (the started event).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
OUTPUT_BYTES = Counter(
    "sandboxd_output_bytes", "Command output bytes streamed to callers, by stream.", ["stream"], registry=REGISTRY
)
OUTPUT_DROPPED_BYTES = Counter(
    "sandboxd_output_dropped_bytes", "Command output bytes dropped because nobody read them.", registry=REGISTRY
)
PROCESS_ENDS = Counter(
    "sandboxd_process_ends",
    "Commands whose end a caller saw, by stop reason (exited, interrupted, timeout, killed, failed).",
    ["stop_reason"],
    registry=REGISTRY,
)
OOM_KILLS = Counter(
    "sandboxd_oom_kills", "Commands whose end a caller saw that the OOM killer had a hand in.", registry=REGISTRY
)
FORWARDS_OPEN = Gauge("sandboxd_forwards_open", "Forwarded connections open now.", registry=REGISTRY)
FORWARD_BYTES = Counter(
    "sandboxd_forward_bytes", "Bytes carried by forwarded connections, by direction.", ["direction"], registry=REGISTRY
)
EGRESS_DENIALS = Counter(
    "sandboxd_egress_denials", "Requests the allowlist workspaces' egress proxies refused.", registry=REGISTRY
)
DOCKER_CALLS = Counter(
    "sandboxd_docker_calls",
    "Docker engine calls, by outcome (ok, not_found, unavailable, error).",
    ["outcome"],
    registry=REGISTRY,
)
DOCKER_RETRIES = Counter("sandboxd_docker_retries", "Docker engine calls tried again.", registry=REGISTRY)
AUDIT_WRITE_FAILURES = Counter(
    "sandboxd_audit_write_failures", "Audit records that could not be written.", registry=REGISTRY
)
SESSIONS_EVICTED = Counter(
    "sandboxd_sessions_evicted", "Process sessions evicted to make room for new ones.", registry=REGISTRY
)
OUTPUT_GIVEN_BACK_BYTES = Counter(
    "sandboxd_output_given_back_bytes",
    "Output of sessions nobody streamed that the daemon let go past its budget (their agents send it again).",
    registry=REGISTRY,
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Gauge values by (metric name, sorted labels)."""

_GAUGES = {
    "sandboxd_workspaces": (
        "Workspaces, by state and runtime (as of the last look, every 15 s).",
        ["state", "runtime"],
    ),
    "sandboxd_engine_up": ("1 when the Docker engine answered the last look, else 0.", []),
    "sandboxd_lease_held": ("1 while the daemon holds its instance label's lease on the engine, else 0.", []),
    "sandboxd_sessions": ("Process sessions the daemon holds, by state (running, exited).", ["state"]),
    "sandboxd_output_held_bytes": (
        "Command output the daemon holds for callers now, in bytes (its budget: SANDBOXD_OUTPUT_MEMORY_BYTES).",
        [],
    ),
    "sandboxd_pool_members": ("Warm pool members, by class and state (ready, starting).", ["pool_class", "state"]),
}


class _Live(Collector):
    """Gauges read at each scrape from what the daemons in this process hold (summed across them)."""

    def __init__(self) -> None:
        self.sources: list[Callable[[], Samples]] = []

    def collect(self) -> Iterator[Metric]:
        totals: Samples = {}
        for source in list(self.sources):
            for key, amount in source().items():
                totals[key] = totals.get(key, 0.0) + amount
        for name, (documentation, labels) in _GAUGES.items():
            family = GaugeMetricFamily(name, documentation, labels=labels)
            for (metric, found), amount in sorted(totals.items()):
                if metric == name:
                    family.add_metric([dict(found).get(label, "") for label in labels], amount)
            yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


LIVE = _Live()
"""Where a daemon adds (and at its stop removes) the function that reports its gauges."""
REGISTRY.register(LIVE)


class MetricsServer:
    """The running ``/metrics`` endpoint: its address, and how to stop it."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        """Wrap what prometheus_client started."""
        self._server, self._thread = server, thread
        host, port = server.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_metrics(address: str) -> MetricsServer:
    """Serve ``/metrics`` on ``HOST:PORT`` (port 0: any free one).

    Raises:
        InvalidSpecError: the address is not ``HOST:PORT``, or cannot be listened on.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        server, thread = start_http_server(int(port), addr=host, registry=REGISTRY)
    except ValueError:
        msg = f"SANDBOXD_METRICS_ADDRESS={address!r} is not HOST:PORT"
        raise InvalidSpecError(msg) from None
    except OSError as exc:
        msg = f"cannot serve metrics on {address}: {exc.strerror or exc}"
        raise InvalidSpecError(msg) from None
    return MetricsServer(server, thread)
