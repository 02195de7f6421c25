"""The egress proxy's contract: an allowlist's rules, the squid policy they become, the proxy's address.

Pure functions and constants, shared by the Docker path (:mod:`sandboxd.egress`, which runs a
proxy per ALLOWLIST workspace) and the Kubernetes manifests (a proxy container beside the
workspace), so neither backend depends on the other's machinery.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Sequence

from .errors import InvalidSpecError, quoted
from .models import EgressRule, NetworkPolicy

__all__ = [
    "DEFAULT_PORTS",
    "MAX_PORTS",
    "MAX_RULES",
    "PROXY_ALIAS",
    "PROXY_PORT",
    "check_rules",
    "proxy_env",
    "rules_from_json",
    "rules_to_json",
    "squid_policy",
]

MAX_RULES = 128
"""Most rules in one allowlist."""
MAX_PORTS = 32
"""Most ports in one rule."""
DEFAULT_PORTS = (80, 443)
"""A rule's ports when it names none: HTTP and HTTPS."""
PROXY_ALIAS = "egress"
"""The proxy's name on the workspace's network (its address changes when it is replaced)."""
PROXY_PORT = 3128
_LABEL_RULE = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


def _check_name(name: str) -> bool:
    labels = name.split(".")
    return len(name) <= 253 and all(_LABEL_RULE.fullmatch(label) for label in labels)


def check_rules(network: NetworkPolicy, rules: Sequence[EgressRule]) -> tuple[EgressRule, ...]:
    """The rules normalised (lower case, no final dot, ports sorted), or why they are refused.

    Raises:
        InvalidSpecError: rules for a policy other than ALLOWLIST, too many rules or ports, a
            host that is no name, pattern, address or block, or a port outside 1-65535.
    """
    if rules and network is not NetworkPolicy.ALLOWLIST:
        msg = f"allowed_hosts is only for the network policy 'allowlist', not {str(network)!r}"
        raise InvalidSpecError(msg)
    if len(rules) > MAX_RULES:
        msg = f"allowed_hosts has {len(rules)} rules; the limit is {MAX_RULES}"
        raise InvalidSpecError(msg)
    checked = []
    for rule in rules:
        host = rule.host.strip().lower().removesuffix(".")
        name = host.removeprefix("*.")
        if not host or (not _check_name(name) and not _is_address(host)):
            msg = (
                f"allowed_hosts: {quoted(rule.host)} is not a host name, '*.' and a name, an IP address or a CIDR block"
            )
            raise InvalidSpecError(msg)
        if len(rule.ports) > MAX_PORTS or any(not 1 <= port <= 65535 for port in rule.ports):
            msg = f"allowed_hosts: the ports of {quoted(rule.host)} must be at most {MAX_PORTS}, each 1-65535"
            raise InvalidSpecError(msg)
        checked.append(EgressRule(host=host, ports=tuple(sorted(set(rule.ports)))))
    return tuple(checked)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_network(host, strict=False)
    except ValueError:
        return False
    return True


def squid_policy(rules: Iterable[EgressRule], clients: str) -> str:
    """The squid ``acl`` and ``http_access`` lines of an allowlist (``squid.conf`` denies the rest).

    Only ``clients`` (the workspace's network, a CIDR block) may use the proxy: it listens on
    the egress network too, where other containers are. A name is looked up only once it matched
    a rule (squid stops at an ACL that fails, and ``never_dst`` comes last): a name that is not
    listed is never resolved, so nothing of it leaves through DNS. Every value is one checked by
    :func:`check_rules` or the engine's own block (no spaces, no squid syntax).
    """
    lines = [f"acl workspace src {ipaddress.ip_network(clients)}", "http_access deny !workspace"]
    for index, rule in enumerate(rules):
        ports = " ".join(str(port) for port in rule.ports or DEFAULT_PORTS)
        lines.append(f"acl r{index}_port port {ports}")
        if _is_address(rule.host):
            lines.append(f"acl r{index}_host dst {rule.host}")
            lines.append(f"http_access allow numeric_host r{index}_host r{index}_port")
        elif rule.host.startswith("*."):
            lines.append(f"acl r{index}_host dstdom_regex -i {re.escape('.' + rule.host[2:])}$")
            lines.append(f"http_access allow !numeric_host r{index}_host r{index}_port !never_dst")
        else:
            lines.append(f"acl r{index}_host dstdomain {rule.host}")
            lines.append(f"http_access allow !numeric_host r{index}_host r{index}_port !never_dst")
    return "\n".join(lines)


def rules_to_json(rules: Iterable[EgressRule]) -> str:
    """Rules as the proxy's label keeps them."""
    return json.dumps([[rule.host, list(rule.ports)] for rule in rules], separators=(",", ":"))


def rules_from_json(text: str) -> tuple[EgressRule, ...]:
    """Rules written by :func:`rules_to_json`."""
    return tuple(EgressRule(host=str(host), ports=tuple(int(p) for p in ports)) for host, ports in json.loads(text))


def proxy_env() -> dict[str, str]:
    """What every command of an ALLOWLIST workspace gets (curl reads only lower-case ``http_proxy``)."""
    proxy = f"http://{PROXY_ALIAS}:{PROXY_PORT}"
    local = "localhost,127.0.0.1,::1"
    return {
        "HTTP_PROXY": proxy,
        "HTTPS_PROXY": proxy,
        "http_proxy": proxy,
        "https_proxy": proxy,
        "NO_PROXY": local,
        "no_proxy": local,
    }
