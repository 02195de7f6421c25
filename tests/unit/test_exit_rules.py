"""Exit status, stop reason and yield-window rules (no Docker)."""

from __future__ import annotations

import pytest

from sandboxd.models import StopReason, signal_name
from sandboxd.processes import clamp_yield, exit_status, input_window


def _status(**overrides):  # type: ignore[no-untyped-def]
    values = {
        "exit_code": 0,
        "signal_number": 0,
        "oom_kills": 0,
        "memory_limit_bytes": 256 * 1024**2,
        "requested": set(),
        "dropped_bytes": 0,
        "elapsed_s": 1.0,
    }
    values.update(overrides)
    return exit_status(**values)


class TestExitStatus:
    def test_plain_exit(self) -> None:
        """An ordinary exit keeps its code and names no signal."""
        status = _status(exit_code=2)
        assert (status.exit_code, status.signal, status.stop_reason) == (2, "", StopReason.EXITED)

    @pytest.mark.parametrize(
        ("number", "code", "name"), [(2, 130, "SIGINT"), (9, 137, "SIGKILL"), (15, 143, "SIGTERM")]
    )
    def test_death_by_signal(self, number: int, code: int, name: str) -> None:
        """A death by signal N is 128+N with the signal's name."""
        status = _status(exit_code=code, signal_number=number)
        assert (status.exit_code, status.signal) == (code, name)

    def test_shell_reported_signal(self) -> None:
        """A shell's 128+N exit (its child died by signal N) names the signal too."""
        assert _status(exit_code=139).signal == "SIGSEGV"

    def test_own_code_kept(self) -> None:
        """A trap that exits 42 keeps 42 and names no signal."""
        status = _status(exit_code=42, requested={StopReason.INTERRUPTED})
        assert (status.exit_code, status.signal, status.stop_reason) == (42, "", StopReason.INTERRUPTED)

    def test_oom_needs_sigkill_and_a_count(self) -> None:
        """OOM is claimed only for a SIGKILL death while the cgroup counted an OOM kill."""
        assert _status(exit_code=137, signal_number=9, oom_kills=1).oom_killed
        status = _status(exit_code=137, signal_number=9, oom_kills=1)
        assert status.memory_limit_bytes == 256 * 1024**2
        assert "OOM" in status.message
        assert not _status(exit_code=137, signal_number=9).oom_killed
        assert not _status(exit_code=1, oom_kills=1).oom_killed

    def test_stop_reason_priority(self) -> None:
        """interrupted > timeout > failed > killed > exited."""
        everything = {StopReason.KILLED, StopReason.FAILED, StopReason.TIMEOUT, StopReason.INTERRUPTED}
        assert _status(requested=everything).stop_reason == StopReason.INTERRUPTED
        assert _status(requested=everything - {StopReason.INTERRUPTED}).stop_reason == StopReason.TIMEOUT
        assert _status(requested={StopReason.FAILED, StopReason.KILLED}).stop_reason == StopReason.FAILED
        assert _status(requested={StopReason.KILLED}).stop_reason == StopReason.KILLED

    @pytest.mark.parametrize(("code", "number"), [(130, 2), (130, 0)])
    def test_sigint_death_after_a_ctrl_c_is_interrupted(self, code: int, number: int) -> None:
        """A death by SIGINT (or a shell's 130) after a Ctrl-C reached it is interrupted, seen whenever."""
        status = _status(exit_code=code, signal_number=number, ctrl_c_delivered=True)
        assert (status.signal, status.stop_reason) == ("SIGINT", StopReason.INTERRUPTED)

    def test_sigint_death_without_a_ctrl_c_is_exited(self) -> None:
        """`kill -INT $$` by the command itself, no Ctrl-C sent: its own exit."""
        assert _status(exit_code=130, signal_number=2).stop_reason == StopReason.EXITED

    @pytest.mark.parametrize(("code", "number"), [(0, 0), (42, 0), (143, 15), (137, 9)])
    def test_survivor_of_ctrl_c_keeps_its_own_reason(self, code: int, number: int) -> None:
        """A REPL that caught Ctrl-C and later ends another way is not called interrupted."""
        assert _status(exit_code=code, signal_number=number, ctrl_c_delivered=True).stop_reason == StopReason.EXITED
        killed = _status(exit_code=code, signal_number=number, ctrl_c_delivered=True, requested={StopReason.KILLED})
        assert killed.stop_reason == StopReason.KILLED

    def test_unknown_signal_number_has_a_name(self) -> None:
        """A realtime signal without a Python name still gets a readable name."""
        assert signal_name(2) == "SIGINT"
        assert signal_name(99) == "SIG99"


