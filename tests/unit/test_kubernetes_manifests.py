"""The Kubernetes manifests a workspace becomes: valid against the 1.30+ schemas, and right field by field.

The specs are resolved and turned into a ContainerSpec by the daemon's own code
(``WorkspaceManager.resolve``, ``container_spec``), so these are the manifests of what a
caller would create. No cluster: ``kubernetes-validate`` ships the OpenAPI schemas.
"""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate
import pytest

from sandboxd.agentbuild import AgentBuild
from sandboxd.backend.base import ContainerSpec, ImageInfo
from sandboxd.backend.kubernetes import (
    Cluster,
    daemon_rbac,
    egress_proxy,
    namespace,
    workspace_claim,
    workspace_network_policy,
    workspace_pod,
)
from sandboxd.backend.kubernetes.manifests import ANNOTATION_LABELS, PRIVATE_BLOCKS, label_value, object_name
from sandboxd.egress import check_rules
from sandboxd.models import EgressRule, NetworkPolicy, ResourceLimits, Runtime, SecurityOptions, WorkspaceSpec
from sandboxd.settings import Settings
from sandboxd.workspaces import AGENT_CAPABILITIES, WorkspaceManager, container_spec

VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
CLUSTER = Cluster(
    namespace="sandboxes",
    instance="prod",
    agent_image="registry.example/sandboxd/agent:abc",
    egress_image="registry.example/sandboxd/egress:abc",
)
AGENT = AgentBuild("0" * 64)


def _container(spec: WorkspaceSpec, *, network: str = "", pool_class: str = "") -> ContainerSpec:
    manager = WorkspaceManager(backend=None, settings=Settings.from_env({}), processes=None)  # type: ignore[arg-type]
    resolved = manager.resolve(spec)
    return container_spec(
        resolved,
        "ws-0123456789ab",
        tenant="team-a",
        network=network or str(resolved.network),
        image=ImageInfo(image_id="", user="", os="linux", labels={}),
        agent=AGENT,
        pool_class=pool_class,
    )


DEFAULT = _container(WorkspaceSpec(labels={"job": "42"}))
GVISOR = _container(WorkspaceSpec(runtime=Runtime.RUNSC, limits=ResourceLimits(memory_bytes=512 << 20)))
RULES = check_rules(
    NetworkPolicy.ALLOWLIST,
    (EgressRule("pypi.org"), EgressRule("203.0.113.7", (8080,)), EgressRule("*.github.com"), EgressRule("160.0.0.0/3")),
)
ALLOWLIST = _container(
    WorkspaceSpec(network=NetworkPolicy.ALLOWLIST, allowed_hosts=RULES), network="sandboxd-prod-ws-0123456789ab.egress"
)
POOLED = _container(WorkspaceSpec(), pool_class="default")


def _valid(manifest: dict[str, Any]) -> None:
    for version in VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)


def _only(manifest: dict[str, Any]) -> dict[str, Any]:
    (container,) = manifest["spec"]["containers"]
    return container  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("spec", "extra"),
    [(DEFAULT, {}), (GVISOR, {}), (ALLOWLIST, {"proxy_address": "10.96.0.17"}), (POOLED, {"pool_class": "default"})],
    ids=["default", "gvisor", "allowlist", "pooled"],
)
def test_every_manifest_validates_against_the_schemas(spec: ContainerSpec, extra: dict[str, str]) -> None:
    pool_class = extra.get("pool_class", "")
    _valid(workspace_pod(spec, CLUSTER, **extra))
    _valid(workspace_network_policy(spec, CLUSTER, pool_class=pool_class))
    _valid(workspace_claim(spec, CLUSTER))
    for manifest in [*egress_proxy(spec.workspace_id, RULES, CLUSTER), *daemon_rbac(CLUSTER), *namespace(CLUSTER)]:
        _valid(manifest)


