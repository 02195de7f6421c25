"""Secrets by reference: injected into the command only, masked in everything that leaves."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from sandboxd_client import SandboxClient

from tests.conftest import DaemonThread, make_settings, spawned_daemon
from tests.integration.helpers import collect, exec_until

pytestmark = pytest.mark.timeout(180)

DEMO = "s3cr3t-Valu3-0f-demo-9f8e7d"
PEM = "-----BEGIN TEST KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tP\n-----END TEST KEY-----"
API_KEY = 'sk-"quoted\\and spaced"-4242'  # JSON escaping must not let it slip past the mask


@pytest.fixture(scope="module")
def secret_daemon(tmp_path_factory: pytest.TempPathFactory, default_image: str):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("secrets")
    secrets_file = tmp / "secrets.json"
    secrets_file.write_text(json.dumps({"demo": DEMO, "pem": PEM}))
    settings = make_settings(tmp, secrets_file=str(secrets_file))
    thread = DaemonThread(settings, environ={"SANDBOXD_SECRET_api_key": API_KEY}).start()
    yield thread, Path(settings.audit_log)
    thread.stop()


@pytest.fixture
async def secret_client(secret_daemon):  # type: ignore[no-untyped-def]
    async with SandboxClient(socket_path=secret_daemon[0].socket_path, retries=False) as client:
        yield client


async def test_echo_prints_the_mask_and_the_spec_keeps_the_reference(secret_client, secret_daemon) -> None:  # type: ignore[no-untyped-def]
    ws = await secret_client.create_workspace(env={"TOKEN": "secret:demo"})
    try:
        result = await ws.exec('echo "$TOKEN"; echo "$TOKEN" >&2').wait()
        assert result.stdout == "[REDACTED:demo]\n"
        assert result.stderr == "[REDACTED:demo]\n"
        # The command really had the value: its length and a hash of it prove it without printing it.
        proof = await ws.exec('printf %s "$TOKEN" | wc -c; printf %s "$TOKEN" | sha256sum | cut -c1-16').wait()
        import hashlib

        assert proof.stdout.split() == [str(len(DEMO)), hashlib.sha256(DEMO.encode()).hexdigest()[:16]]
        assert ws.info.env == {"TOKEN": "secret:demo"}
        assert (await secret_client.get_workspace(ws.workspace_id)).info.env == {"TOKEN": "secret:demo"}
    finally:
        await ws.delete()
    audit = secret_daemon[1].read_text()
    assert DEMO not in audit
    assert ws.workspace_id in audit


async def test_value_split_across_output_chunks_is_masked(secret_client) -> None:  # type: ignore[no-untyped-def]
    """The value leaves in two writes 300 ms apart (two frames, two chunks): still one mask."""
    ws = await secret_client.create_workspace()
    try:
        half = len(DEMO) // 2
        command = (
            f"printf 'before %s' \"${{K:0:{half}}}\"; sleep 0.3; printf '%s after\\n' \"${{K:{half}}}\"; "
            f"printf '%s' \"${{K:0:5}}\"; sleep 0.3; printf ' tail\\n'"
        )
        events, out, _ = await collect(ws.exec(command, env={"K": "secret:demo"}))
        assert out == f"before [REDACTED:demo] after\n{DEMO[:5]} tail\n"
        chunks = [e for e in events if getattr(e, "stream", "") == "stdout"]
        assert len(chunks) >= 2  # it really arrived in pieces
    finally:
        await ws.delete()


async def test_value_with_quotes_and_a_prefix_that_ends_the_output(secret_client, secret_daemon) -> None:  # type: ignore[no-untyped-def]
    """A secret's first bytes at the very end of the output are released at exit, unmasked (they are not it)."""
    ws = await secret_client.create_workspace(env={"KEY": "secret:api_key"})
    try:
        result = await ws.exec('printf "%s|" "$KEY"; printf "%s" "${KEY:0:4}"').wait()
        assert result.stdout == "[REDACTED:api_key]|" + API_KEY[:4]
        await ws.exec('echo "$KEY"', env={"EXTRA": "secret:demo"}).wait()
    finally:
        await ws.delete()
    audit = secret_daemon[1].read_text()
    assert API_KEY not in audit
    assert json.dumps(API_KEY)[1:-1] not in audit


