"""Proto <-> domain conversions (no Docker)."""

from __future__ import annotations

import datetime

import pytest
from sandboxd_protocol.v1 import process_service_pb2 as ppb
from sandboxd_protocol.v1 import workspace_service_pb2 as wpb

from sandboxd.api import convert
from sandboxd.errors import InvalidSpecError
from sandboxd.models import (
    ExecStarted,
    ExitStatus,
    NetworkPolicy,
    OutputChunk,
    OutputDropped,
    Runtime,
    StopReason,
    Yielded,
)


class TestRequests:
    def test_workspace_spec(self) -> None:
        """Every field of a WorkspaceSpec message reaches the domain spec."""
        message = wpb.WorkspaceSpec(
            image="img:1",
            env={"A": "1"},
            labels={"k": "v"},
            network=wpb.NETWORK_POLICY_BRIDGE,
            runtime=wpb.RUNTIME_RUNSC,
            limits=wpb.ResourceLimits(memory_bytes=5, cpu_millis=6, pids=7),
            security=wpb.SecurityOptions(
                added_capabilities=["NET_RAW"], allow_new_privileges=True, user="u", root_capabilities=["CHOWN"]
            ),
        )
        message.idle_ttl.FromSeconds(90)
        spec = convert.workspace_spec(message)
        assert (spec.image, spec.env, spec.labels) == ("img:1", {"A": "1"}, {"k": "v"})
        assert (spec.network, spec.runtime, spec.idle_ttl_s) == (NetworkPolicy.BRIDGE, Runtime.RUNSC, 90.0)
        assert (spec.limits.memory_bytes, spec.limits.cpu_millis, spec.limits.pids) == (5, 6, 7)
        assert spec.security.added_capabilities == ("NET_RAW",)
        assert spec.security.root_capabilities == ("CHOWN",)
        assert spec.security.allow_new_privileges and spec.security.user == "u"

    def test_an_exec_s_user(self) -> None:
        """ExecRequest.user reaches the spec; text that is no user name, uid or uid:gid is refused."""
        assert convert.exec_spec(ppb.ExecRequest(command="x", user="root")).user == "root"
        assert convert.exec_spec(ppb.ExecRequest(command="x", user="1000:27")).user == "1000:27"
        assert convert.exec_spec(ppb.ExecRequest(command="x")).user == ""
        for bad in ("a b", "root;id", ":0", "x" * 40):
            with pytest.raises(InvalidSpecError, match=r"^user "):
                convert.exec_spec(ppb.ExecRequest(command="x", user=bad))

    def test_unset_duration_is_none(self) -> None:
        """An unset idle_ttl and yield_after mean "default", not zero."""
        assert convert.workspace_spec(wpb.WorkspaceSpec()).idle_ttl_s is None
        assert convert.exec_spec(ppb.ExecRequest(command="x")).yield_after_s is None

    def test_unknown_enum_value_is_invalid(self) -> None:
        """An enum number the proto does not define is INVALID_ARGUMENT."""
        with pytest.raises(InvalidSpecError, match="network"):
            convert.workspace_spec(wpb.WorkspaceSpec(network=99))

    def test_negative_duration_is_invalid(self) -> None:
        """A negative timeout is refused."""
        request = ppb.ExecRequest(command="x")
        request.timeout.FromMilliseconds(-5)
        with pytest.raises(InvalidSpecError, match="negative"):
            convert.exec_spec(request)

    def test_exec_spec(self) -> None:
        """Exec fields, including durations in seconds and the terminal size."""
        request = ppb.ExecRequest(command="ls", workdir="w", env={"E": "1"}, tty=True, max_output_bytes=9)
        request.yield_after.FromMilliseconds(250)
        request.timeout.FromSeconds(10)
        request.terminal_size.columns = 120
        spec = convert.exec_spec(request)
        assert (spec.command, spec.workdir, spec.env, spec.tty) == ("ls", "w", {"E": "1"}, True)
        assert (spec.yield_after_s, spec.timeout_s, spec.max_output_bytes) == (0.25, 10.0, 9)
        assert (spec.columns, spec.rows) == (120, 24)


