"""Kubernetes manifests for a workspace, its network and its egress proxy, and the daemon's RBAC.

Pure functions from what the Docker backend is given (a :class:`ContainerSpec`, built by
:func:`sandboxd.workspaces.container_spec`) to the objects a Kubernetes backend will create;
no client, no cluster. They are validated offline against the Kubernetes 1.30+ OpenAPI
schemas (``kubernetes-validate``) and checked field by field in
``tests/unit/test_kubernetes_manifests.py``. The design, and why each field is what it is,
is ``docs/kubernetes.md``; the backend itself is written when the conformance suite can
run against a real cluster.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...models import EgressRule
from ...proxy import DEFAULT_PORTS, PROXY_ALIAS, PROXY_PORT, squid_policy
from ..base import ContainerSpec

__all__ = [
    "ANNOTATION_LABELS",
    "BASELINE_CAPABILITIES",
    "LABEL_EGRESS_OF",
    "LABEL_INSTANCE",
    "LABEL_MANAGED",
    "LABEL_NETWORK",
    "LABEL_POOL",
    "LABEL_WORKSPACE",
    "PRIVATE_BLOCKS",
    "Cluster",
    "daemon_rbac",
    "egress_proxy",
    "namespace",
    "workspace_claim",
    "workspace_network_policy",
    "workspace_pod",
]

Manifest = dict[str, Any]

LABEL_MANAGED = "sandboxd.dev/managed"
LABEL_INSTANCE = "sandboxd.dev/instance"
LABEL_WORKSPACE = "sandboxd.dev/workspace-id"
LABEL_POOL = "sandboxd.dev/pool"
"""On a warm pool member: its class. A claim replaces it with the workspace's id (Kubernetes labels
change in place, unlike a container's: no claim record is needed)."""
LABEL_NETWORK = "sandboxd.dev/network"
"""``none``, ``bridge`` or ``allowlist``: which NetworkPolicy selects the Pod."""
LABEL_EGRESS_OF = "sandboxd.dev/egress-of"
"""On an egress proxy's Pod and Service: the workspace it serves."""
ANNOTATION_LABELS = "sandboxd.dev/labels"
"""Every label the Docker backend would set (the domain's ``sandboxd.*`` ones among them, the spec
and the tenant too), as one JSON object: label values are bounded to 63 plain characters, these
are not (a spec is kilobytes; a caller's label value may be any UTF-8)."""
AGENT_CONTAINER = "workspace"
"""The container the agent runs in: ``pods/exec`` of ``sandboxd-agent bridge`` names it."""
PRIVATE_BLOCKS = (
    "10.0.0.0/8",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
)
"""Never reached through ``bridge`` or an egress proxy: the cluster's own networks, the node's
link-local metadata service (169.254.169.254) and carrier-grade NAT. A rule naming an address or
block in them is the only way in (as under Docker)."""
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
"""What the baseline Pod Security Standard lets a container add: a workspace may add no other."""
_PROXY_UID = 13
"""Debian's ``proxy`` user, whom the egress image's squid runs as."""
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_SOCKET_DIR_BYTES = 1 << 20
_AGENT_DIR_BYTES = 64 << 20
_INSTALLER_UID = 65532


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cluster:
    """Where and how workspaces run on one cluster (one namespace, one daemon instance)."""

    namespace: str
    instance: str
    agent_image: str
    """The daemon's agent image (``sandboxd agent build``), pushed where the cluster pulls from."""
    egress_image: str
    """The egress proxy's image (``images/egress_proxy``), likewise."""
    architecture: str = "amd64"
    """The nodes' CPU architecture (``kubernetes.io/arch``): which of the agent's binaries is installed."""
    gvisor_runtime_class: str = "gvisor"
    """The RuntimeClass whose handler is runsc (a workspace of runtime ``runsc`` runs under it)."""
    workspace_storage: str = "emptyDir"
    """``emptyDir`` (gone with the Pod, like a Docker volume with its container) or ``pvc`` (a
    PersistentVolumeClaim per workspace: what VolumeSnapshots are taken of)."""
    storage_class: str = ""
    """The PVCs' StorageClass; empty: the cluster's default."""
    default_disk_bytes: int = 10 << 30
    """A PVC's size when the spec caps nothing (a claim must ask for a size)."""
    ephemeral_storage_bytes: int = 10 << 30
    """The container's writable layer and logs, beyond /workspace (Docker leaves it unbounded)."""
    dns_namespace: str = "kube-system"
    dns_labels: Mapping[str, str] = dataclasses.field(default_factory=lambda: {"k8s-app": "kube-dns"})
    """The cluster DNS Pods, which ``bridge`` workspaces and egress proxies may query."""
    service_account: str = "sandboxd"
    """The daemon's ServiceAccount (bound to :func:`daemon_rbac`'s Role)."""
    protected_blocks: Sequence[str] = PRIVATE_BLOCKS
    """What no workspace may reach, by ``bridge`` or an allowlist rule: the cluster's Pod and Service
    networks, its nodes, the API server's endpoints and the metadata service. Set it to the
    cluster's own when they are elsewhere (public node addresses, non-RFC 1918 Pod networks)."""


