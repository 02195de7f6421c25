"""The daemon's layering: it speaks the wire contract through sandboxd-protocol alone (issue 11)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_daemon_loads_nothing_of_the_client() -> None:
    """Importing the daemon's server (and its whole domain) loads no module of sandboxd_client."""
    probe = (
        "import json, sys, sandboxd.api.server, sandboxd.__main__; "
        "names = ('sandboxd_client', 'sandboxd_protocol'); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in names)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    loaded = json.loads(done.stdout)
    assert [m for m in loaded if m.startswith("sandboxd_client")] == []
    assert "sandboxd_protocol.v1.process_service_pb2" in loaded


def test_the_client_keeps_its_public_names() -> None:
    """The client's own modules still offer what moved into the protocol package."""
    from sandboxd_client import default_socket_path, limits, text
    from sandboxd_protocol import limits as shared
    from sandboxd_protocol.redact import Redactor

    assert limits.MAX_MESSAGE_BYTES == shared.MAX_MESSAGE_BYTES
    assert set(limits.__all__) == set(shared.__all__)
    assert text.Redactor is Redactor
    assert default_socket_path({"SANDBOXD_SOCKET": "/x.sock"}) == "/x.sock"


def _module_graph() -> dict[str, set[str]]:
    """Each module of sandboxd/ and the sandboxd modules it imports (at any depth of its body)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "sandboxd"
    files = {}
    for path in root.rglob("*.py"):
        parts = ["sandboxd", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in files)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in files:
                        edges.add(target)
                    elif base in files:
                        edges.add(base)
        edges.discard(name)
        graph[name] = edges
    return graph


def test_the_daemon_has_no_import_circle() -> None:
    """No module of sandboxd/ reaches itself through its imports (docs/architecture.md draws the layers)."""
    graph = _module_graph()
    circles: list[list[str]] = []
    state: dict[str, int] = {}
    trail: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        trail.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append([*trail[trail.index(target) :], target])
            elif target not in state:
                visit(target)
        trail.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert circles == []


#: The daemon's layers, lowest first (docs/architecture.md): a module imports from its own
#: layer or lower ones, never from a higher one.
LAYERS = (
    (
        "ground",
        ("errors", "settings", "logging", "metrics", "models", "secrets", "memory", "tenancy", "proxy", "audit"),
    ),
    ("engine", ("backend",)),
    ("agent", ("agent", "fileops", "images", "agentbuild", "lease")),
    ("processes", ("relay", "processes")),
    ("domain", ("egress", "pool", "workspaces", "files", "forwards", "snapshots", "templates")),
    ("api", ("api", "e2b", "__main__")),
)


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for rank, (_, names) in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{module} is in no layer of LAYERS")


def test_no_module_imports_from_a_higher_layer() -> None:
    """Every module has a layer, and its imports go down or sideways, never up."""
    graph = _module_graph()
    del graph["sandboxd"]
    upward = [
        f"{name} ({LAYERS[_layer(name)][0]}) -> {target} ({LAYERS[_layer(target)][0]})"
        for name, targets in sorted(graph.items())
        for target in sorted(targets)
        if target != "sandboxd" and _layer(target) > _layer(name)
    ]
    assert upward == []