class TestEvents:
    def test_each_event_kind(self) -> None:
        """Each domain event lands in its own oneof branch."""
        now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        cases = [
            (ExecStarted(process_id="p-1", pid=7, start_time=now), "started"),
            (OutputChunk(stream="stdout", data=b"a"), "output"),
            (OutputDropped(dropped_bytes=3), "dropped"),
            (ExitStatus(exit_code=130, signal="SIGINT", stop_reason=StopReason.INTERRUPTED), "exited"),
            (Yielded(process_id="p-1", elapsed_s=1.5), "yielded"),
        ]
        for event, kind in cases:
            assert convert.exec_response(event).WhichOneof("event") == kind

    def test_stderr_bytes_stay_bytes(self) -> None:
        """Output bytes are passed through untouched (no decoding in the daemon)."""
        response = convert.exec_response(OutputChunk(stream="stderr", data=b"\xff\xfe"))
        assert response.output.stderr == b"\xff\xfe"

    def test_exit_fields(self) -> None:
        """Exit code, signal, reason, OOM and elapsed survive the conversion."""
        message = convert.exit_to_proto(
            ExitStatus(
                exit_code=137,
                signal="SIGKILL",
                stop_reason=StopReason.TIMEOUT,
                oom_killed=True,
                memory_limit_bytes=1,
                dropped_bytes=2,
                elapsed_s=2.5,
            )
        )
        assert (message.exit_code, message.signal, message.stop_reason) == (137, "SIGKILL", ppb.STOP_REASON_TIMEOUT)
        assert (message.oom_killed, message.memory_limit_bytes, message.dropped_bytes) == (True, 1, 2)
        assert message.elapsed.ToMilliseconds() == 2500

    def test_input_response_has_no_started(self) -> None:
        """Input streams carry the same events except started."""
        assert convert.input_response(OutputDropped(dropped_bytes=1)).WhichOneof("event") == "dropped"
        with pytest.raises(TypeError):
            convert.input_response(ExecStarted(process_id="p", pid=1, start_time=datetime.datetime.now(datetime.UTC)))


class TestDurations:
    """Every Duration a caller sends is checked as its field: well-formed, not negative, bounded."""

    @pytest.mark.parametrize(
        ("seconds", "nanos", "message"),
        [
            (0, 1_000_000_000, "grace is not a well-formed Duration"),
            (0, -1_000_000_000, "grace is not a well-formed Duration"),
            (5, -1, "grace is not a well-formed Duration"),
            (-1, 0, "grace must not be negative"),
            (0, -5, "grace must not be negative"),
            (61, 0, "grace must be at most 60 s, got 61 s"),
            (10_000_000_000, 0, "grace must be at most 60 s"),
        ],
    )
    def test_refused(self, seconds: int, nanos: int, message: str) -> None:
        from google.protobuf import duration_pb2

        with pytest.raises(InvalidSpecError, match=message.replace("(", r"\(")):
            convert.duration_s(duration_pb2.Duration(seconds=seconds, nanos=nanos), "grace", high_s=60)

    def test_accepted(self) -> None:
        from google.protobuf import duration_pb2

        assert convert.duration_s(duration_pb2.Duration(seconds=60), "grace", high_s=60) == 60
        assert convert.duration_s(duration_pb2.Duration(seconds=1, nanos=500_000_000), "grace") == 1.5

    def test_an_exec_names_its_field(self) -> None:
        request = ppb.ExecRequest(workspace_id="ws-1", command="true")
        request.yield_after.nanos = 2_000_000_000
        with pytest.raises(InvalidSpecError, match="yield_after is not a well-formed Duration"):
            convert.exec_spec(request)
