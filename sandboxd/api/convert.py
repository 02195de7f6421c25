"""Pure functions between protobuf messages and domain objects; no I/O here."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import TypeVar

from google.protobuf import duration_pb2, timestamp_pb2
from sandboxd_protocol.v1 import process_service_pb2 as ppb
from sandboxd_protocol.v1 import workspace_service_pb2 as wpb

from ..errors import InvalidSpecError
from ..models import (
    EgressRule,
    ExecEvent,
    ExecSpec,
    ExecStarted,
    ExitStatus,
    Heartbeat,
    IdleAction,
    NetworkPolicy,
    OutputChunk,
    OutputDropped,
    ResourceLimits,
    Runtime,
    SecurityOptions,
    Snapshot,
    StopReason,
    Workspace,
    WorkspaceSpec,
    WorkspaceState,
    Yielded,
)
from ..pool import PoolStatus
from ..workspaces.specs import check_user

__all__ = [
    "duration_s",
    "exec_response",
    "exec_spec",
    "exit_to_proto",
    "input_response",
    "pool_class_to_proto",
    "snapshot_to_proto",
    "workspace_spec",
    "workspace_to_proto",
]

_NETWORK_FROM_PB = {
    wpb.NETWORK_POLICY_UNSPECIFIED: None,
    wpb.NETWORK_POLICY_NONE: NetworkPolicy.NONE,
    wpb.NETWORK_POLICY_BRIDGE: NetworkPolicy.BRIDGE,
    wpb.NETWORK_POLICY_ALLOWLIST: NetworkPolicy.ALLOWLIST,
}
_NETWORK_TO_PB = {
    None: wpb.NETWORK_POLICY_UNSPECIFIED,
    NetworkPolicy.NONE: wpb.NETWORK_POLICY_NONE,
    NetworkPolicy.BRIDGE: wpb.NETWORK_POLICY_BRIDGE,
    NetworkPolicy.ALLOWLIST: wpb.NETWORK_POLICY_ALLOWLIST,
}
_RUNTIME_FROM_PB = {wpb.RUNTIME_UNSPECIFIED: None, wpb.RUNTIME_RUNC: Runtime.RUNC, wpb.RUNTIME_RUNSC: Runtime.RUNSC}
_RUNTIME_TO_PB = {None: wpb.RUNTIME_UNSPECIFIED, Runtime.RUNC: wpb.RUNTIME_RUNC, Runtime.RUNSC: wpb.RUNTIME_RUNSC}
_STATE_TO_PB = {
    WorkspaceState.RUNNING: wpb.WORKSPACE_STATE_RUNNING,
    WorkspaceState.STOPPED: wpb.WORKSPACE_STATE_STOPPED,
    WorkspaceState.PAUSED: wpb.WORKSPACE_STATE_PAUSED,
}
_IDLE_FROM_PB = {
    wpb.IDLE_ACTION_UNSPECIFIED: None,
    wpb.IDLE_ACTION_DELETE: IdleAction.DELETE,
    wpb.IDLE_ACTION_PAUSE: IdleAction.PAUSE,
}
_IDLE_TO_PB = {
    None: wpb.IDLE_ACTION_UNSPECIFIED,
    IdleAction.DELETE: wpb.IDLE_ACTION_DELETE,
    IdleAction.PAUSE: wpb.IDLE_ACTION_PAUSE,
}
_STOP_TO_PB = {
    StopReason.EXITED: ppb.STOP_REASON_EXITED,
    StopReason.INTERRUPTED: ppb.STOP_REASON_INTERRUPTED,
    StopReason.TIMEOUT: ppb.STOP_REASON_TIMEOUT,
    StopReason.FAILED: ppb.STOP_REASON_FAILED,
    StopReason.KILLED: ppb.STOP_REASON_KILLED,
}


_MAX_NANOS = 999_999_999


def duration_s(value: duration_pb2.Duration, field: str = "duration", *, high_s: float | None = None) -> float:
    """Return a Duration in seconds, checked as ``field``.

    A well-formed Duration (google/protobuf/duration.proto) has ``nanos`` within
    ±999,999,999 and of the same sign as ``seconds``.

    Raises:
        InvalidSpecError: the Duration is malformed, negative, or longer than ``high_s``.
    """
    if abs(value.nanos) > _MAX_NANOS or (value.seconds and value.nanos and (value.seconds < 0) != (value.nanos < 0)):
        msg = (
            f"{field} is not a well-formed Duration: nanos must be within ±{_MAX_NANOS:,} and of the "
            f"sign of seconds (got seconds={value.seconds}, nanos={value.nanos})"
        )
        raise InvalidSpecError(msg)
    seconds = value.seconds + value.nanos / 1e9
    if seconds < 0:
        msg = f"{field} must not be negative, got {seconds:g} s"
        raise InvalidSpecError(msg)
    if high_s is not None and seconds > high_s:
        msg = f"{field} must be at most {high_s:g} s, got {seconds:g} s"
        raise InvalidSpecError(msg)
    return seconds


def _duration(seconds: float) -> duration_pb2.Duration:
    result = duration_pb2.Duration()
    result.FromNanoseconds(round(seconds * 1e9))
    return result


def _timestamp(moment: datetime.datetime) -> timestamp_pb2.Timestamp:
    result = timestamp_pb2.Timestamp()
    result.FromDatetime(moment)
    return result


def _enum(table: dict, value: int, field: str) -> object:  # type: ignore[type-arg]
    try:
        return table[value]
    except KeyError:
        msg = f"{field} has unknown value {value}"
        raise InvalidSpecError(msg) from None


def egress_rules(messages: Iterable[wpb.EgressRule]) -> tuple[EgressRule, ...]:
    """The domain rules of an allowlist (checked by ``egress.check_rules``)."""
    return tuple(EgressRule(host=message.host, ports=tuple(message.ports)) for message in messages)


def network_policy(value: int) -> NetworkPolicy | None:
    """A NetworkPolicy value; unknown ones are INVALID_ARGUMENT."""
    return _enum(_NETWORK_FROM_PB, value, "network")  # type: ignore[return-value]


def workspace_spec(message: wpb.WorkspaceSpec) -> WorkspaceSpec:
    """Return the domain spec of a request; enum values outside the proto are rejected."""
    return WorkspaceSpec(
        image=message.image,
        env=dict(message.env),
        working_dir=message.working_dir,
        labels=dict(message.labels),
        limits=ResourceLimits(
            memory_bytes=message.limits.memory_bytes,
            cpu_millis=message.limits.cpu_millis,
            pids=message.limits.pids,
            disk_bytes=message.limits.disk_bytes,
        ),
        network=_enum(_NETWORK_FROM_PB, message.network, "network"),  # type: ignore[arg-type]
        allowed_hosts=egress_rules(message.allowed_hosts),
        runtime=_enum(_RUNTIME_FROM_PB, message.runtime, "runtime"),  # type: ignore[arg-type]
        idle_ttl_s=duration_s(message.idle_ttl, "idle_ttl") if message.HasField("idle_ttl") else None,
        security=SecurityOptions(
            added_capabilities=tuple(message.security.added_capabilities),
            allow_new_privileges=message.security.allow_new_privileges,
            user=message.security.user,
            read_only_root_filesystem=message.security.read_only_root_filesystem,
            root_capabilities=tuple(message.security.root_capabilities),
        ),
        idle_action=_enum(_IDLE_FROM_PB, message.idle_action, "idle_action"),  # type: ignore[arg-type]
        auto_resume=message.auto_resume if message.HasField("auto_resume") else None,
        lifetime_s=duration_s(message.lifetime, "lifetime") if message.HasField("lifetime") else None,
    )


def _spec_to_proto(spec: WorkspaceSpec) -> wpb.WorkspaceSpec:
    message = wpb.WorkspaceSpec(
        image=spec.image,
        env=dict(spec.env),
        working_dir=spec.working_dir,
        labels=dict(spec.labels),
        limits=wpb.ResourceLimits(
            memory_bytes=spec.limits.memory_bytes,
            cpu_millis=spec.limits.cpu_millis,
            pids=spec.limits.pids,
            disk_bytes=spec.limits.disk_bytes,
        ),
        network=_NETWORK_TO_PB[spec.network],
        allowed_hosts=[wpb.EgressRule(host=rule.host, ports=list(rule.ports)) for rule in spec.allowed_hosts],
        runtime=_RUNTIME_TO_PB[spec.runtime],
        security=wpb.SecurityOptions(
            added_capabilities=list(spec.security.added_capabilities),
            allow_new_privileges=spec.security.allow_new_privileges,
            user=spec.security.user,
            read_only_root_filesystem=spec.security.read_only_root_filesystem,
            root_capabilities=list(spec.security.root_capabilities),
        ),
        idle_action=_IDLE_TO_PB[spec.idle_action],
    )
    if spec.idle_ttl_s is not None:
        message.idle_ttl.CopyFrom(_duration(spec.idle_ttl_s))
    if spec.auto_resume is not None:
        message.auto_resume = spec.auto_resume
    if spec.lifetime_s:
        message.lifetime.CopyFrom(_duration(spec.lifetime_s))
    return message


def workspace_to_proto(workspace: Workspace) -> wpb.Workspace:
    """Return the wire form of a workspace."""
    message = wpb.Workspace(
        workspace_id=workspace.workspace_id,
        spec=_spec_to_proto(workspace.spec),
        state=_STATE_TO_PB[workspace.state],
        create_time=_timestamp(workspace.create_time),
        container_id=workspace.container_id,
        volume_name=workspace.volume_name,
        from_snapshot=workspace.from_snapshot,
    )
    if workspace.expire_time is not None:
        message.expire_time.CopyFrom(_timestamp(workspace.expire_time))
    return message


def snapshot_to_proto(snapshot: Snapshot) -> wpb.Snapshot:
    """Return the wire form of a snapshot."""
    return wpb.Snapshot(
        name=snapshot.name,
        source_workspace_id=snapshot.source_workspace_id,
        create_time=_timestamp(snapshot.create_time),
        labels=dict(snapshot.labels),
        size_bytes=snapshot.size_bytes,
        spec=_spec_to_proto(snapshot.spec),
        include_memory=snapshot.include_memory,
        memory_bytes=snapshot.memory_bytes,
        start_command=snapshot.start_command,
        ready_command=snapshot.ready_command,
        build_digest=snapshot.build_digest,
    )


def exec_spec(request: ppb.ExecRequest) -> ExecSpec:
    """Return the domain spec of an ExecRequest."""
    if request.max_output_bytes < 0:
        msg = f"max_output_bytes must not be negative, got {request.max_output_bytes}"
        raise InvalidSpecError(msg)
    size = request.terminal_size
    return ExecSpec(
        command=request.command,
        workdir=request.workdir,
        env=dict(request.env),
        yield_after_s=duration_s(request.yield_after, "yield_after") if request.HasField("yield_after") else None,
        timeout_s=duration_s(request.timeout, "timeout") if request.HasField("timeout") else None,
        max_output_bytes=request.max_output_bytes,
        tty=request.tty,
        columns=size.columns or 80,
        rows=size.rows or 24,
        spill_after_bytes=request.spill_after_bytes,
        merge_stderr=request.merge_stderr,
        user=check_user(request.user, "user"),
        stdin_closed=request.stdin_closed,
    )


def exit_to_proto(status: ExitStatus) -> ppb.ExecExited:
    """Return the wire form of a terminal status."""
    return ppb.ExecExited(
        exit_code=status.exit_code,
        signal=status.signal,
        stop_reason=_STOP_TO_PB[status.stop_reason],
        oom_killed=status.oom_killed,
        memory_limit_bytes=status.memory_limit_bytes,
        dropped_bytes=status.dropped_bytes,
        elapsed=_duration(status.elapsed_s),
        message=status.message,
        spill_path=status.spill_path,
    )


_Response = TypeVar("_Response", ppb.ExecResponse, ppb.InputResponse)


def _fill(response: _Response, event: ExecEvent) -> _Response:
    """Set ``event`` in ``response`` (an Exec's or an Input's: their events have the same fields).

    In place, each field set once: building the inner message first and copying it in would
    copy every output chunk twice more.
    """
    match event:
        case OutputChunk():
            if event.stream == "stderr":
                response.output.stderr = event.data
            else:
                response.output.stdout = event.data
            response.output.position = event.position
        case OutputDropped():
            response.dropped.dropped_bytes = event.dropped_bytes
            response.dropped.position = event.position
        case ExitStatus():
            response.exited.CopyFrom(exit_to_proto(event))
        case Yielded():
            response.yielded.process_id = event.process_id
            response.yielded.elapsed.CopyFrom(_duration(event.elapsed_s))
        case Heartbeat():
            response.heartbeat.elapsed.CopyFrom(_duration(event.elapsed_s))
        case _:
            msg = f"unexpected event {event!r}"
            raise AssertionError(msg)
    return response


def exec_response(event: ExecEvent) -> ppb.ExecResponse:
    """Return the ExecResponse carrying ``event``."""
    if isinstance(event, ExecStarted):
        return ppb.ExecResponse(
            started=ppb.ExecStarted(process_id=event.process_id, pid=event.pid, start_time=_timestamp(event.start_time))
        )
    return _fill(ppb.ExecResponse(), event)


def input_response(event: ExecEvent) -> ppb.InputResponse:
    """Return the InputResponse carrying ``event`` (never ``started``)."""
    if isinstance(event, ExecStarted):
        msg = "an Input stream has no started event"
        raise TypeError(msg)
    return _fill(ppb.InputResponse(), event)


def pool_class_to_proto(status: PoolStatus) -> wpb.PoolClass:
    """Return the wire form of a pool class and its counts."""
    return wpb.PoolClass(
        name=status.pool_class.name,
        spec=_spec_to_proto(status.pool_class.spec),
        size=status.pool_class.size,
        ready=status.ready,
        starting=status.starting,
        claims=status.claims,
        misses=status.misses,
    )