class TestClampYield:
    def test_default_is_60_s(self) -> None:
        """No request means 60 s when the timeout allows it."""
        assert clamp_yield(None, 1800) == 60

    def test_minimum_250_ms(self) -> None:
        """Windows below 250 ms are raised to 250 ms."""
        assert clamp_yield(0.0, 1800) == 0.25

    def test_never_beyond_timeout_minus_one_second(self) -> None:
        """The window ends a second before the timeout."""
        assert clamp_yield(60, 10) == 9
        assert clamp_yield(None, 2) == 1

    def test_tiny_timeout_keeps_the_minimum(self) -> None:
        """Even a sub-second timeout keeps the 250 ms floor."""
        assert clamp_yield(5, 0.5) == 0.25


class TestInputWindow:
    def test_seed_defaults(self) -> None:
        """250 ms after a write, 5 s for a pure poll."""
        assert input_window(None, wrote=True, ctrl_c=False, timeout_s=1800) == 0.25
        assert input_window(None, wrote=False, ctrl_c=False, timeout_s=1800) == 5.0

    def test_requested_window_is_clamped(self) -> None:
        """A requested window is clamped like Exec's: at least 250 ms, a second under the timeout."""
        assert input_window(0.01, wrote=True, ctrl_c=False, timeout_s=1800) == 0.25
        assert input_window(100, wrote=False, ctrl_c=False, timeout_s=30) == 29

    def test_ctrl_c_waits_for_the_death_a_little_longer(self) -> None:
        """A Ctrl-C call's window is at least 1 s, so the death it causes is usually seen in it."""
        assert input_window(None, wrote=False, ctrl_c=True, timeout_s=1800) == 1.0
        assert input_window(0.25, wrote=False, ctrl_c=True, timeout_s=1800) == 1.0
        assert input_window(3.0, wrote=False, ctrl_c=True, timeout_s=1800) == 3.0


class TestInterruptPlan:
    def test_linux_pipes_get_sigint_to_the_group(self) -> None:
        """Without a terminal, Ctrl-C is SIGINT to the command's process group."""
        from sandboxd.processes import InterruptPlan, interrupt_plan

        assert interrupt_plan("linux", tty=False) is InterruptPlan.PROCESS_GROUP

    def test_linux_tty_goes_through_the_line_discipline(self) -> None:
        """Under a terminal, Ctrl-C is the ETX byte, so the terminal signals its foreground group."""
        from sandboxd.processes import InterruptPlan, interrupt_plan

        assert interrupt_plan("linux", tty=True) is InterruptPlan.TERMINAL

    @pytest.mark.parametrize("os_name", ["windows", "Windows"])
    @pytest.mark.parametrize("tty", [False, True])
    def test_windows_falls_back_to_a_tree_kill(self, os_name: str, tty: bool) -> None:
        """Windows containers cannot signal piped processes: Ctrl-C is the agent's kill of the command's tree."""
        from sandboxd.processes import InterruptPlan, interrupt_plan

        assert interrupt_plan(os_name, tty=tty) is InterruptPlan.TREE_KILL


class TestParseSignal:
    @pytest.mark.parametrize(
        ("text", "number"),
        [("TERM", 15), ("sigterm", 15), (" 15 ", 15), ("KILL", 9), ("SIGRTMIN+2", 36), ("RTMAX-1", 63), ("CHLD", 17)],
    )
    def test_names_and_numbers(self, text: str, number: int) -> None:
        """A signal by name (with or without SIG), by realtime offset, or by ASCII number."""
        from sandboxd.api.processes import parse_signal

        assert parse_signal(text) == number

    @pytest.mark.parametrize(
        "text",
        [
            "\u00b2",
            "\u0661\u0665",
            "9" * 5000,
            "SIGRTMIN+" + "1" * 5000,
            "0",
            "65",
            "SIG15",
            "SIGRTMIN+99",
            "",
            "Signals",
        ],
    )
    def test_anything_else_is_an_unknown_signal(self, text: str) -> None:
        """Non-ASCII digits, huge numbers and unknown names are INVALID_ARGUMENT, never an exception."""
        from sandboxd.api.processes import parse_signal
        from sandboxd.errors import InvalidSpecError

        with pytest.raises(InvalidSpecError, match=r"^unknown signal ") as caught:
            parse_signal(text)
        assert len(caught.value.message) < 120
