"""The E2B plane under tokens and abuse: keys are tenants, nothing crosses, bad input gets E2B's errors.

And the domain form the SDK prefers (``E2B_DOMAIN``: ``https://api.DOMAIN`` and
``https://49983-ID.DOMAIN``), over TLS and HTTP/2, with the names resolved through a hosts file
of the test's own (a private mount namespace: the machine's /etc/hosts is not touched).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import AuthenticationException, Sandbox, SandboxNotFoundException

from sandboxd.tenancy import create_token
from tests.conftest import DaemonThread, make_settings
from tests.integration.helpers import certificates

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory, e2b_image: str) -> Iterator[tuple[str, str, str]]:
    """A daemon that requires tokens, with the E2B plane on: its URL and the keys of two tenants."""
    tmp = tmp_path_factory.mktemp("e2b-tenancy")
    tokens = tmp / "tokens.json"
    key_a, key_b = create_token(tokens, "team-a"), create_token(tokens, "team-b")
    thread = DaemonThread(make_settings(tmp, tokens_file=str(tokens), e2b_address="127.0.0.1:0")).start()
    yield f"http://{thread.daemon.e2b.address}", key_a, key_b
    thread.stop()


@pytest.fixture
def plane(tenants: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, str]:
    url = tenants[0]
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    return tenants


def _start(url: str, sandbox_id: str, token: str, command: str = "echo hi") -> httpx.Response:
    """envd's Process/Start as a raw Connect call (one JSON message in an envelope)."""
    message = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", command]}}).encode()
    return httpx.post(
        f"{url}/process.Process/Start",
        content=b"\0" + len(message).to_bytes(4, "big") + message,
        headers={
            "content-type": "application/connect+json",
            "connect-protocol-version": "1",
            "e2b-sandbox-id": sandbox_id,
            "x-access-token": token,
        },
    )


def _frames(body: bytes) -> list[tuple[int, dict[str, object]]]:
    frames, at = [], 0
    while at < len(body):
        size = int.from_bytes(body[at + 1 : at + 5], "big")
        frames.append((body[at], json.loads(body[at + 5 : at + 5 + size])))
        at += 5 + size
    return frames


def test_each_key_sees_only_its_tenants_sandboxes(plane: tuple[str, str, str]) -> None:
    url, key_a, key_b = plane
    mine = Sandbox.create(api_key=key_a, metadata={"owner": "a"})
    try:
        assert mine.commands.run("echo mine").stdout == "mine\n"
        listed_b = Sandbox.list(api_key=key_b).next_items()
        assert mine.sandbox_id not in [s.sandbox_id for s in listed_b]
        assert mine.sandbox_id in [s.sandbox_id for s in Sandbox.list(api_key=key_a).next_items()]
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(mine.sandbox_id, api_key=key_b)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(mine.sandbox_id, api_key=key_b)
        assert Sandbox.kill(mine.sandbox_id, api_key=key_b) is False
        # envd with the other tenant's token and this sandbox's id: not found, nothing runs.
        stolen = _start(url, mine.sandbox_id, key_b, "touch /workspace/pwned")
        assert stolen.status_code == 200
        assert _frames(stolen.content)[-1][1]["error"]["code"] == "not_found"  # type: ignore[index]
        read = httpx.get(
            f"{url}/files",
            params={"path": "/etc/hostname"},
            headers={"e2b-sandbox-id": mine.sandbox_id, "x-access-token": key_b},
        )
        assert (read.status_code, read.json()["code"]) == (404, 404)
        assert mine.files.exists("/workspace/pwned") is False
        # Its own token works the same raw way: the refusal above was the tenant's, not the shape's.
        own = _frames(_start(url, mine.sandbox_id, key_a).content)
        assert own[0][1] == {"event": {"start": {"pid": own[0][1]["event"]["start"]["pid"]}}}  # type: ignore[index]
        assert own[-1] == (2, {})
    finally:
        assert Sandbox.kill(mine.sandbox_id, api_key=key_a) is True


def test_no_key_or_an_unknown_one_is_refused(plane: tuple[str, str, str]) -> None:
    url, _, _ = plane
    bare = httpx.post(f"{url}/v2/sandboxes", json={"templateID": "base"})
    assert bare.status_code == 401
    assert bare.json()["code"] == 401
    assert "bearer token" in bare.json()["message"]
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-a-token")
    refused = _frames(_start(url, "ws-000000000000", "").content)
    assert refused[-1][1]["error"]["code"] == "unauthenticated"  # type: ignore[index]