def object_name(cluster: Cluster, workspace_id: str, suffix: str = "") -> str:
    """A workspace's Pod, PVC and NetworkPolicy name (as its Docker container's), plus ``suffix``.

    A DNS label (at most 63 characters, as a Service name must be): one that would not be is
    ``sandboxd-`` and a digest of the instance and id instead.
    """
    name = f"sandboxd-{cluster.instance}-{workspace_id}{suffix}"
    if _NAME_RE.fullmatch(name):
        return name
    digest = hashlib.sha256(f"{cluster.instance}\0{workspace_id}".encode()).hexdigest()[:20]
    return f"sandboxd-{digest}{suffix}"


def label_value(text: str) -> str:
    """``text`` as a label value, or ``h-`` and its digest when it cannot be one.

    Too long, or an end that is no letter or digit (an id may end in a dash): selectors then
    match the digest.
    """
    if _LABEL_VALUE_RE.fullmatch(text):
        return text
    return f"h-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def _mode(network: str) -> str:
    return network if network in {"none", "bridge"} else "allowlist"


def _metadata(
    cluster: Cluster, name: str, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> Manifest:
    metadata: Manifest = {
        "name": name,
        "namespace": cluster.namespace,
        "labels": {LABEL_INSTANCE: label_value(cluster.instance), **labels},
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return metadata


def _selector(cluster: Cluster, spec: ContainerSpec, pool_class: str) -> dict[str, str]:
    """A workspace Pod's own labels: its class's while it is a pool member, else its workspace's."""
    if pool_class:
        return {LABEL_INSTANCE: label_value(cluster.instance), LABEL_POOL: label_value(pool_class)}
    return _workspace_selector(cluster, spec.workspace_id)


def _workspace_selector(cluster: Cluster, workspace_id: str) -> dict[str, str]:
    return {LABEL_INSTANCE: label_value(cluster.instance), LABEL_WORKSPACE: label_value(workspace_id)}


def _proxy_selector(cluster: Cluster, workspace_id: str) -> dict[str, str]:
    return {LABEL_INSTANCE: label_value(cluster.instance), LABEL_EGRESS_OF: label_value(workspace_id)}


def workspace_pod(spec: ContainerSpec, cluster: Cluster, *, pool_class: str = "", proxy_address: str = "") -> Manifest:
    """The workspace's Pod: the agent as its main process, installed by an init container.

    Args:
        spec: the container the Docker backend would make (limits, capabilities, labels...).
        cluster: the namespace, images and classes.
        pool_class: for a warm pool member, its class (the Pod is then nobody's until claimed).
        proxy_address: for an allowlist workspace, its egress proxy Service's cluster IP, which
            the Pod knows as ``egress`` (nothing resolves names there, as under Docker).

    Raises:
        ValueError: an allowlist workspace without ``proxy_address``, a spec with no entrypoint,
            or a capability the baseline Pod Security Standard does not allow.
    """
    mode = _mode(spec.network)
    _check_pod(spec, mode, proxy_address)
    volumes, mounts = _pod_volumes(spec, cluster)
    pod_spec: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,
        "hostname": "sandbox",
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 10,
        "nodeSelector": {"kubernetes.io/os": "linux", "kubernetes.io/arch": cluster.architecture},
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [_agent_installer(spec, cluster)],
        "containers": [_agent_container(spec, cluster, mounts)],
        "volumes": volumes,
    }
    if spec.runtime == "runsc":
        pod_spec["runtimeClassName"] = cluster.gvisor_runtime_class
    if mode == "allowlist":
        # Nothing resolves there, at once: the only name it needs is the proxy's, in hostAliases.
        options = [dict(zip(("name", "value"), option.split(":", 1), strict=False)) for option in spec.dns_options]
        pod_spec["dnsPolicy"] = "None"
        pod_spec["dnsConfig"] = {"nameservers": ["127.0.0.1"], "options": options}
    if proxy_address:
        pod_spec["hostAliases"] = [{"ip": proxy_address, "hostnames": [PROXY_ALIAS]}]
    labels = {LABEL_MANAGED: "true", **_selector(cluster, spec, pool_class), LABEL_NETWORK: mode}
    annotations = {ANNOTATION_LABELS: json.dumps(dict(spec.labels), sort_keys=True, separators=(",", ":"))}
    if spec.pids:
        # No Pod field bounds processes: the node's podPidsLimit does (docs/kubernetes.md).
        annotations["sandboxd.dev/pids"] = str(spec.pids)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(cluster, object_name(cluster, spec.workspace_id), labels, annotations),
        "spec": pod_spec,
    }


