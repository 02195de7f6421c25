"""Regenerate the committed stubs from the .proto files.

Usage: ``python proto/generate.py`` (writes both targets) or ``python proto/generate.py --check``
(exit 1 when the committed stubs drift).

Two targets:

- ``proto/sandboxd`` -> ``protocol/sandboxd_protocol/v1``: sandboxd's own gRPC API (grpcio-tools).
  protoc emits ``from sandboxd.v1 import ...``, which would resolve to the daemon package
  ``sandboxd``; the fix-up rewrites those imports to ``sandboxd_protocol.v1``, the package of the
  small ``sandboxd-protocol`` distribution that the daemon and the client both depend on.
- ``proto/e2b/envd`` -> ``sandboxd/e2b/envd``: E2B's envd Connect-RPC services, which
  ``sandboxd serve --e2b-listen`` serves (protobuf-py messages and connectrpc stubs, through the
  ``protoc-gen-py`` and ``protoc-gen-connectrpc`` plugins of the dev extras).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.resources
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "protocol" / "sandboxd_protocol" / "v1"
PACKAGE = "sandboxd_protocol.v1"
E2B_PROTO_ROOT = PROTO_ROOT / "e2b" / "envd"
E2B_OUT_ROOT = ROOT / "sandboxd" / "e2b" / "envd"

_IMPORT_RE = re.compile(r"^(from|import) sandboxd\.v1(\b)", re.MULTILINE)
_INIT = '"""Generated protobuf and gRPC stubs; never edit by hand (see proto/generate.py)."""\n'
_E2B_INIT = '"""E2B\'s envd services, generated from proto/e2b/envd; never edit by hand (see proto/generate.py)."""\n'


def proto_files() -> list[Path]:
    """Return sandboxd's .proto files to compile, sorted for a stable output."""
    return sorted((PROTO_ROOT / "sandboxd").rglob("*.proto"))


def _protoc(args: list[str]) -> None:
    from grpc_tools import protoc  # dev dependency only

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    if protoc.main(["protoc", f"-I{well_known}", *args]) != 0:
        msg = "protoc failed; see its output above"
        raise RuntimeError(msg)


def generate(out_root: Path) -> list[Path]:
    """Compile sandboxd's .proto files into the package directory ``out_root``; fix up the imports.

    Args:
        out_root: directory that becomes the ``v1`` package.

    Returns:
        The files written, relative to ``out_root``.

    Raises:
        RuntimeError: protoc reported an error.
    """
    out_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _protoc(
            [
                f"-I{PROTO_ROOT}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
            ]
        )
        written: list[Path] = []
        for path in sorted((Path(tmp) / "sandboxd" / "v1").iterdir()):
            if path.suffix in {".py", ".pyi"}:
                text = _IMPORT_RE.sub(rf"\1 {PACKAGE}\2", path.read_text())
                (out_root / path.name).write_text(text)
                written.append(Path(path.name))
    (out_root / "__init__.py").write_text(_INIT)
    written.append(Path("__init__.py"))
    return sorted(set(written))


def generate_e2b(out_root: Path) -> list[Path]:
    """Compile E2B's envd .proto files into the package directory ``out_root``.

    The plugins are the ``protoc-gen-py`` and ``protoc-gen-connectrpc`` scripts installed beside
    this interpreter. The generated modules import each other relatively, so no fix-up is needed.

    Returns:
        The files written, relative to ``out_root``.

    Raises:
        RuntimeError: protoc reported an error.
    """
    scripts = Path(sys.executable).parent
    out_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _protoc(
            [
                f"-I{E2B_PROTO_ROOT}",
                f"--plugin=protoc-gen-py={scripts / 'protoc-gen-py'}",
                f"--py_out={tmp}",
                f"--plugin=protoc-gen-connectrpc={scripts / 'protoc-gen-connectrpc'}",
                f"--connectrpc_out={tmp}",
                *sorted(str(p.relative_to(E2B_PROTO_ROOT)) for p in E2B_PROTO_ROOT.rglob("*.proto")),
            ]
        )
        written = []
        for path in sorted(Path(tmp).rglob("*.py")):
            name = path.relative_to(tmp)
            text = _E2B_INIT if name == Path("__init__.py") else path.read_text()
            (out_root / name).parent.mkdir(parents=True, exist_ok=True)
            (out_root / name).write_text(text)
            written.append(name)
    return sorted(written)


TARGETS: tuple[tuple[Path, Callable[[Path], list[Path]]], ...] = ((OUT_ROOT, generate), (E2B_OUT_ROOT, generate_e2b))


def drift(committed: Path, make: Callable[[Path], list[Path]] = generate) -> list[str]:
    """Return a unified diff between fresh stubs (``make``) and ``committed``; empty when equal."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "out"
        names = make(fresh)
        on_disk = {p.relative_to(committed) for p in committed.rglob("*") if p.suffix in {".py", ".pyi"}}
        lines: list[str] = []
        for name in sorted(set(names) | on_disk):
            new = (fresh / name).read_text().splitlines(keepends=True) if (fresh / name).exists() else []
            old = (committed / name).read_text().splitlines(keepends=True) if (committed / name).exists() else []
            lines += difflib.unified_diff(old, new, f"committed/{name}", f"generated/{name}")
        return lines


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the committed stubs drift")
    opts = parser.parse_args(argv)
    if opts.check:
        diff = [line for out_root, make in TARGETS for line in drift(out_root, make)]
        sys.stdout.writelines(diff)
        return 1 if diff else 0
    for out_root, make in TARGETS:
        for name in make(out_root):
            print(out_root / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
