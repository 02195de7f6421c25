"""What a command runs with: its workspace's facts, and the start request made of them and the spec."""

from __future__ import annotations

import datetime
import posixpath
from collections.abc import Mapping
from typing import Any

from ..agent import AgentLink, StartRequest
from ..models import ExecSpec
from ..secrets import SecretStore
from ..tenancy import DEFAULT_TENANT

__all__ = ["EDITOR_ENV", "NON_INTERACTIVE_ENV", "TTY_ENV", "ExecContext", "start_request"]

NON_INTERACTIVE_ENV = {
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "NO_COLOR": "1",
    "LANG": "C.UTF-8",
    # Nothing can answer an editor: git commit, git merge and crontab -e must not wait for one.
    "GIT_EDITOR": "true",
    "EDITOR": "true",
    "VISUAL": "true",
    "GIT_MERGE_AUTOEDIT": "no",
}
"""Environment defaults for commands without a terminal; the caller's values win."""

EDITOR_ENV = frozenset({"GIT_EDITOR", "EDITOR", "VISUAL"})
"""Set together or not at all: a caller naming any of them has an editor that works without a
terminal, and git would prefer the default GIT_EDITOR over the caller's EDITOR."""

TTY_ENV = {"TERM": "xterm-256color", "LANG": "C.UTF-8"}


class ExecContext:
    """What a session needs to know about its workspace.

    Args:
        workspace_id: the workspace.
        user: user commands run as (``name``, ``uid`` or ``uid:gid``; the agent resolves it).
        working_dir: default working directory (relative workdirs resolve against it).
        memory_limit_bytes: the workspace's memory limit, reported with OOM kills.
        os: the container's OS (``linux`` or ``windows``), which decides how Ctrl-C is delivered.
        env: the workspace's environment, given to every command (never to sandboxd's own tools).
        tenant: the tenant owning the workspace; only its calls may see the workspace's processes.
        secrets: resolves ``secret:NAME`` env values and masks their values in output.
        container_id: the workspace's container; commands run in exactly it (empty: by name).
        link: the connection to the workspace's agent.
        capabilities: capabilities the workspace added back (commands keep exactly these).
        root_capabilities: what a command run as uid 0 keeps on top (the agent knows the uid).
    """

    def __init__(
        self,
        *,
        workspace_id: str,
        user: str,
        working_dir: str,
        memory_limit_bytes: int,
        link: AgentLink,
        os: str = "linux",
        env: Mapping[str, str] | None = None,
        tenant: str = DEFAULT_TENANT,
        secrets: SecretStore | None = None,
        container_id: str = "",
        capabilities: tuple[str, ...] = (),
        root_capabilities: tuple[str, ...] = (),
    ) -> None:
        """Bundle the workspace facts."""
        self.workspace_id = workspace_id
        self.user = user
        self.working_dir = working_dir
        self.memory_limit_bytes = memory_limit_bytes
        self.link = link
        self.os = os
        self.env = dict(env or {})
        self.tenant = tenant
        self.secrets = secrets or SecretStore("", {})
        self.container_id = container_id
        self.capabilities = capabilities
        self.root_capabilities = root_capabilities


def _workdir(context: ExecContext, spec: ExecSpec) -> str:
    workdir = spec.workdir or context.working_dir
    return posixpath.normpath(posixpath.join(context.working_dir, workdir))


def _env(context: ExecContext, spec: ExecSpec) -> dict[str, str]:
    """The command's environment over the image's: defaults, workspace env, exec env (the agent adds the marker)."""
    defaults = TTY_ENV if spec.tty else NON_INTERACTIVE_ENV
    env = context.secrets.resolve({**context.env, **spec.env}, context.tenant)
    if EDITOR_ENV & env.keys():
        defaults = {key: value for key, value in defaults.items() if key not in EDITOR_ENV}
    return {**defaults, **env}


def _daemon_state(
    context: ExecContext, spec: ExecSpec, timeout_s: float, start_time: datetime.datetime
) -> dict[str, Any]:
    """What a restarted daemon needs to take the session over; kept by the agent (no secrets)."""
    return {
        "workspace_id": context.workspace_id,
        "container_id": context.container_id,
        "tenant": context.tenant,
        "command": spec.command,
        "tty": spec.tty,
        "columns": spec.columns,
        "rows": spec.rows,
        "timeout_s": timeout_s,
        "max_output_bytes": spec.max_output_bytes,
        "spill_after_bytes": spec.spill_after_bytes,
        "merge_stderr": spec.merge_stderr,
        "start_time": start_time.isoformat(),
    }


def start_request(
    context: ExecContext,
    spec: ExecSpec,
    *,
    process_id: str,
    timeout_s: float,
    grace_s: float,
    buffer_bytes: int,
    spill_path: str,
    start_time: datetime.datetime,
) -> StartRequest:
    """The agent's start request for ``spec`` in ``context``.

    Args:
        context: the workspace's facts.
        spec: the command as the caller asked for it.
        process_id: the session's id (the agent keeps it, and marks the command's processes).
        timeout_s: the command's timeout, in seconds.
        grace_s: seconds between SIGTERM and SIGKILL when the command is ended.
        buffer_bytes: output the agent keeps for callers, in bytes.
        spill_path: where the whole output goes past ``spec.spill_after_bytes``.
        start_time: when the session began (kept for a restarted daemon).

    Returns:
        The request, with the environment resolved (secrets included: it goes to the agent
        only) and the working directory made absolute.
    """
    return StartRequest(
        process_id=process_id,
        command=spec.command,
        cwd=_workdir(context, spec),
        env=_env(context, spec),
        user=spec.user or context.user,
        tty=spec.tty,
        columns=spec.columns,
        rows=spec.rows,
        timeout_s=timeout_s,
        grace_s=grace_s,
        buffer_bytes=buffer_bytes,
        spill_path=spill_path if spec.spill_after_bytes > 0 else "",
        spill_after_bytes=spec.spill_after_bytes,
        merge_stderr=spec.merge_stderr,
        capabilities=context.capabilities,
        root_capabilities=context.root_capabilities,
        daemon_state=_daemon_state(context, spec, timeout_s, start_time),
    )