async def test_yielded_and_polled_output_is_masked(secret_client) -> None:  # type: ignore[no-untyped-def]
    ws = await secret_client.create_workspace(env={"TOKEN": "secret:demo"})
    try:
        process_id, out = await exec_until(ws, 'echo "a $TOKEN"; read line; echo "b $TOKEN $line"', "\n")
        assert out == "a [REDACTED:demo]\n"
        result = await secret_client.input(process_id, "x\n").wait()
        assert result.stdout == "b [REDACTED:demo] x\n"
    finally:
        await ws.delete()


async def test_tty_output_is_masked(secret_client) -> None:  # type: ignore[no-untyped-def]
    ws = await secret_client.create_workspace(env={"TOKEN": "secret:demo"})
    try:
        result = await ws.exec('echo "$TOKEN"', tty=True).wait()
        assert result.stdout.replace("\r", "") == "[REDACTED:demo]\n"
    finally:
        await ws.delete()


async def test_multi_line_secret_under_a_terminal_is_masked(secret_client) -> None:  # type: ignore[no-untyped-def]
    """The terminal turns the key's newlines into CR LF: the mask must follow."""
    ws = await secret_client.create_workspace(env={"KEY": "secret:pem"})
    try:
        piped = await ws.exec('printf "%s\\n" "$KEY"').wait()
        assert piped.stdout == "[REDACTED:pem]\n"
        terminal = await ws.exec('printf "%s\\n" "$KEY"', tty=True).wait()
        assert terminal.stdout == "[REDACTED:pem]\r\n"
    finally:
        await ws.delete()


async def test_exec_env_reference_and_unknown_one(secret_client) -> None:  # type: ignore[no-untyped-def]
    from sandboxd_client import InvalidArgumentError

    ws = await secret_client.create_workspace()
    try:
        assert (await ws.exec('echo "$T"', env={"T": "secret:demo"}).wait()).stdout == "[REDACTED:demo]\n"
        with pytest.raises(InvalidArgumentError, match="env T: unknown secret 'missing'"):
            await ws.exec("true", env={"T": "secret:missing"}).wait()
    finally:
        await ws.delete()


async def test_no_argv_holds_a_value_in_the_workspace_or_on_the_host(secret_client) -> None:  # type: ignore[no-untyped-def]
    """`ps` shows every argv to every user: the value must be in none (it goes over stdin)."""
    ws = await secret_client.create_workspace(env={"TOKEN": "secret:demo"})
    try:
        running = await ws.exec("sleep 30", yield_after_s=0.5).wait()
        assert running.running
        # Inside: any argv holding the value would come back masked.
        listing = await ws.exec("ps -eo args --no-headers; cat /proc/[0-9]*/cmdline | tr '\\0' ' '").wait()
        assert "sleep 30" in listing.stdout
        assert "REDACTED" not in listing.stdout
        # On the host, where the engine runs containers' processes (nothing is masked there).
        host = b""
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                host += cmdline.read_bytes()
        assert DEMO.encode() not in host
        await secret_client.kill(running.process_id)
    finally:
        await ws.delete()


