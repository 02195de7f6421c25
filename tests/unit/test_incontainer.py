"""The scripts sandboxd runs inside containers (no Docker)."""

from __future__ import annotations

import ast
import importlib.resources

import pytest

from sandboxd.errors import InvalidSpecError
from sandboxd.incontainer import MAX_ARGUMENT_BYTES, engine_refusal, looks_like_frames, script_argv


@pytest.mark.parametrize("name", ["supervisor.py", "fileops.py"])
def test_scripts_parse_as_python_3_6(name: str) -> None:
    """Workspace images may carry an old python3: the scripts use Python 3.6 grammar only."""
    source = importlib.resources.files("sandboxd").joinpath(name).read_text()
    ast.parse(source, feature_version=(3, 6))


@pytest.mark.parametrize("name", ["supervisor.py", "fileops.py"])
def test_scripts_import_only_the_standard_library(name: str) -> None:
    """Nothing outside the standard library is imported (images have no sandboxd installed)."""
    import sys

    tree = ast.parse(importlib.resources.files("sandboxd").joinpath(name).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports cannot work in a -c script"
            imported.add((node.module or "").split(".")[0])
    assert imported <= sys.stdlib_module_names


def test_argv_is_isolated_python() -> None:
    """Scripts run as `python3 -I -S -c SOURCE JSON`, non-ASCII kept as UTF-8."""
    argv = script_argv("fileops.py", {"path": "é"})
    assert argv[:4] == ["python3", "-I", "-S", "-c"]
    assert argv[5] == '{"path": "é"}'


def test_oversized_argument_refused() -> None:
    """A request longer than one argv string may be is refused before any exec."""
    with pytest.raises(InvalidSpecError, match="too long"):
        script_argv("fileops.py", {"data": "x" * MAX_ARGUMENT_BYTES})


def test_engine_text_is_not_frames() -> None:
    """The engine's own error text is told apart from frames, and python3's absence named."""
    text = b'OCI runtime exec failed: exec: "python3": executable file not found in $PATH: unknown\r\n'
    assert not looks_like_frames(text, b"PF")
    assert looks_like_frames(b"P\x00\x00\x00\x02{}", b"PF")
    assert "no python3" in engine_refusal(text).message


def test_supervisor_json_encoder_round_trips() -> None:
    """The supervisor's small JSON encoder agrees with json.loads on awkward strings."""
    import json

    from sandboxd import supervisor

    values = {
        "quote": 'say "hi" \\ back',
        "control": "\x00\x01\n\t\x1f",
        "unicode": "é€😀",
        "surrogate": "bad\udcff byte",
        "int": -7,
        "float": 2.5,
        "yes": True,
        "no": False,
        "none": None,
    }
    decoded = json.loads(supervisor.dumps(values))
    assert decoded == values


def test_token_argv_round_trips() -> None:
    """Config passed as argv tokens comes back as the supervisor reads it, env apart."""
    from sandboxd import supervisor

    argv = script_argv(
        "supervisor.py", {"command": "-x 'y'", "tty": True, "rows": 30, "env": {"A": "1", "B": ""}}, tokens=True
    )
    config, env = supervisor.parse_tokens(argv[5:])
    assert config == {"command": "-x 'y'", "tty": "1", "rows": "30"}
    assert env == {"A": "1", "B": ""}