def test_bad_requests_get_e2b_errors_not_traces(plane: tuple[str, str, str]) -> None:
    url, key_a, _ = plane
    headers = {"x-api-key": key_a}
    cases = [
        (b"{not json", 400, "not JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"timeout": 0}).encode(), 400, "timeout must be whole seconds"),
        (json.dumps({"timeout": "60"}).encode(), 400, "timeout must be whole seconds"),
        (json.dumps({"metadata": {"a b": "c"}}).encode(), 400, "metadata key"),
        (json.dumps({"metadata": {"k": 5}}).encode(), 400, "object of strings"),
        (json.dumps({"envVars": ["A=1"]}).encode(), 400, "object of strings"),
        (json.dumps({"templateID": 7}).encode(), 400, "templateID"),
        (json.dumps({"network": {"denyOut": ["10.0.0.0/8"]}}).encode(), 400, "cannot be expressed"),
        (json.dumps({"templateID": "no/such:image"}).encode(), 404, ""),
    ]
    for body, status, words in cases:
        answer = httpx.post(f"{url}/v2/sandboxes", content=body, headers=headers)
        assert answer.status_code == status, (body, answer.text)
        assert answer.json()["code"] == status
        assert words in answer.json()["message"]
    assert httpx.get(f"{url}/sandboxes/ws-nope", headers=headers).json() == {
        "code": 404,
        "message": "sandbox ws-nope was not found",
    }
    listed = httpx.get(f"{url}/v2/sandboxes", params={"limit": "0"}, headers=headers)
    assert (listed.status_code, listed.json()["code"]) == (400, 400)

    def chunked():  # type: ignore[no-untyped-def]
        yield b"--b\r\nContent-Disposition: form-data; name=file; filename=f\r\n\r\nx\r\n--b--\r\n"

    form = {"content-type": "multipart/form-data; boundary=b"}
    keyless = httpx.post(f"{url}/files", content=chunked(), headers={"e2b-sandbox-id": "ws-000000000000", **form})
    assert (keyless.status_code, keyless.json()["code"]) == (401, 401)  # who asks comes first
    sandbox = Sandbox.create(api_key=key_a)
    try:
        unbounded = httpx.post(
            f"{url}/files",
            content=chunked(),
            headers={"e2b-sandbox-id": sandbox.sandbox_id, "x-access-token": key_a, **form},
        )
        assert (unbounded.status_code, unbounded.json()["code"]) == (411, 411)
    finally:
        sandbox.kill()
    metrics = httpx.get(f"{url}/sandboxes/ws-nope/metrics", headers=headers)
    assert (metrics.status_code, metrics.json()["code"]) == (501, 501)
    # envd without a sandbox id, and with an Authorization header that is not Basic.
    no_id = _frames(_start(url, "", key_a).content)
    assert no_id[-1][1]["error"]["code"] == "invalid_argument"  # type: ignore[index]
    message = b'{"path": "/"}'
    bearer = httpx.post(
        f"{url}/filesystem.Filesystem/Stat",
        content=message,
        headers={
            "content-type": "application/json",
            "e2b-sandbox-id": "ws-000000000000",
            "x-access-token": key_a,
            "authorization": "Bearer x",
        },
    )
    assert (bearer.status_code, bearer.json()["code"]) == (400, "invalid_argument")


def test_forged_connect_frames_and_oversized_messages_are_refused(plane: tuple[str, str, str]) -> None:
    url, key_a, _ = plane
    sandbox = Sandbox.create(api_key=key_a)
    try:
        base = {
            "content-type": "application/connect+json",
            "connect-protocol-version": "1",
            "e2b-sandbox-id": sandbox.sandbox_id,
            "x-access-token": key_a,
        }
        claimed_huge = b"\0" + (64 * 1024 * 1024).to_bytes(4, "big") + b"{}"
        answer = httpx.post(f"{url}/process.Process/Start", content=claimed_huge, headers=base)
        assert _frames(answer.content)[-1][1]["error"]["code"] == "resource_exhausted"  # type: ignore[index]
        garbage = b"\0\0\0\0\x05notjs"
        answer = httpx.post(f"{url}/process.Process/Start", content=garbage, headers=base)
        assert _frames(answer.content)[-1][1]["error"]["code"] == "invalid_argument"  # type: ignore[index]
        basic = "Basic " + base64.b64encode(b"nosuchuser:").decode()
        answer = httpx.post(
            f"{url}/process.Process/Start",
            content=b"\0" + (49).to_bytes(4, "big") + b'{"process":{"cmd":"/bin/bash","args":["-c","id"]}}'[:49],
            headers={**base, "authorization": basic},
        )
        assert _frames(answer.content)[-1][1]["error"]["code"] == "invalid_argument"  # type: ignore[index]
        assert sandbox.commands.run("echo alive").stdout == "alive\n"
    finally:
        sandbox.kill()


_CREATE = "from e2b import Sandbox; print(Sandbox.create().sandbox_id)"
_USE = textwrap.dedent(
    """
    import sys

    import httpx
    from e2b import Sandbox

    sandbox = Sandbox.connect(sys.argv[1])
    try:
        print(sandbox.commands.run("echo over-tls").stdout, end="")
        sandbox.files.write("/workspace/t.txt", "tls file")
        print(sandbox.files.read("/workspace/t.txt"))
        print(Sandbox.get_info(sandbox.sandbox_id).sandbox_id == sandbox.sandbox_id)
    finally:
        sandbox.kill()
    with httpx.Client(http2=True) as client:  # what ALPN chose, as the SDK's client negotiates it
        print(client.get("https://api.sbx.test/health").http_version)
    """
)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_the_domain_form_over_tls_and_http2(tmp_path: Path, e2b_image: str) -> None:
    address = f"127.{secrets.randbelow(200) + 20}.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 1}"
    certs = certificates(tmp_path, names=("*.sbx.test", "api.sbx.test"))
    tokens = tmp_path / "tokens.json"
    key = create_token(tokens, "team-tls")
    settings = make_settings(
        tmp_path,
        tokens_file=str(tokens),
        e2b_address=f"{address}:443",  # the domain form has no port: 443
        tls_cert_file=str(certs["server_cert"]),
        tls_key_file=str(certs["server_key"]),
    )
    thread = DaemonThread(settings).start()
    try:
        hosts = tmp_path / "hosts"
        hosts.write_text(f"127.0.0.1 localhost\n{address} api.sbx.test\n")
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("E2B_")},
            "E2B_DOMAIN": "sbx.test",
            "E2B_API_KEY": key,
            "SSL_CERT_FILE": str(certs["ca_cert"]),
        }

        def python(*args: str) -> subprocess.CompletedProcess[str]:
            # A private mount namespace whose /etc/hosts is this test's file.
            command = f'mount --bind "{hosts}" /etc/hosts && exec "$@"'
            return subprocess.run(
                ["unshare", "--mount", "sh", "-c", command, "sh", sys.executable, *args],
                check=False,
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )

        created = python("-c", _CREATE)
        assert created.returncode == 0, created.stderr[-3000:]
        sandbox_id = created.stdout.strip()
        # The SDK reaches its envd at 49983-ID.DOMAIN; its resolver reads the hosts file once.
        with hosts.open("a") as lines:
            lines.write(f"{address} 49983-{sandbox_id}.sbx.test\n")
        script = tmp_path / "use.py"
        script.write_text(_USE)
        used = python(str(script), sandbox_id)
        assert used.returncode == 0, used.stderr[-3000:]
        assert used.stdout == "over-tls\ntls file\nTrue\nHTTP/2\n"
    finally:
        thread.stop()