async def test_a_command_cannot_reach_the_agent(secret_client) -> None:  # type: ignore[no-untyped-def]
    """The agent (the command's parent) is root's: the command can neither write to its fds, read
    its memory or environment, nor kill it."""
    ws = await secret_client.create_workspace(env={"TOKEN": "secret:demo"})
    try:
        probe = (
            '(echo "leak:$TOKEN" > /proc/$PPID/fd/2) 2>/dev/null; echo "fd2=$?"; '
            "(printf 'X\\0\\0\\0\\2{}' > /proc/$PPID/fd/1) 2>/dev/null; echo \"fd1=$?\"; "
            '(cat /proc/$PPID/environ > /dev/null) 2>/dev/null; echo "environ=$?"; '
            '(head -c1 /proc/$PPID/mem > /dev/null) 2>/dev/null; echo "mem=$?"; '
            'kill -9 $PPID 2>/dev/null; echo "kill=$?"'
        )
        result = await ws.exec(probe).wait()
        assert result.stdout == "fd2=1\nfd1=1\nenviron=1\nmem=1\nkill=1\n"
        assert (result.stop_reason, result.exit_code) == ("exited", 0)
        assert DEMO not in result.message
    finally:
        await ws.delete()


def test_daemon_process_log_and_audit_hold_no_secret_value(tmp_path: Path, default_image: str) -> None:
    """The real `python -m sandboxd`: value from its environment, debug logging, a failing command echoing it."""
    import asyncio

    value = "env-secret-Zq9wX2vB7n"

    async def use(socket_path: str) -> tuple[str, str]:
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            ws = await client.create_workspace(env={"TOKEN": "secret:demo"})
            try:
                result = await ws.exec('echo "$TOKEN"; echo "$TOKEN" >&2; exit 7').wait()
                return result.stdout, result.stderr
            finally:
                await ws.delete()

    with spawned_daemon(tmp_path, SANDBOXD_SECRET_demo=value, SANDBOXD_LOG_LEVEL="debug") as (_p, socket, log):
        stdout, stderr = asyncio.run(use(socket))
    assert stdout == stderr == "[REDACTED:demo]\n"
    daemon_log = log.read_text()
    assert "workspace.created" in daemon_log  # the log is really there
    assert value not in daemon_log
    audit = (tmp_path / "audit.jsonl").read_text()
    assert '"rpc": "Exec"' in audit and value not in audit


def test_too_short_secret_is_refused_at_start(tmp_path: Path) -> None:
    from sandboxd.errors import InvalidSpecError
    from sandboxd.secrets import SecretStore

    with pytest.raises(InvalidSpecError, match="shorter than 4 characters"):
        SecretStore("", {"SANDBOXD_SECRET_pin": "123"})
    bad = tmp_path / "secrets.json"
    bad.write_text("[1, 2]")
    with pytest.raises(InvalidSpecError, match="must be a JSON object"):
        SecretStore(str(bad), {})


async def test_a_forged_resume_from_inside_a_masked_value_does_not_unmask_its_rest(secret_client) -> None:  # type: ignore[no-untyped-def]
    """``resume_from`` pointing into a value already delivered masked: the agent sends again from there.

    stdout holds back ``s3cr`` (it could begin the value) at offsets 2-5, so the agent's acknowledgement
    stays at 2 while stderr's whole value (offsets 6-32) goes out masked. A caller that resumes at 12
    gets the agent's bytes from 12 fed to a fresh masker: the value's last 21 characters, in clear.
    """
    ws = await secret_client.create_workspace()
    try:
        # One write on stdout (its masked part seen means its held part arrived), then stderr's.
        command = 'printf "a\\n%s" "${K:0:4}"; read x; echo "$K" >&2; sleep 600'
        events, out, _ = await collect(ws.exec(command, env={"K": "secret:demo"}, yield_after_s=0.25))
        process_id = events[-1].process_id
        while out != "a\n":  # a loaded host: it comes in a later poll
            out += (await collect(secret_client.input(process_id, yield_after_s=0.25)))[1]
        _, _, err = await collect(secret_client.input(process_id, "x\n", yield_after_s=0.25))
        while err != "[REDACTED:demo]\n":
            err += (await collect(secret_client.input(process_id, yield_after_s=0.25)))[2]
        _, out, err = await collect(secret_client.input(process_id, resume_from=12, yield_after_s=1))
        assert DEMO[6:] not in out + err  # stderr began at offset 6: 12 is 6 into the value
        await secret_client.kill(process_id)
    finally:
        await ws.delete()
