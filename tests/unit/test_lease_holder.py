"""Whether a lease's holder lives on this host: a live one is refused at once, not waited for."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.lease import _lives_here


def _holder(pid: object, host: object = None) -> str:
    return json.dumps({"pid": pid, "host": socket.gethostname() if host is None else host})


@pytest.fixture
def sandboxd_like() -> Iterator[int]:
    """A running process whose command line names sandboxd, as a daemon's does."""
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "sandboxd"]) as process:
        try:
            # Ready once the kernel shows its new command line (an instant after the start, empty).
            deadline = time.monotonic() + 10
            while b"sandboxd" not in Path(f"/proc/{process.pid}/cmdline").read_bytes():
                assert time.monotonic() < deadline, "the process never showed its command line"
                time.sleep(0.01)
            yield process.pid
        finally:
            process.kill()


def test_a_running_sandboxd_on_this_host_lives(sandboxd_like: int) -> None:
    assert _lives_here(_holder(sandboxd_like)) is True


def test_a_holder_on_another_host_is_waited_for(sandboxd_like: int) -> None:
    assert _lives_here(_holder(sandboxd_like, host="elsewhere")) is False


def test_a_pid_that_is_another_program_is_waited_for() -> None:
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            assert _lives_here(_holder(other.pid)) is False
        finally:
            other.kill()


def test_a_gone_pid_is_waited_for() -> None:
    done = subprocess.run(["true"], check=True)
    assert done.returncode == 0
    gone = os.getpid() + 4_000_000  # above any pid_max: no such process
    assert _lives_here(_holder(gone)) is False


@pytest.mark.parametrize("pid", [None, "", "12x", -1, 0, True, [1], "1" * 300])
def test_a_holder_that_names_no_pid_is_waited_for(pid: object) -> None:
    assert _lives_here(_holder(pid)) is False


def test_a_holder_that_is_not_json_is_waited_for() -> None:
    assert _lives_here("\x1b[2J" + "x" * 1000) is False
