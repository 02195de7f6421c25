"""Kubernetes: the manifests a workspace becomes (no ``Backend`` yet; see docs/kubernetes.md)."""

from .manifests import (
    Cluster,
    daemon_rbac,
    egress_proxy,
    namespace,
    workspace_claim,
    workspace_network_policy,
    workspace_pod,
)

__all__ = [
    "Cluster",
    "daemon_rbac",
    "egress_proxy",
    "namespace",
    "workspace_claim",
    "workspace_network_policy",
    "workspace_pod",
]