def test_a_manifest_the_schemas_refuse_is_refused() -> None:
    """The check is real: a misspelt field fails it."""
    pod = workspace_pod(DEFAULT, CLUSTER)
    pod["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, "1.30.0", strict=True)


def test_the_default_workspace_pod() -> None:
    """Root agent with its five capabilities and no escalation, limits as requests, the agent installed."""
    pod = workspace_pod(DEFAULT, CLUSTER)
    assert pod["metadata"]["name"] == "sandboxd-prod-ws-0123456789ab"
    assert pod["metadata"]["namespace"] == "sandboxes"
    assert pod["metadata"]["labels"] == {
        "sandboxd.dev/managed": "true",
        "sandboxd.dev/instance": "prod",
        "sandboxd.dev/workspace-id": "ws-0123456789ab",
        "sandboxd.dev/network": "none",
    }
    labels = json.loads(pod["metadata"]["annotations"][ANNOTATION_LABELS])
    assert labels == dict(DEFAULT.labels) and labels["job"] == "42" and labels["sandboxd.tenant"] == "team-a"
    assert pod["metadata"]["annotations"]["sandboxd.dev/pids"] == str(DEFAULT.pids)
    spec = pod["spec"]
    assert (spec["automountServiceAccountToken"], spec["enableServiceLinks"]) == (False, False)
    assert (spec["hostNetwork"], spec["hostPID"], spec["hostIPC"], spec["shareProcessNamespace"]) == (False,) * 4
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert "runtimeClassName" not in spec and "hostAliases" not in spec and "dnsConfig" not in spec
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    (init,) = spec["initContainers"]
    assert init["image"] == CLUSTER.agent_image
    assert init["command"] == ["/linux-amd64/sandboxd-agent", "install", "/.sandboxd/sandboxd-agent"]
    assert init["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    main = _only(pod)
    assert (main["image"], main["command"], main["workingDir"]) == (
        "sandboxd/base:bookworm",
        ["/.sandboxd/sandboxd-agent", "serve"],
        "/workspace",
    )
    assert main["env"] == []  # the workspace env goes to commands through the agent, never to it
    assert main["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": False,
        "capabilities": {"drop": ["ALL"], "add": sorted(AGENT_CAPABILITIES)},
    }
    limits = {"cpu": f"{DEFAULT.cpu_millis}m", "memory": "1Gi", "ephemeral-storage": "10Gi"}
    assert main["resources"] == {"limits": limits, "requests": limits}
    assert {m["mountPath"]: (m["name"], m.get("readOnly", False)) for m in main["volumeMounts"]} == {
        "/.sandboxd": ("agent", True),
        "/workspace": ("workspace", False),
        "/run/sandboxd": ("private-0", False),
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["workspace"] == {"name": "workspace", "emptyDir": {}}
    assert volumes["private-0"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Mi"}
    assert volumes["agent"]["emptyDir"] == {"sizeLimit": "64Mi"}


def test_a_gvisor_workspace_runs_under_its_runtime_class() -> None:
    pod = workspace_pod(GVISOR, CLUSTER)
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    assert _only(pod)["resources"]["limits"]["memory"] == "512Mi"
    other = workspace_pod(GVISOR, Cluster(**{**CLUSTER.__dict__, "gvisor_runtime_class": "runsc-kvm"}))
    assert other["spec"]["runtimeClassName"] == "runsc-kvm"


def test_caps_read_only_root_and_capabilities_reach_the_pod() -> None:
    spec = _container(
        WorkspaceSpec(
            limits=ResourceLimits(disk_bytes=2 << 30, memory_bytes=4 << 30),
            security=SecurityOptions(read_only_root_filesystem=True, added_capabilities=("NET_BIND_SERVICE",)),
        )
    )
    pod = workspace_pod(spec, CLUSTER)
    main = _only(pod)
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["capabilities"]["add"] == sorted({*AGENT_CAPABILITIES, "NET_BIND_SERVICE"})
    assert main["resources"]["limits"]["ephemeral-storage"] == "12Gi"  # 10 Gi of layer, the 2 Gi /workspace
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["workspace"]["emptyDir"] == {"sizeLimit": "2Gi"}
    assert volumes["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    pvc_cluster = Cluster(**{**CLUSTER.__dict__, "workspace_storage": "pvc", "storage_class": "fast"})
    on_pvc = workspace_pod(spec, pvc_cluster)
    assert {v["name"]: v for v in on_pvc["spec"]["volumes"]}["workspace"]["persistentVolumeClaim"] == {
        "claimName": "sandboxd-prod-ws-0123456789ab"
    }
    assert _only(on_pvc)["resources"]["limits"]["ephemeral-storage"] == "10Gi"
    claim = workspace_claim(spec, pvc_cluster)
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": "Filesystem",
        "resources": {"requests": {"storage": "2Gi"}},
        "storageClassName": "fast",
    }
    assert workspace_claim(DEFAULT, CLUSTER)["spec"]["resources"]["requests"]["storage"] == "10Gi"


def test_network_none_denies_everything_and_bridge_all_but_the_cluster() -> None:
    none = workspace_network_policy(DEFAULT, CLUSTER)["spec"]
    assert none == {
        "podSelector": {
            "matchLabels": {"sandboxd.dev/instance": "prod", "sandboxd.dev/workspace-id": "ws-0123456789ab"}
        },
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [],
    }
    bridged = workspace_network_policy(_container(WorkspaceSpec(network=NetworkPolicy.BRIDGE)), CLUSTER)["spec"]
    dns, internet = bridged["egress"]
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
    assert internet == {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_BLOCKS)}}]}
    assert "169.254.0.0/16" in PRIVATE_BLOCKS  # the node's metadata service
    assert bridged["ingress"] == []


