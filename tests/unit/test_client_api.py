"""The client package's public surface and its text decoding (no Docker)."""

from __future__ import annotations

import inspect

import pytest
import sandboxd_client
from sandboxd_client._exec import CommandFailedError, ExecResult, _Decoders


def test_all_is_exhaustive_and_sorted() -> None:
    """__all__ names every public object exported at top level, sorted, and nothing missing."""
    public = {
        name
        for name, value in vars(sandboxd_client).items()
        if not name.startswith("_") and (inspect.isclass(value) or inspect.isfunction(value))
    }
    assert set(sandboxd_client.__all__) == public | {"ExecEvent", "ToolEvent"}
    assert sandboxd_client.__all__ == sorted(sandboxd_client.__all__)


def test_client_does_not_import_docker() -> None:
    """The client distribution never needs the Docker SDK."""
    import subprocess
    import sys

    code = "import sys, sandboxd_client, sandboxd_client.cli; print('docker' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


class TestDecoding:
    def test_characters_split_at_every_byte(self) -> None:
        """Feeding UTF-8 one byte at a time yields the exact text, no U+FFFD."""
        text = "aé€😀z" * 100
        decoders = _Decoders()
        data = text.encode()
        out = "".join(decoders.output("stdout", data[i : i + 1]).text for i in range(len(data)))
        assert out == text

    def test_flush_reports_a_truncated_tail(self) -> None:
        """A stream ending mid-character flushes to U+FFFD instead of losing it silently."""
        decoders = _Decoders()
        assert decoders.output("stdout", "é".encode()[:1]).text == ""
        tails = decoders.flush()
        assert [(t.stream, t.text) for t in tails] == [("stdout", "\ufffd")]


class TestResults:
    def test_command_failed_error_is_a_result(self) -> None:
        """CommandFailedError carries every ExecResult field and is both types."""
        result = ExecResult(exit_code=3, stdout="o", stderr="e", signal="")
        error = CommandFailedError(result)
        assert isinstance(error, ExecResult) and isinstance(error, sandboxd_client.SandboxError)
        assert (error.exit_code, error.stdout, error.stderr) == (3, "o", "e")
        assert "code 3" in str(error)
        with pytest.raises(CommandFailedError):
            raise error
