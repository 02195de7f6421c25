"""The ALLOWLIST network policy against real servers: exactly the listed hosts, nothing else, audited.

Two test servers run in containers of the test's own, on a network of its own where they are
``allowed.test`` and ``denied.test`` (HTTP on 80, HTTPS with a self-signed certificate on
443); the daemon's egress proxies use that network as their way out. No outside host is
involved.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandboxd_client import InvalidArgumentError, SandboxClient

from tests.conftest import TEST_INSTANCE, DaemonThread, make_settings

pytestmark = pytest.mark.docker

SERVER = r"""
import http.server, ssl, subprocess, sys, threading
name = sys.argv[1]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        scheme = "https" if isinstance(self.connection, ssl.SSLSocket) else "http"
        body = f"{name} {scheme}\n".encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args): pass
subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "/tmp/k.pem",
                "-out", "/tmp/c.pem", "-days", "1", "-subj", f"/CN={name}"], check=True, capture_output=True)
plain = http.server.ThreadingHTTPServer(("0.0.0.0", 80), Handler)
tls = http.server.ThreadingHTTPServer(("0.0.0.0", 443), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); context.load_cert_chain("/tmp/c.pem", "/tmp/k.pem")
tls.socket = context.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
print("ready", flush=True)
plain.serve_forever()
"""

PROBE = r"""
for target in "$@"; do
  case $target in
    raw:*)
      host=${target#raw:}
      if timeout 3 bash -c "exec 3<>/dev/tcp/$host/80" 2>/dev/null; then state=open; else state=closed; fi
      echo "$target $state" ;;
    https:*)
      status=$(curl -sk -m 15 -o /dev/null -w '%{http_connect}/%{http_code}' "https://${target#https:}/")
      echo "$target $status" ;;
    *) printf '%s %s\n' "$target" "$(curl -s -m 15 -o /dev/null -w '%{http_code}' "http://$target/")" ;;
  esac
done
"""
"""Prints one line per target: the HTTP status through the proxy (``CONNECT/inner`` for https:),
or for ``raw:HOST`` whether a direct TCP connection to port 80 opened."""


@pytest.fixture(scope="module")
def servers(docker_client, default_image: str) -> Iterator[dict[str, object]]:  # type: ignore[no-untyped-def]
    """The test's network with ``allowed.test`` and ``denied.test`` on it; their addresses."""
    name = f"sandboxd-test-egress-{secrets.token_hex(3)}"
    labels = {"sandboxd.instance": TEST_INSTANCE}
    network = docker_client.networks.create(name, labels=labels)
    started = []
    try:
        for host in ("allowed.test", "denied.test"):
            container = docker_client.containers.create(
                default_image,
                ["python3", "-u", "-c", SERVER, host],
                user="0",
                labels=labels,
                network=name,
            )
            started.append(container)
            network.disconnect(container)
            network.connect(container, aliases=[host])
            container.start()
        addresses = {}
        for container, host in zip(started, ("allowed.test", "denied.test"), strict=True):
            deadline = time.monotonic() + 60
            while b"ready" not in container.logs():
                assert time.monotonic() < deadline, container.logs()
                time.sleep(0.1)
            container.reload()
            addresses[host] = container.attrs["NetworkSettings"]["Networks"][name]["IPAddress"]
        yield {"network": name, **addresses}
    finally:
        for container in started:
            container.remove(force=True)
        network.remove()


@pytest.fixture(scope="module")
def egress_daemon(servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonThread]:  # type: ignore[no-untyped-def]
    """A daemon whose egress proxies go out through the test's network."""
    tmp = tmp_path_factory.mktemp("egress")
    thread = DaemonThread(make_settings(tmp, egress_network=str(servers["network"]))).start()
    yield thread
    thread.stop()