def test_an_allowlist_workspace_reaches_its_proxy_alone_and_the_proxy_the_rules() -> None:
    with pytest.raises(ValueError, match="needs its proxy's address"):
        workspace_pod(ALLOWLIST, CLUSTER)
    pod = workspace_pod(ALLOWLIST, CLUSTER, proxy_address="10.96.0.17")
    assert pod["spec"]["hostAliases"] == [{"ip": "10.96.0.17", "hostnames": ["egress"]}]
    assert pod["spec"]["dnsPolicy"] == "None"
    assert pod["spec"]["dnsConfig"] == {
        "nameservers": ["127.0.0.1"],
        "options": [{"name": "timeout", "value": "1"}, {"name": "attempts", "value": "1"}],
    }
    assert pod["metadata"]["labels"]["sandboxd.dev/network"] == "allowlist"
    egress = workspace_network_policy(ALLOWLIST, CLUSTER)["spec"]["egress"]
    assert egress == [
        {
            "to": [
                {
                    "podSelector": {
                        "matchLabels": {
                            "sandboxd.dev/instance": "prod",
                            "sandboxd.dev/egress-of": ALLOWLIST.workspace_id,
                        }
                    }
                }
            ],
            "ports": [{"protocol": "TCP", "port": 3128}],
        }
    ]
    proxy, service, policy = egress_proxy(ALLOWLIST.workspace_id, RULES, CLUSTER)
    (squid,) = proxy["spec"]["containers"]
    (env,) = squid["env"]
    assert env["name"] == "SANDBOXD_EGRESS_POLICY"
    assert "acl r0_host dstdomain pypi.org" in env["value"] and "acl r1_host dst 203.0.113.7" in env["value"]
    assert squid["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 13,
        "runAsGroup": 13,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "sandboxd.dev/managed" not in proxy["metadata"]["labels"]  # a proxy is no workspace
    assert service["spec"]["selector"] == {
        "sandboxd.dev/instance": "prod",
        "sandboxd.dev/egress-of": ALLOWLIST.workspace_id,
    }
    assert policy["spec"]["ingress"] == [
        {
            "from": [
                {
                    "podSelector": {
                        "matchLabels": {
                            "sandboxd.dev/instance": "prod",
                            "sandboxd.dev/workspace-id": ALLOWLIST.workspace_id,
                        }
                    }
                }
            ],
            "ports": [{"protocol": "TCP", "port": 3128}],
        }
    ]
    dns, numeric, wide, named = policy["spec"]["egress"]
    assert dns["ports"][0] == {"protocol": "UDP", "port": 53}
    assert numeric == {"to": [{"ipBlock": {"cidr": "203.0.113.7/32"}}], "ports": [{"protocol": "TCP", "port": 8080}]}
    # A block that holds protected ones (the metadata service, 172.16/12) has them taken out.
    assert wide["to"] == [{"ipBlock": {"cidr": "160.0.0.0/3", "except": ["169.254.0.0/16", "172.16.0.0/12"]}}]
    assert named == {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_BLOCKS)}}],
        "ports": [{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 443}],
    }


def test_a_pool_member_belongs_to_its_class_until_claimed() -> None:
    pod = workspace_pod(POOLED, CLUSTER, pool_class="default")
    assert pod["metadata"]["labels"]["sandboxd.dev/pool"] == "default"
    assert "sandboxd.dev/workspace-id" not in pod["metadata"]["labels"]
    labels = json.loads(pod["metadata"]["annotations"][ANNOTATION_LABELS])
    assert labels["sandboxd.pool"] == "default" and "sandboxd.tenant" not in labels
    selector = workspace_network_policy(POOLED, CLUSTER, pool_class="default")["spec"]["podSelector"]
    assert selector == {"matchLabels": {"sandboxd.dev/instance": "prod", "sandboxd.dev/pool": "default"}}