def _check_pod(spec: ContainerSpec, mode: str, proxy_address: str) -> None:
    """Refuse a spec no workspace Pod can be made of.

    Raises:
        ValueError: as :func:`workspace_pod` says.
    """
    # The agent's own include the root capabilities it hands to commands run as root.
    beyond = sorted({*spec.added_capabilities, *spec.agent_capabilities} - BASELINE_CAPABILITIES)
    if beyond:
        msg = f"capabilities {', '.join(beyond)} are beyond the baseline Pod Security Standard a workspace Pod meets"
        raise ValueError(msg)
    if mode == "allowlist" and not proxy_address:
        msg = "an allowlist workspace's Pod needs its proxy's address"
        raise ValueError(msg)
    if not spec.entrypoint or not spec.agent_mount:
        msg = "a workspace's Pod runs the agent: the spec names no entrypoint or agent mount"
        raise ValueError(msg)


def _pod_volumes(spec: ContainerSpec, cluster: Cluster) -> tuple[list[Manifest], list[Manifest]]:
    """The Pod's volumes, and the agent container's mounts of them, in that order.

    The agent's own directory, /workspace (a claim or a sized emptyDir), the private
    directories and, with a read-only root, /tmp.
    """
    volumes: list[Manifest] = [{"name": "agent", "emptyDir": {"sizeLimit": _quantity(_AGENT_DIR_BYTES)}}]
    mounts: list[Manifest] = [{"name": "agent", "mountPath": spec.agent_mount, "readOnly": True}]
    if cluster.workspace_storage == "pvc":
        volumes.append(
            {"name": "workspace", "persistentVolumeClaim": {"claimName": object_name(cluster, spec.workspace_id)}}
        )
    else:
        limit = {"sizeLimit": _quantity(spec.disk_bytes)} if spec.disk_bytes else {}
        volumes.append({"name": "workspace", "emptyDir": limit})
    mounts.append({"name": "workspace", "mountPath": "/workspace"})
    for index, path in enumerate(spec.private_dirs):
        # Memory-backed and small, as the Docker backend's tmpfs volume for the agent's socket.
        volumes.append(
            {"name": f"private-{index}", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(_SOCKET_DIR_BYTES)}}
        )
        mounts.append({"name": f"private-{index}", "mountPath": path})
    if spec.read_only_root_filesystem:
        volumes.append({"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(spec.memory_bytes)}})
        mounts.append({"name": "tmp", "mountPath": "/tmp"})
    return volumes, mounts


def _agent_installer(spec: ContainerSpec, cluster: Cluster) -> Manifest:
    """The init container that copies the agent's binary into the Pod's agent directory."""
    return {
        "name": "install-agent",
        "image": cluster.agent_image,
        # The agent's image has nothing but its binaries (FROM scratch): it copies itself.
        "command": [
            f"/linux-{cluster.architecture}/sandboxd-agent",
            "install",
            f"{spec.agent_mount}/sandboxd-agent",
        ],
        "securityContext": _non_root(_INSTALLER_UID, readOnlyRootFilesystem=True),
        "resources": {"limits": {"cpu": "100m", "memory": "32Mi"}},
        "volumeMounts": [{"name": "agent", "mountPath": spec.agent_mount}],
    }


def _agent_container(spec: ContainerSpec, cluster: Cluster, mounts: list[Manifest]) -> Manifest:
    """The workspace's container: the image, with the agent as its main process and the spec's limits."""
    ephemeral = cluster.ephemeral_storage_bytes + (spec.disk_bytes if cluster.workspace_storage != "pvc" else 0)
    resources = {
        "cpu": f"{spec.cpu_millis}m",
        "memory": _quantity(spec.memory_bytes),
        "ephemeral-storage": _quantity(ephemeral),
    }
    capabilities = sorted({*spec.added_capabilities, *spec.agent_capabilities})
    return {
        "name": AGENT_CONTAINER,
        "image": spec.image,
        "command": list(spec.entrypoint),
        "args": [],
        "workingDir": spec.working_dir,
        "env": [{"name": key, "value": value} for key, value in sorted(spec.env.items())],
        # The agent is root with five capabilities and starts every command as the
        # workspace user with none; as the workspace user itself, any command could
        # kill it (kill -9 -1). docs/kubernetes.md, Pod security.
        "securityContext": {
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "privileged": False,
            "allowPrivilegeEscalation": not spec.no_new_privileges,
            "readOnlyRootFilesystem": spec.read_only_root_filesystem,
            "capabilities": {"drop": ["ALL"], **({"add": capabilities} if capabilities else {})},
        },
        # Requests equal to limits: the Guaranteed class, never the first evicted.
        "resources": {"limits": dict(resources), "requests": dict(resources)},
        "volumeMounts": mounts,
    }


def workspace_claim(spec: ContainerSpec, cluster: Cluster) -> Manifest:
    """The PersistentVolumeClaim behind /workspace (``workspace_storage="pvc"``): its size is the cap."""
    claim_spec: Manifest = {
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": "Filesystem",
        "resources": {"requests": {"storage": _quantity(spec.disk_bytes or cluster.default_disk_bytes)}},
    }
    if cluster.storage_class:
        claim_spec["storageClassName"] = cluster.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(
            cluster, object_name(cluster, spec.workspace_id), _workspace_selector(cluster, spec.workspace_id)
        ),
        "spec": claim_spec,
    }


def workspace_network_policy(spec: ContainerSpec, cluster: Cluster, *, pool_class: str = "") -> Manifest:
    """What the workspace's Pod may reach, by its network mode.

    Nothing (``none``); the internet but the cluster and link-local addresses (``bridge``); its
    egress proxy alone (``allowlist``). Nothing may connect to it: the daemon comes in through
    the API server (``pods/exec``), not the Pod network.
    """
    mode = _mode(spec.network)
    egress: list[Manifest] = []
    if mode == "bridge":
        egress = [_dns_rule(cluster), {"to": [_public(cluster)]}]
    elif mode == "allowlist":
        proxy = {"podSelector": {"matchLabels": _proxy_selector(cluster, spec.workspace_id)}}
        egress = [{"to": [proxy], "ports": [{"protocol": "TCP", "port": PROXY_PORT}]}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(
            cluster, object_name(cluster, spec.workspace_id), _workspace_selector(cluster, spec.workspace_id)
        ),
        "spec": {
            "podSelector": {"matchLabels": _selector(cluster, spec, pool_class)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }


def egress_proxy(workspace_id: str, rules: Sequence[EgressRule], cluster: Cluster) -> list[Manifest]:
    """An allowlist workspace's proxy: its Pod (squid with the rules), its Service and NetworkPolicy.

    The proxy is reached by its workspace alone (the policy's ingress); it may query the
    cluster's DNS and reach what the rules name: public addresses on the rules' ports, and an
    address or block a rule names, less the cluster's protected blocks. squid then allows
    exactly the rules.

    Raises:
        ValueError: a rule names an address or block within ``cluster.protected_blocks``.
    """
    own = _proxy_selector(cluster, workspace_id)
    name = object_name(cluster, workspace_id, "-egress")
    policy_text = squid_policy(rules, "0.0.0.0/0")  # who may use it is the NetworkPolicy's to say
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(cluster, name, own),
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "restartPolicy": "Always",
            "nodeSelector": {"kubernetes.io/os": "linux", "kubernetes.io/arch": cluster.architecture},
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "squid",
                    "image": cluster.egress_image,
                    "env": [{"name": "SANDBOXD_EGRESS_POLICY", "value": policy_text}],
                    "ports": [{"name": "proxy", "containerPort": PROXY_PORT, "protocol": "TCP"}],
                    "securityContext": _non_root(_PROXY_UID),
                    "resources": {"limits": {"cpu": "250m", "memory": "128Mi"}},
                }
            ],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(cluster, name, own),
        "spec": {
            "type": "ClusterIP",
            "selector": own,
            "ports": [{"name": "proxy", "port": PROXY_PORT, "targetPort": "proxy", "protocol": "TCP"}],
        },
    }
    workspace = {"podSelector": {"matchLabels": _workspace_selector(cluster, workspace_id)}}
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(cluster, name, own),
        "spec": {
            "podSelector": {"matchLabels": own},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [workspace], "ports": [{"protocol": "TCP", "port": PROXY_PORT}]}],
            "egress": [_dns_rule(cluster), *_rule_egress(rules, cluster)],
        },
    }
    return [pod, service, policy]


