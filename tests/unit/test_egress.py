"""The allowlist's rules: checked up front, rendered into squid's syntax, denials read off the proxy's log."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
from sandboxd_client._client import _rule_text, egress_rule
from sandboxd_client.errors import InvalidArgumentError

from sandboxd import egress
from sandboxd.audit import AuditLog
from sandboxd.egress import EgressProxies, check_rules, rules_from_json, rules_to_json, squid_policy
from sandboxd.errors import InvalidSpecError
from sandboxd.models import EgressRule, NetworkPolicy
from sandboxd.settings import Settings

ALLOW = NetworkPolicy.ALLOWLIST


def test_rules_are_normalised() -> None:
    rules = check_rules(
        ALLOW, [EgressRule("Example.ORG."), EgressRule("*.Pkg.dev", (443, 80, 443)), EgressRule("10.1.2.0/24")]
    )
    assert rules == (EgressRule("example.org"), EgressRule("*.pkg.dev", (80, 443)), EgressRule("10.1.2.0/24"))
    assert rules_from_json(rules_to_json(rules)) == rules


@pytest.mark.parametrize(
    ("host", "ports", "message"),
    [
        ("exa mple.org", (), "is not a host name"),
        ("acl all src 0.0.0.0/0", (), "is not a host name"),
        ("a.test\nhttp_access allow all", (), "is not a host name"),
        ("-bad.test", (), "is not a host name"),
        ("*.", (), "is not a host name"),
        ("a" * 64 + ".test", (), "is not a host name"),
        ("", (), "is not a host name"),
        ("a.test", (0,), "each 1-65535"),
        ("a.test", (65536,), "each 1-65535"),
        ("a.test", tuple(range(1, 34)), "at most 32"),
    ],
)
def test_bad_rules_are_refused(host: str, ports: tuple[int, ...], message: str) -> None:
    with pytest.raises(InvalidSpecError, match=message):
        check_rules(ALLOW, [EgressRule(host, ports)])


def test_rules_only_for_the_allowlist_and_at_most_128() -> None:
    with pytest.raises(InvalidSpecError, match="only for the network policy 'allowlist', not 'bridge'"):
        check_rules(NetworkPolicy.BRIDGE, [EgressRule("a.test")])
    with pytest.raises(InvalidSpecError, match="has 129 rules; the limit is 128"):
        check_rules(ALLOW, [EgressRule("a.test")] * 129)
    assert check_rules(NetworkPolicy.NONE, []) == ()


def test_the_squid_policy_of_each_kind_of_rule() -> None:
    policy = squid_policy(
        check_rules(ALLOW, [EgressRule("a.test"), EgressRule("*.b.test", (8443,)), EgressRule("10.0.0.0/8", (5432,))]),
        "192.168.48.0/20",
    )
    assert policy.splitlines() == [
        "acl workspace src 192.168.48.0/20",
        "http_access deny !workspace",
        "acl r0_port port 80 443",
        "acl r0_host dstdomain a.test",
        # never_dst last: squid stops at the first ACL that fails, so it resolves only listed names
        "http_access allow !numeric_host r0_host r0_port !never_dst",
        "acl r1_port port 8443",
        r"acl r1_host dstdom_regex -i \.b\.test$",
        "http_access allow !numeric_host r1_host r1_port !never_dst",
        "acl r2_port port 5432",
        "acl r2_host dst 10.0.0.0/8",
        "http_access allow numeric_host r2_host r2_port",
    ]
    assert squid_policy([], "10.0.0.0/24").splitlines() == [
        "acl workspace src 10.0.0.0/24",
        "http_access deny !workspace",
    ]
    with pytest.raises(ValueError):
        squid_policy([], "10.0.0.0/24\nhttp_access allow all")  # the engine's block, never text let through


def test_the_client_reads_host_and_ports() -> None:
    cases = {
        "example.org": ("example.org", []),
        "*.example.org:8443": ("*.example.org", [8443]),
        "a.test:80,8080": ("a.test", [80, 8080]),
        "10.0.0.0/8:5432": ("10.0.0.0/8", [5432]),
        "[2001:db8::1]:443": ("2001:db8::1", [443]),
        "2001:db8::/32": ("2001:db8::/32", []),
    }
    for text, (host, ports) in cases.items():
        rule = egress_rule(text)
        assert (rule.host, list(rule.ports)) == (host, ports), text
        assert _rule_text(rule) == text
    with pytest.raises(InvalidArgumentError):
        egress_rule("a.test:https")


def _proxies(tmp_path: Path) -> tuple[EgressProxies, Path]:
    audit_path = tmp_path / "audit.jsonl"
    proxies = EgressProxies(None, Settings(socket_path=str(tmp_path / "s")), "unused")  # type: ignore[arg-type]
    proxies.audit = AuditLog(str(audit_path))
    proxies._tenants["ws-1"] = "team-a"
    proxies._clients["ws-1"] = ipaddress.ip_network("172.24.0.0/16")
    return proxies, audit_path


def test_denials_are_read_off_the_log_and_audited(tmp_path: Path) -> None:
    proxies, audit_path = _proxies(tmp_path)
    proxies._on_line("ws-1", "stderr", "sandboxd-egress TCP_DENIED 403 GET from-a-header.test 80 172.24.0.3")
    proxies._on_line("ws-1", "stdout", "sandboxd-egress TCP_DENIED 403 GET from-elsewhere.test 80 172.17.0.5")
    for line in (
        "sandboxd-egress TCP_DENIED 403 CONNECT denied.test 443 172.24.0.3",
        "sandboxd-egress TCP_MISS 200 GET allowed.test 80 172.24.0.3",
        "2026/12/02 01:07:25| Accepting HTTP Socket connections at conn1 local=[::]:3128",
        "sandboxd-egress TCP_DENIED 403 GET 169.254.169.254 80 172.24.0.3",
        "garbage sandboxd-egress TCP_DENIED",
        "2026/12/02 01:07:25| WARNING: sandboxd-egress TCP_DENIED 403 GET forged.test 80 172.24.0.3",
        "sandboxd-egress TCP_DENIED 403 GET two.test 80 172.24.0.3 sandboxd-egress TCP_DENIED 403 GET x 1 y",
    ):
        proxies._on_line("ws-1", "stdout", line)
    entries = [json.loads(line) for line in audit_path.read_text().splitlines()]
    assert [(e["event"], e["workspace_id"], e["tenant"], e["host"], e["port"], e["method"]) for e in entries] == [
        ("egress.denied", "ws-1", "team-a", "denied.test", 443, "CONNECT"),
        ("egress.denied", "ws-1", "team-a", "169.254.169.254", 80, "GET"),
    ]


async def test_a_flood_of_denials_is_counted_not_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proxies, audit_path = _proxies(tmp_path)
    now = [1000.0]
    monkeypatch.setattr(egress.time, "monotonic", lambda: now[0])
    for _ in range(egress.DENIALS_PER_WINDOW + 49):
        proxies._on_line("ws-1", "stdout", "sandboxd-egress TCP_DENIED 403 GET x.test 80 172.24.0.3")
    proxies._on_line("ws-1", "stdout", "sandboxd-egress TCP_DENIED 403 CONNECT probe.test 443 172.24.0.3")
    now[0] += egress.DENIAL_WINDOW_S
    proxies._on_line("ws-1", "stdout", "sandboxd-egress TCP_DENIED 403 GET y.test 80 172.24.0.3")
    entries = [json.loads(line) for line in audit_path.read_text().splitlines()]
    listed = [e for e in entries if e["event"] == "egress.denied"]
    counted = [e for e in entries if e["event"] == "egress.denials_counted"]
    assert len(listed) == egress.DENIALS_PER_WINDOW + 1 and listed[-1]["host"] == "y.test"
    assert [(e["workspace_id"], e["denials"], e["hosts"]) for e in counted] == [
        ("ws-1", 50, ["probe.test:443", "x.test:80"])
    ]


async def test_a_windows_count_is_audited_when_it_ends_with_no_denial_after(tmp_path: Path) -> None:
    proxies, audit_path = _proxies(tmp_path)
    for _ in range(egress.DENIALS_PER_WINDOW + 3):
        proxies._on_line("ws-1", "stdout", "sandboxd-egress TCP_DENIED 403 GET x.test 80 172.24.0.3")
    window = proxies._denials["ws-1"]
    assert window.timer is not None  # due at the window's end
    window.timer._run()  # what the loop runs then
    entries = [json.loads(line) for line in audit_path.read_text().splitlines()]
    assert [e["denials"] for e in entries if e["event"] == "egress.denials_counted"] == [3]
