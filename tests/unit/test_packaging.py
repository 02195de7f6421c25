"""The wheel holds every package of the source tree: the daemon image is built from it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _source_packages(top: str, directory: Path) -> set[str]:
    return {
        ".".join([top, *init.parent.relative_to(directory).parts])
        for init in directory.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }


def test_the_wheel_lists_every_daemon_package() -> None:
    """A package left out of pyproject's list is missing from the daemon image, which then cannot start."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    in_tree = _source_packages("sandboxd", ROOT / "sandboxd")
    assert sorted(in_tree - listed) == []
    assert sorted(p for p in listed if p.startswith("sandboxd.") and p not in in_tree) == []