def daemon_rbac(cluster: Cluster) -> list[Manifest]:
    """The daemon's ServiceAccount, and a Role in the workspaces' namespace bound to it: nothing cluster-wide."""
    rules = [
        # Workspaces and proxies; patch: a claim relabels a member.
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "patch", "delete"]},
        # The agent's channel (the bridge) and a command's exec: created with a POST, and upgraded with
        # a GET by the WebSocket protocol (v5.channel.k8s.io).
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},  # the proxy's denials
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["create", "get", "list", "delete"]},
        {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "get", "list", "delete"]},
        {
            "apiGroups": ["networking.k8s.io"],
            "resources": ["networkpolicies"],
            "verbs": ["create", "get", "list", "update", "delete"],
        },
        {
            "apiGroups": ["snapshot.storage.k8s.io"],
            "resources": ["volumesnapshots"],
            "verbs": ["create", "get", "list", "delete"],
        },
        # The instance's lease (one daemon per label), as the Docker backend's lease container.
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "update", "delete"]},
    ]
    name = f"sandboxd-{cluster.instance}"
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(cluster, cluster.service_account, {}),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _metadata(cluster, name, {}),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _metadata(cluster, name, {}),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": cluster.service_account, "namespace": cluster.namespace}],
        },
    ]


def _non_root(uid: int, **more: Any) -> Manifest:
    """A container's security context as the restricted Pod Security Standard asks: ``uid``, no capabilities."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "allowPrivilegeEscalation": False,
        **more,
        "capabilities": {"drop": ["ALL"]},
    }


def _dns_rule(cluster: Cluster) -> Manifest:
    dns = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": cluster.dns_namespace}},
        "podSelector": {"matchLabels": dict(cluster.dns_labels)},
    }
    return {"to": [dns], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}


def _public(cluster: Cluster) -> Manifest:
    return {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(cluster.protected_blocks)}}


def _rule_egress(rules: Iterable[EgressRule], cluster: Cluster) -> list[Manifest]:
    """Where an egress proxy may connect: each address rule's block, and public addresses for names.

    The protected blocks within an address rule's block are taken out of it.
    """
    protected = [ipaddress.ip_network(block) for block in cluster.protected_blocks]
    named_ports: set[int] = set()
    entries: list[Manifest] = []
    for rule in rules:
        ports = [{"protocol": "TCP", "port": port} for port in sorted(rule.ports or DEFAULT_PORTS)]
        try:
            block = ipaddress.ip_network(rule.host, strict=False)
        except ValueError:
            named_ports.update(rule.ports or DEFAULT_PORTS)
            continue
        if any(block.version == p.version and block.subnet_of(p) for p in protected):  # type: ignore[arg-type]
            msg = f"allowed host {rule.host} is within the cluster's protected blocks"
            raise ValueError(msg)
        inside = [str(p) for p in protected if p.version == block.version and p.subnet_of(block)]  # type: ignore[arg-type]
        entries.append(
            {"to": [{"ipBlock": {"cidr": str(block), **({"except": inside} if inside else {})}}], "ports": ports}
        )
    if named_ports:
        entries.append(
            {"to": [_public(cluster)], "ports": [{"protocol": "TCP", "port": p} for p in sorted(named_ports)]}
        )
    return entries


def namespace(cluster: Cluster) -> list[Manifest]:
    """The workspaces' Namespace, held to the baseline Pod Security Standard, and a default deny.

    The NetworkPolicy denies every Pod of it everything until its own policy says otherwise: a
    Pod no policy selects would otherwise be open (before its policy exists, or during a claim).
    """
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": cluster.namespace,
                "labels": {
                    "pod-security.kubernetes.io/enforce": "baseline",
                    "pod-security.kubernetes.io/warn": "baseline",
                },
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _metadata(cluster, "sandboxd-default-deny", {}),
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []},
        },
    ]


def _quantity(size_bytes: int) -> str:
    """A byte count as a Kubernetes quantity: exact, in the largest binary unit that divides it."""
    for suffix, factor in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if size_bytes and size_bytes % factor == 0:
            return f"{size_bytes // factor}{suffix}"
    return str(size_bytes)
