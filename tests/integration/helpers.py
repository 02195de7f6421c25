"""Small helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import datetime
import io
import re
import tarfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from sandboxd_client import Output, Yielded


def skip_without(runtime: str, request) -> None:  # type: ignore[no-untyped-def]
    """Skip a test of ``runtime`` when it is runsc and the engine has none (CI insists on it)."""
    if runtime == "runsc" and not request.getfixturevalue("runsc_available"):
        pytest.skip("the engine has no runsc runtime (scripts/install-runsc registers it)")


async def collect(handle) -> tuple[list[object], str, str]:  # type: ignore[no-untyped-def]
    """All events of an exec/input handle, with its stdout and stderr text."""
    events = [event async for event in handle]
    out = "".join(e.text for e in events if isinstance(e, Output) and e.stream == "stdout")
    err = "".join(e.text for e in events if isinstance(e, Output) and e.stream == "stderr")
    return events, out, err


async def ps(workspace, pattern: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Command lines of live (non-zombie) processes in the workspace that fully match ``pattern``."""
    result = await workspace.exec("ps -eo stat=,args=").wait()
    rows = [line.strip().split(None, 1) for line in result.stdout.splitlines() if line.strip()]
    return [
        args
        for stat, args in (r for r in rows if len(r) == 2)
        if not stat.startswith("Z") and re.fullmatch(pattern, args)
    ]


async def start_yielded(workspace, command: str, **options) -> str:  # type: ignore[no-untyped-def]
    """Exec ``command`` with a 250 ms window; return its process id once it has yielded."""
    events, _, _ = await collect(workspace.exec(command, yield_after_s=0.25, **options))
    assert isinstance(events[-1], Yielded), events[-1]
    return events[-1].process_id


async def start_ready(workspace, command: str, ready: str = "ready", **options) -> str:  # type: ignore[no-untyped-def]
    """Start ``command`` and return its process id once its output contains ``ready``.

    ``command`` prints ``ready`` once what the test is about to signal is in place: after its
    ``trap``, after starting the children the signal must reach, or once a program has set up
    its own handler (a REPL's prompt). A signal sent earlier (a slow start under gVisor or on a
    loaded host) would race it; no fixed sleep can stand in for this.
    """
    process_id, _ = await exec_until(workspace, command, ready, **options)
    return process_id


async def exec_until(workspace, command: str, text: str, **options) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Exec ``command``; return its process id and its output once that output contains ``text``.

    The command must still be running then. How soon output arrives is not the test's business:
    a short yield window that must already hold it fails on a loaded host.
    """
    events, seen, _ = await collect(workspace.exec(command, yield_after_s=0.25, **options))
    assert isinstance(events[-1], Yielded), events[-1]
    process_id = events[-1].process_id
    return process_id, seen + await input_until(workspace.client, process_id, text, seen=seen)


async def input_until(client, process_id: str, text: str, data: str = "", seen: str = "") -> str:  # type: ignore[no-untyped-def]
    """Send ``data`` to a running process, then poll it until its output holds ``text``; return that output.

    ``seen`` is output already read, which may hold ``text`` already. The process must still be
    running once ``text`` has come (20 s at most).
    """
    deadline = time.monotonic() + 20
    got = ""
    first = True
    while first or text not in seen + got:
        assert time.monotonic() < deadline, f"{process_id} never printed {text!r}: {seen + got!r}"
        events, out, _ = await collect(client.input(process_id, data if first else "", yield_after_s=0.25))
        first = False
        got += out
        assert text in seen + got or isinstance(events[-1], Yielded), f"exited before printing {text!r}: {events[-1]}"
    return got


async def start_trapped(workspace, traps: str, body: str, **options) -> str:  # type: ignore[no-untyped-def]
    """Start ``traps; body`` and return its process id once the traps are set.

    A signal sent before the shell has run its ``trap`` (a slow start under gVisor or on a
    loaded host) would meet the default disposition: tests must not race it.
    """
    return await start_ready(workspace, f"{traps}; echo trapped; {body}", ready="trapped", **options)


async def until_alive(workspace, pattern: str, count: int) -> list[str]:  # type: ignore[no-untyped-def]
    """Poll (20 s at most) until ``count`` live processes match ``pattern``, and return them all.

    For children that must be running before the test signals their command: right after the
    start they may not have been forked or exec'd yet.
    """
    deadline = time.monotonic() + 20
    while len(found := await ps(workspace, pattern)) < count:
        assert time.monotonic() < deadline, f"only {found} of {count} processes matching {pattern!r} started"
        await asyncio.sleep(0.1)
    return found


def until_caught(pid: int, signum: int) -> None:
    """Poll (30 s at most) until local process ``pid`` has a handler for ``signum`` (its ``SigCgt``).

    Before that, the signal would meet its default action (for SIGTERM: death, not a clean stop).
    """
    deadline = time.monotonic() + 30
    while True:
        with open(f"/proc/{pid}/status") as status:
            caught = int(next(line for line in status if line.startswith("SigCgt:")).split()[1], 16)
        if caught >> (signum - 1) & 1:
            return
        assert time.monotonic() < deadline, f"process {pid} never installed a handler for signal {signum}"
        time.sleep(0.01)


def one_file_tar(name: str, data: bytes) -> bytes:
    """A tar archive holding one regular file."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        entry = tarfile.TarInfo(name)
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    return buffer.getvalue()


async def trickle(data: bytes, *, pieces: int, pause_s: float) -> AsyncIterator[bytes]:
    """``data`` in ``pieces`` chunks with a pause after each: an upload that stays in flight."""
    step = len(data) // pieces + 1
    for start in range(0, len(data), step):
        yield data[start : start + step]
        await asyncio.sleep(pause_s)


def certificates(directory: Path, names: Sequence[str] = ("localhost", "127.0.0.1")) -> dict[str, Path]:
    """A CA, a server certificate for ``names`` (DNS names, wildcards or IP addresses) and a client
    certificate, all signed by the CA; and a stranger's self-signed one. Paths by ``NAME_cert``/``NAME_key``."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    paths: dict[str, Path] = {}

    def write(name: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        paths[f"{name}_key"] = directory / f"{name}.key"
        paths[f"{name}_key"].write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        paths[f"{name}_cert"] = directory / f"{name}.pem"
        paths[f"{name}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(name: str, issuer_key, issuer_name, key, *, ca: bool = False, sans=()):  # type: ignore[no-untyped-def]
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer_name or subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = issue("sandboxd test CA", ca_key, None, ca_key, ca=True)
    write("ca", ca_key, ca_cert)
    server_key = ec.generate_private_key(ec.SECP256R1())

    def san(name: str) -> x509.GeneralName:
        try:
            return x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            return x509.DNSName(name)

    sans = [san(name) for name in names]
    write("server", server_key, issue(names[0], ca_key, ca_cert.subject, server_key, sans=sans))
    client_key = ec.generate_private_key(ec.SECP256R1())
    write("client", client_key, issue("agent", ca_key, ca_cert.subject, client_key))
    other_key = ec.generate_private_key(ec.SECP256R1())
    write("stranger", other_key, issue("stranger", other_key, None, other_key, ca=True))
    return paths
