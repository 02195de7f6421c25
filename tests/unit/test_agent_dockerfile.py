"""The agent's Dockerfile: users get the binaries without the Go tests, `./dev test` gets them tested."""

from __future__ import annotations

import re
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "agent" / "Dockerfile"


def _stages() -> list[tuple[str, str, str]]:
    """Each stage in order: (name, base, its instructions after FROM)."""
    text = DOCKERFILE.read_text()
    parts = re.split(r"^FROM\s+", text, flags=re.MULTILINE)[1:]
    stages = []
    for part in parts:
        head, _, body = part.partition("\n")
        words = head.split()
        stages.append((words[2] if len(words) > 2 and words[1].upper() == "AS" else "", words[0], body))
    return stages


def test_the_users_stage_comes_before_the_tests_and_copies_the_untested_build() -> None:
    """The engine's legacy builder runs every stage up to its target: ``agent`` must precede ``test``."""
    names = [name for name, _, _ in _stages()]
    assert names.index("agent") < names.index("test")
    agent = dict((name, body) for name, _, body in _stages())["agent"]
    assert "COPY --from=build /out/ /" in agent
    assert "go test" not in agent and "go vet" not in agent


def test_the_default_stage_is_the_tested_one() -> None:
    """What ``sandboxd agent build --test`` makes is copied from the stage that ran vet and the race tests."""
    name, base, body = _stages()[-1]
    assert (name, base) == ("", "scratch")
    assert "COPY --from=test /out/ /" in body
    test = dict((n, b) for n, _, b in _stages())["test"]
    assert "go vet ./..." in test and "go test -race" in test