async def probe(workspace, *targets: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    result = await workspace.exec(f"bash -c {_quote(PROBE)} probe " + " ".join(targets), timeout_s=120).wait()
    assert result.exit_code == 0, result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


def _gateway(network) -> str:  # type: ignore[no-untyped-def]
    """The address a network's members would reach its host at (its first, when the engine names none)."""
    config = network.attrs["IPAM"]["Config"][0]
    return str(config.get("Gateway") or next(ipaddress.ip_network(config["Subnet"]).hosts()))


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def denials(audit: Path, workspace_id: str) -> list[tuple[str, int]]:
    entries = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return [
        (str(e["host"]), int(e["port"]))
        for e in entries
        if e.get("event") == "egress.denied" and e.get("workspace_id") == workspace_id
    ]


async def until_denied(audit: Path, workspace_id: str, expected: set[tuple[str, int]]) -> list[tuple[str, int]]:
    """The workspace's denials once all of ``expected`` are on record (the proxy's log is read as it comes)."""
    deadline = time.monotonic() + 30
    while not expected <= set(found := denials(audit, workspace_id)):
        assert time.monotonic() < deadline, f"audited {found}, expected {expected}"
        await asyncio.sleep(0.1)
    return found


async def test_an_allowlist_lets_exactly_its_hosts_through(egress_daemon: DaemonThread, servers) -> None:  # type: ignore[no-untyped-def]
    """allowed.test over HTTP and CONNECT; denied.test, bare addresses, the metadata address and a raw
    connection refused; each denial audited with workspace, host and port."""
    allowed_ip, denied_ip = servers["allowed.test"], servers["denied.test"]
    async with SandboxClient(socket_path=egress_daemon.socket_path, retries=False) as client:
        ws = await client.create_workspace(network="allowlist", allowed_hosts=["allowed.test"], labels={"t": "egress"})
        try:
            assert (ws.info.network, ws.info.allowed_hosts) == ("allowlist", ("allowed.test",))
            seen = await probe(
                ws,
                "allowed.test",
                "https:allowed.test",
                "denied.test",
                "https:denied.test",
                str(denied_ip),
                str(allowed_ip),
                "169.254.169.254",
                f"raw:{allowed_ip}",
            )
            assert seen == {
                "allowed.test": "200",
                "https:allowed.test": "200/200",
                "denied.test": "403",
                "https:denied.test": "403/000",
                str(denied_ip): "403",
                str(allowed_ip): "403",  # its address is not its name: not listed
                "169.254.169.254": "403",
                f"raw:{allowed_ip}": "closed",  # no route but the proxy
            }
            body = await ws.exec("curl -s http://allowed.test/ && curl -sk https://ALLOWED.test/").wait()
            assert body.stdout == "allowed.test http\nallowed.test https\n"
            started = time.monotonic()
            resolved = await ws.exec("getent hosts allowed.test denied.test").wait()
            assert resolved.exit_code != 0 and resolved.stdout == ""  # the workspace resolves no name itself
            assert time.monotonic() - started < 15  # and says so soon (1 s a query, not 5 s twice)
            env = await ws.exec("echo $HTTP_PROXY $https_proxy $NO_PROXY").wait()
            assert env.stdout == "http://egress:3128 http://egress:3128 localhost,127.0.0.1,::1\n"
            expected = {
                ("denied.test", 80),
                ("denied.test", 443),
                (str(denied_ip), 80),
                (str(allowed_ip), 80),
                ("169.254.169.254", 80),
            }
            found = await until_denied(Path(egress_daemon.settings.audit_log), ws.workspace_id, expected)
            assert ("allowed.test", 80) not in found and ("allowed.test", 443) not in found
        finally:
            await ws.delete()


async def test_update_network_flips_the_allowlist_in_place(egress_daemon: DaemonThread, docker_client) -> None:  # type: ignore[no-untyped-def]
    """[allowed.test] -> [denied.test] flips both; then none: no proxy, no network left. Same container throughout."""
    async with SandboxClient(socket_path=egress_daemon.socket_path, retries=False) as client:
        ws = await client.create_workspace(network="allowlist", allowed_hosts=["allowed.test"], labels={"t": "egress"})
        try:
            await ws.write_file("/workspace/kept.txt", "still here\n")
            assert await probe(ws, "allowed.test", "denied.test") == {"allowed.test": "200", "denied.test": "403"}
            info = await ws.update_network("allowlist", allowed_hosts=["denied.test:80"])
            assert (info.network, info.allowed_hosts, info.container_id) == (
                "allowlist",
                ("denied.test:80",),
                ws.info.container_id,
            )
            assert await probe(ws, "allowed.test", "denied.test", "https:denied.test") == {
                "allowed.test": "403",
                "denied.test": "200",
                "https:denied.test": "403/000",  # port 443 is not in the new rule
            }
            assert (await client.get_workspace(ws.workspace_id)).info.allowed_hosts == ("denied.test:80",)
            await ws.update_network("none")
            offline = await ws.exec("curl -s -m 5 http://denied.test/; echo $?; echo ${HTTP_PROXY:-unset}").wait()
            code, proxy = offline.stdout.split()
            assert (code in {"6", "28"}, proxy) == (True, "unset")  # no proxy set, and no name resolves
            mine = {"label": [f"sandboxd.instance={egress_daemon.settings.instance}", "sandboxd.egress_of"]}
            assert docker_client.containers.list(all=True, filters=mine, ignore_removed=True) == []
            assert docker_client.networks.list(filters=mine) == []
            assert "still here" in (await ws.read_file("/workspace/kept.txt")).content
            await ws.update_network("allowlist", allowed_hosts=["allowed.test"])
            assert await probe(ws, "allowed.test") == {"allowed.test": "200"}
        finally:
            await ws.delete()
        mine = {"label": [f"sandboxd.instance={egress_daemon.settings.instance}", "sandboxd.egress_of"]}
        assert (
            docker_client.containers.list(all=True, filters=mine, ignore_removed=True) == []
        )  # gone with the workspace
        assert docker_client.networks.list(filters=mine) == []


async def test_bad_allowlists_are_refused_up_front(egress_daemon: DaemonThread) -> None:
    async with SandboxClient(socket_path=egress_daemon.socket_path, retries=False) as client:
        cases = [
            ({"network": "none", "allowed_hosts": ["allowed.test"]}, "allowed_hosts is only for the network policy"),
            ({"network": "allowlist", "allowed_hosts": ["exa mple.org"]}, "is not a host name"),
            ({"network": "allowlist", "allowed_hosts": ["a.test:70000"]}, "each 1-65535"),
            ({"network": "allowlist", "allowed_hosts": ["acl all src"]}, "is not a host name"),
            ({"network": "allowlist", "allowed_hosts": ["x.test"] * 129}, "the limit is 128"),
            ({"network": "allowlist", "runtime": "runsc"}, "not available under runtime 'runsc'"),
        ]
        for options, message in cases:
            with pytest.raises(InvalidArgumentError, match=message):
                await client.create_workspace(**options)  # type: ignore[arg-type]
        assert await client.list_workspaces() == []


async def test_a_restarted_daemon_keeps_the_policy_and_audits_on(servers, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The proxy outlives the daemon like its workspace: the rules, and the denials' audit, carry on."""
    settings = make_settings(tmp_path, egress_network=str(servers["network"]))
    first = DaemonThread(settings).start()
    try:
        async with SandboxClient(socket_path=first.socket_path, retries=False) as client:
            ws = await client.create_workspace(
                network="allowlist", allowed_hosts=["allowed.test"], labels={"t": "egress"}
            )
    finally:
        first.stop()
    second = DaemonThread(settings).start()
    try:
        async with SandboxClient(socket_path=second.socket_path, retries=False) as client:
            again = await client.get_workspace(ws.workspace_id)
            assert (again.info.network, again.info.allowed_hosts) == ("allowlist", ("allowed.test",))
            assert await probe(again, "allowed.test", "denied.test") == {"allowed.test": "200", "denied.test": "403"}
            await until_denied(Path(settings.audit_log), ws.workspace_id, {("denied.test", 80)})
            await again.delete()
    finally:
        second.stop()


async def test_the_engines_host_is_not_reachable_from_an_allowlist_workspace(  # type: ignore[no-untyped-def]
    egress_daemon: DaemonThread, docker_client
) -> None:
    """A server on the host listening on every address is out of reach: the workspace's network gives the
    host no address of its own (a plain internal network makes the host its gateway, and reachable)."""
    import socket

    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        async with SandboxClient(socket_path=egress_daemon.socket_path, retries=False) as client:
            ws = await client.create_workspace(
                network="allowlist", allowed_hosts=["allowed.test"], labels={"t": "egress"}
            )
            try:
                own = f"sandboxd-{egress_daemon.settings.instance}-{ws.workspace_id}.egress"
                gateway, bridge = (_gateway(docker_client.networks.get(name)) for name in (own, "bridge"))
                script = "; ".join(
                    f"if timeout 5 bash -c 'exec 3<>/dev/tcp/{host}/{port}' 2>/dev/null; then echo {host} open; "
                    f"else echo {host} closed; fi"
                    for host in (gateway, bridge)
                )
                result = await ws.exec(script).wait()
                assert result.stdout == f"{gateway} closed\n{bridge} closed\n"
            finally:
                await ws.delete()
    finally:
        listener.close()


RAW_REQUEST = r"""exec python3 -c '
import socket, sys
s = socket.create_connection(("egress", 3128), timeout=15)
s.sendall(sys.argv[1].encode().decode("unicode_escape").encode())
print(s.recv(200).split(b"\r\n")[0].decode())' """
"""Sends its argument (with \r\n escapes) to the proxy as it is; prints the status line back."""


async def test_the_proxy_serves_its_workspace_only_and_no_manager_or_forged_record(  # type: ignore[no-untyped-def]
    egress_daemon: DaemonThread, servers, docker_client, default_image: str
) -> None:
    """Squid's cache manager answers nobody; a request that makes squid quote its headers on stderr
    records no denial; another container on the egress network is refused, and no denial of the
    workspace's is recorded for it."""
    async with SandboxClient(socket_path=egress_daemon.socket_path, retries=False) as client:
        ws = await client.create_workspace(network="allowlist", allowed_hosts=["allowed.test"], labels={"t": "egress"})
        try:
            manager = await ws.exec(
                RAW_REQUEST + _quote(r"GET cache_object://allowed.test:80/menu HTTP/1.0\r\n\r\n")
            ).wait()
            assert manager.stdout.startswith("HTTP/1.1 403"), manager.stdout + manager.stderr
            forged = (
                r"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nVia: 1.1 sandboxd-egress (squid)\r\n"
                r"X-Forge: x\r\nsandboxd-egress TCP_DENIED 403 GET forged.test 4444 1.2.3.4\r\n\r\n"
            )
            await ws.exec(RAW_REQUEST + _quote(forged)).wait()
            proxy = docker_client.containers.get(f"sandboxd-{egress_daemon.settings.instance}-{ws.workspace_id}.egress")
            outside = proxy.attrs["NetworkSettings"]["Networks"][servers["network"]]["IPAddress"]
            neighbour = docker_client.containers.run(
                default_image,
                ["curl", "-s", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", "-x", f"http://{outside}:3128",
                 "http://allowed.test/"],
                labels={"sandboxd.instance": TEST_INSTANCE},
                network=str(servers["network"]),
                detach=True,
            )  # fmt: skip
            try:
                neighbour.wait(timeout=60)
                said = neighbour.logs()
            finally:
                neighbour.remove(force=True)
            assert said == b"403"
            await probe(ws, "denied.test")  # a denial of its own, recorded after the rest
            found = await until_denied(Path(egress_daemon.settings.audit_log), ws.workspace_id, {("denied.test", 80)})
            # The looped request is refused (a denial of its own); nothing forged, nothing of the neighbour's
            # (which asked for allowed.test too).
            assert found == [("allowed.test", 80), ("denied.test", 80)]
        finally:
            await ws.delete()
