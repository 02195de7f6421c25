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


class TestLazyText:
    """Output.text, decoded only when read, is what an incremental UTF-8 decoder gives chunk by chunk."""

    @pytest.mark.parametrize("seed", range(40))
    def test_every_split_of_every_kind_of_bytes_decodes_as_the_incremental_decoder(self, seed: int) -> None:
        import codecs
        import random

        from sandboxd_client._exec import _Decoders

        rng = random.Random(seed)
        alphabet = [b"a", "é".encode(), "€".encode(), "𝄞".encode(), b"\xff", b"\x80", b"\xed\xa0\x80", b"\xf4\x90"]
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60)))
        cuts = sorted(rng.sample(range(len(data) + 1), k=min(len(data) + 1, rng.randrange(0, 12))))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        reference = codecs.getincrementaldecoder("utf-8")("replace")
        decoders = _Decoders()
        for chunk in chunks:
            assert decoders.output("stdout", chunk).text == reference.decode(chunk), (data, chunks, chunk)
        assert "".join(o.text for o in decoders.flush()) == reference.decode(b"", final=True), (data, chunks)

    def test_a_character_cut_over_three_chunks_is_whole_in_the_last(self) -> None:
        from sandboxd_client._exec import _Decoders

        clef = "𝄞".encode()
        decoders = _Decoders()
        texts = [decoders.output("stdout", piece).text for piece in (clef[:1], clef[1:2], clef[2:] + b"!")]
        assert texts == ["", "", "𝄞!"]