def test_an_upload_is_refused_before_its_body_is_read(plane: tuple[str, str, str]) -> None:
    import socket
    import urllib.parse

    url, key_a, key_b = plane
    sandbox = Sandbox.create(api_key=key_a)
    try:
        address = urllib.parse.urlsplit(url)
        for token in ("bogus", key_b):  # no tenant, and another tenant
            with socket.create_connection((address.hostname, address.port), timeout=20) as raw:
                raw.sendall(
                    (
                        f"POST /files?path=/workspace/x HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {sandbox.sandbox_id}\r\n"
                        f"X-Access-Token: {token}\r\nContent-Type: application/octet-stream\r\n"
                        "Content-Length: 1000000000\r\n\r\n"
                    ).encode()
                )
                answer = raw.recv(4096).decode()  # answered with not one byte of the promised body sent
            assert answer.split("\r\n")[0] in ("HTTP/1.1 401 ", "HTTP/1.1 404 "), answer[:200]
        assert sandbox.files.exists("/workspace/x") is False
    finally:
        sandbox.kill()


def test_a_gzip_upload_inflates_whole_and_bounded(plane: tuple[str, str, str]) -> None:
    _, key_a, _ = plane
    sandbox = Sandbox.create(api_key=key_a)
    try:
        text = "".join(f"line {n}\n" for n in range(600_000))  # 6.6 MB that gzip makes small
        sandbox.files.write("/workspace/big.txt", text, gzip=True)
        assert sandbox.commands.run("wc -c < /workspace/big.txt").stdout.strip() == str(len(text))
        assert sandbox.commands.run("tail -n 1 /workspace/big.txt").stdout == "line 599999\n"
    finally:
        sandbox.kill()


def test_watchers_of_a_sandbox_are_bounded_even_asked_for_at_once(plane: tuple[str, str, str]) -> None:
    import asyncio

    url, key_a, _ = plane
    sandbox = Sandbox.create(api_key=key_a)
    try:
        headers = {"e2b-sandbox-id": sandbox.sandbox_id, "x-access-token": key_a}

        async def create_all() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                return await asyncio.gather(
                    *(
                        client.post("/filesystem.Filesystem/CreateWatcher", headers=headers, json={"path": "/tmp"})
                        for _ in range(24)
                    )
                )

        answers = asyncio.run(create_all())
        made = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code != 200]
        assert len(made) == 16
        assert {a.json()["code"] for a in refused} == {"resource_exhausted"}
        # A stream counts as a watcher of its sandbox too.
        message = b'{"path": "/tmp"}'
        stream = httpx.post(
            f"{url}/filesystem.Filesystem/WatchDir",
            content=b"\0" + len(message).to_bytes(4, "big") + message,
            headers={**headers, "content-type": "application/connect+json", "connect-protocol-version": "1"},
        )
        assert _frames(stream.content)[-1][1]["error"]["code"] == "resource_exhausted"  # type: ignore[index]
    finally:
        sandbox.kill()
