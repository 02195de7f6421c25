"""The agent tool interface over sandboxd: definitions, built-in tools, and their assembly.

``default_tools(model="vision")`` gives the tools an engine offers a vision
model (``read_image``); ``model="text-only"`` swaps in ``describe_image``.
``assemble`` applies the same filtering to any list of definitions (from
``system_config.yaml`` via :func:`sandboxd_client.config.load_tools`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ._builtin import IMPLEMENTATIONS, make_tool
from ._definitions import DEFAULT_TOOL_NAMES, EXTRA_TOOL_NAMES, builtin_definitions, default_definitions
from ._types import (
    Actor,
    ApproveFn,
    BuiltinTool,
    ForModel,
    Permission,
    StopReason,
    ToolCall,
    ToolDefinitionConfig,
    ToolExecutionContext,
    ToolResult,
    VisionFn,
)

__all__ = [
    "DEFAULT_TOOL_NAMES",
    "EXTRA_TOOL_NAMES",
    "IMPLEMENTATIONS",
    "Actor",
    "ApproveFn",
    "BuiltinTool",
    "ForModel",
    "Permission",
    "StopReason",
    "ToolCall",
    "ToolDefinitionConfig",
    "ToolExecutionContext",
    "ToolResult",
    "VisionFn",
    "assemble",
    "builtin_definitions",
    "default_definitions",
    "default_tools",
    "make_tool",
]


def assemble(
    definitions: Sequence[ToolDefinitionConfig], *, model: Literal["vision", "text-only"] = "vision"
) -> list[BuiltinTool]:
    """The tools for a session's model: those meant for its kind (or for every kind), built."""
    return [make_tool(d) for d in definitions if d.for_model in (None, model)]


def default_tools(*, model: Literal["vision", "text-only"] = "vision") -> list[BuiltinTool]:
    """The default tool set for a vision or a text-only model."""
    return assemble(default_definitions(), model=model)
