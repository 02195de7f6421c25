"""Workspace life cycle: validate a spec, apply the hardened defaults, and keep it in labels.

The daemon keeps no state the engine does not: a workspace's resolved spec is
stored as JSON in its container's ``sandboxd.spec`` label, so ``get`` and
``list`` read it back from Docker and a restarted daemon sees the same thing.

The package's modules, and what each is the home of:

- ``specs``: checking and resolving a spec, its labels, and the container it asks for.
- ``listing``: ListWorkspaces' pages and page tokens.
- ``records``: :class:`WorkspaceRecord`, what the daemon holds of one workspace, and :class:`Records`.
- ``bridge``: exec contexts and agent links; pausing, thawing and waking a workspace.
- ``provision``: starting a workspace's container until its agent answers.
- ``members``: what the warm pool needs: members started, checked, claimed and removed.
- ``creating``: create requests: one per id, idempotent by request id, within the tenant's quota.
- ``network``: a workspace's network policy, read back at adoption and changed by UpdateNetwork.
- ``idle``: the idle reaper.
- ``manager``: :class:`WorkspaceManager`, the life cycle the servicers call, and the one teardown.

Imports go one way, from ``manager`` down: ``creating`` -> ``members`` -> ``provision`` ->
``bridge`` -> ``records`` -> ``specs`` (``network``, ``idle`` and ``listing`` sit beside them).
The warm pool (``sandboxd.pool``) imports nothing of this package: it is given
:class:`~sandboxd.workspaces.members.PoolMembers` as its ``MemberFactory``.
"""

from .manager import WorkspaceManager
from .specs import (
    AGENT_CAPABILITIES,
    AGENT_SOCKET_DIR,
    AGENT_SOCKET_NAME,
    CAPABILITIES,
    FALLBACK_USER,
    LABEL_AGENT,
    LABEL_CREATE_REQUEST,
    LABEL_RESTORED_FROM,
    LABEL_SNAPSHOT,
    LABEL_SNAPSHOT_CONTAINER,
    LABEL_SNAPSHOT_MEMORY,
    LABEL_SNAPSHOT_OF,
    LABEL_SPEC,
    LABEL_TEMPLATE_DIGEST,
    LABEL_TENANT,
    RESERVED_LABEL_PREFIX,
    check_labels,
    check_request_id,
    check_restorable,
    check_workspace_id,
    checkpoint_key,
    container_spec,
    spec_from_json,
    spec_to_json,
)

__all__ = [
    "AGENT_CAPABILITIES",
    "AGENT_SOCKET_DIR",
    "AGENT_SOCKET_NAME",
    "CAPABILITIES",
    "FALLBACK_USER",
    "LABEL_AGENT",
    "LABEL_CREATE_REQUEST",
    "LABEL_RESTORED_FROM",
    "LABEL_SNAPSHOT",
    "LABEL_SNAPSHOT_CONTAINER",
    "LABEL_SNAPSHOT_MEMORY",
    "LABEL_SNAPSHOT_OF",
    "LABEL_SPEC",
    "LABEL_TEMPLATE_DIGEST",
    "LABEL_TENANT",
    "RESERVED_LABEL_PREFIX",
    "WorkspaceManager",
    "check_labels",
    "check_request_id",
    "check_restorable",
    "check_workspace_id",
    "checkpoint_key",
    "container_spec",
    "spec_from_json",
    "spec_to_json",
]
