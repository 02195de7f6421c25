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
