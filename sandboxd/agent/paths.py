"""Where the agent is inside every workspace: the link runs it, the build delivers it there.

Kept apart from both so that neither depends on the other for it: the protocol package
sits below the build module, which imports these from here.
"""

from __future__ import annotations

__all__ = ["AGENT_MOUNT", "AGENT_PATH"]

AGENT_MOUNT = "/.sandboxd"
"""Where every workspace sees the agent's volume (read-only)."""

AGENT_PATH = f"{AGENT_MOUNT}/sandboxd-agent"
"""The agent binary inside a workspace."""