def test_the_daemon_needs_one_namespaced_role() -> None:
    account, role, binding = daemon_rbac(CLUSTER)
    assert (account["kind"], role["kind"], binding["kind"]) == ("ServiceAccount", "Role", "RoleBinding")
    assert {m["metadata"]["namespace"] for m in (account, role, binding)} == {"sandboxes"}
    verbs = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert verbs[("", "pods")] == {"create", "get", "list", "watch", "patch", "delete"}
    assert verbs[("", "pods/exec")] == {"create", "get"}
    assert verbs[("coordination.k8s.io", "leases")] == {"create", "get", "update", "delete"}
    assert ("", "secrets") not in verbs and ("", "nodes") not in verbs
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sandboxd-prod"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sandboxd", "namespace": "sandboxes"}]


@pytest.mark.parametrize("host", ["169.254.169.254", "10.1.2.3", "172.16.0.0/16"])
def test_an_allowlist_rule_into_the_clusters_own_blocks_is_refused(host: str) -> None:
    rules = check_rules(NetworkPolicy.ALLOWLIST, (EgressRule(host),))
    with pytest.raises(ValueError, match="within the cluster's protected blocks"):
        egress_proxy("ws-0123456789ab", rules, CLUSTER)
    opened = Cluster(**{**CLUSTER.__dict__, "protected_blocks": ("169.254.0.0/16",)})
    if not host.startswith("169.254."):
        egress_proxy("ws-0123456789ab", rules, opened)  # an operator who says the cluster is elsewhere


def test_a_capability_beyond_the_baseline_standard_is_refused() -> None:
    spec = _container(WorkspaceSpec(security=SecurityOptions(added_capabilities=("NET_RAW",))))
    with pytest.raises(ValueError, match="NET_RAW are beyond the baseline Pod Security Standard"):
        workspace_pod(spec, CLUSTER)


def test_root_capabilities_are_the_container_s_and_held_to_the_baseline_too() -> None:
    spec = _container(WorkspaceSpec(security=SecurityOptions(root_capabilities=("DAC_OVERRIDE",))))
    (container,) = workspace_pod(spec, CLUSTER)["spec"]["containers"]
    assert "DAC_OVERRIDE" in container["securityContext"]["capabilities"]["add"]
    beyond = _container(WorkspaceSpec(security=SecurityOptions(root_capabilities=("SYS_ADMIN",))))
    with pytest.raises(ValueError, match="SYS_ADMIN are beyond the baseline Pod Security Standard"):
        workspace_pod(beyond, CLUSTER)


def test_the_namespace_is_baseline_and_denies_by_default() -> None:
    space, deny = namespace(CLUSTER)
    assert space["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []}


def test_names_and_label_values_are_always_valid() -> None:
    """An instance or id Kubernetes cannot take as it is gets a digest: the schemas do not check names."""
    names = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    values = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
    long = Cluster(**{**CLUSTER.__dict__, "instance": "Team_A.default"})
    for cluster in (CLUSTER, long):
        for workspace_id in ("ws-0123456789ab", "a" * 40, "ends-with-dash-"):
            for suffix in ("", "-egress"):
                assert names.fullmatch(object_name(cluster, workspace_id, suffix)), (cluster.instance, workspace_id)
            assert values.fullmatch(label_value(workspace_id)) and values.fullmatch(label_value(cluster.instance))
    assert object_name(CLUSTER, "ws-0123456789ab") == "sandboxd-prod-ws-0123456789ab"  # kept when it can be
    assert label_value("ends-with-dash-") != label_value("ends-with-dash")


def test_the_agent_gives_the_user_its_workspace_and_working_directory() -> None:
    """The agent's command line names the user and each directory made for it."""
    spec = _container(WorkspaceSpec(working_dir="/srv/app", security=SecurityOptions(user="4242")))
    assert spec.entrypoint == ("/.sandboxd/sandboxd-agent", "serve", "--own", "4242", "/workspace", "/srv/app")
    assert _only(workspace_pod(spec, CLUSTER))["command"] == list(spec.entrypoint)
    same = _container(WorkspaceSpec(security=SecurityOptions(user="nobody")))
    assert same.entrypoint[2:] == ("--own", "nobody", "/workspace")  # named once
