"""Regenerate the committed gRPC stubs from the .proto files.

Usage: ``python proto/generate.py`` (writes ``protocol/sandboxd_protocol/v1``) or
``python proto/generate.py --check`` (exit 1 when the committed stubs drift).

protoc emits ``from sandboxd.v1 import ...``, which would resolve to the daemon
package ``sandboxd``; the fix-up rewrites those imports to ``sandboxd_protocol.v1``,
the package of the small ``sandboxd-protocol`` distribution that the daemon and
the client both depend on.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "protocol" / "sandboxd_protocol" / "v1"
PACKAGE = "sandboxd_protocol.v1"

_IMPORT_RE = re.compile(r"^(from|import) sandboxd\.v1(\b)", re.MULTILINE)
_INIT = '"""Generated protobuf and gRPC stubs; never edit by hand (see proto/generate.py)."""\n'


def proto_files() -> list[Path]:
    """Return the .proto files to compile, sorted for a stable output."""
    return sorted((PROTO_ROOT / "sandboxd").rglob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Compile every .proto file into the package directory ``out_root`` and fix up the imports.

    Args:
        out_root: directory that becomes the ``v1`` package.

    Returns:
        The files written, relative to ``out_root``.

    Raises:
        RuntimeError: protoc reported an error.
    """
    import importlib.resources

    from grpc_tools import protoc  # dev dependency only

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    out_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
        ]
        if protoc.main(args) != 0:
            msg = "protoc failed; see its output above"
            raise RuntimeError(msg)
        written: list[Path] = []
        for path in sorted((Path(tmp) / "sandboxd" / "v1").iterdir()):
            if path.suffix in {".py", ".pyi"}:
                text = _IMPORT_RE.sub(rf"\1 {PACKAGE}\2", path.read_text())
                (out_root / path.name).write_text(text)
                written.append(Path(path.name))
    (out_root / "__init__.py").write_text(_INIT)
    written.append(Path("__init__.py"))
    return sorted(set(written))


def drift(committed: Path) -> list[str]:
    """Return a unified diff between fresh stubs and ``committed``; empty when equal."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "v1"
        names = generate(fresh)
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
        diff = drift(OUT_ROOT)
        sys.stdout.writelines(diff)
        return 1 if diff else 0
    for name in generate(OUT_ROOT):
        print(OUT_ROOT / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
