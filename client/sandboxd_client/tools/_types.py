"""The tool contract: definitions, calls, contexts and results."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from .._client import ImageResult, Workspace

__all__ = [
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
]

StopReason = Literal["completed", "failed", "timeout", "interrupted", "aborted"]
"""How a call ended. Merged by priority: interrupted > timeout > failed > the tool's own."""
Permission = Literal["r", "rw"]
ForModel = Literal["vision", "text-only"]
Actor = Literal["user", "agent", "scheduler"]
"""Who makes a call: a user's click, the model, or a scheduled job."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One complete tool call from the model (or a user, or a scheduler)."""

    tool_call_id: str
    name: str
    arguments: Mapping[str, Any]


ApproveFn = Callable[[ToolCall], Awaitable[Literal["allow", "deny"]]]
"""The approval callback: exactly one decision per complete tool call."""

VisionFn = Callable[["ImageResult", str], Awaitable[str]]
"""An engine-supplied vision model for describe_image: (image, question) -> answer."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolDefinitionConfig:
    """One tool as configured (YAML keys in camelCase).

    ``effect`` defaults from ``permission``: ``r`` is ``read`` and
    ``rw`` is ``write``; deployments may name stronger effects (``money``,
    ``public``) for their own tools.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    """JSON Schema of the arguments (an ``object`` schema)."""
    permission: Permission = "rw"
    for_model: ForModel | None = None
    """Offered only to vision or only to text-only models; None means all."""
    timeout_ms: int = 120_000
    """Per-call timeout in milliseconds; ``<= 0`` disables it."""
    max_output_length: int = 16_000
    """Characters of output the model sees; ``<= 0`` disables the cap."""
    call_description: bool = True
    """Keep the ``description`` argument; False drops it and its ``required`` entry from the schema."""
    effect: str = ""
    user_only: bool = False
    """Hidden from the model; agent and scheduler calls are refused."""
    untrusted: bool = True
    """Results carry third-party text (workspace content), so mark them untrusted."""

    @property
    def resolved_effect(self) -> str:
        """``effect``, or ``read``/``write`` from ``permission`` when unset."""
        return self.effect or ("read" if self.permission == "r" else "write")

    def model_parameters(self) -> dict[str, Any]:
        """The JSON Schema the model sees, with ``description`` removed when ``call_description`` is off."""
        schema: dict[str, Any] = copy.deepcopy(dict(self.parameters))
        if not self.call_description:
            schema.get("properties", {}).pop("description", None)
            if "required" in schema:
                schema["required"] = [name for name in schema["required"] if name != "description"]
        return schema

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ToolDefinitionConfig:
        """Build from a ``tools.builtin`` entry (its camelCase keys)."""
        return cls(
            name=data["name"],
            description=data["description"],
            parameters=data["parameters"],
            permission=data.get("permission", "rw"),
            for_model=data.get("forModel"),
            timeout_ms=int(data.get("timeoutMs", 120_000)),
            max_output_length=int(data.get("maxOutputLength", 16_000)),
            call_description=bool(data.get("call_description", True)),
            effect=data.get("effect", ""),
            user_only=bool(data.get("userOnly", False)),
            untrusted=bool(data.get("untrusted", True)),
        )

    def to_mapping(self) -> dict[str, Any]:
        """The ``tools.builtin`` entry for this definition."""
        data: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "permission": self.permission,
            "timeoutMs": self.timeout_ms,
            "maxOutputLength": self.max_output_length,
            "call_description": self.call_description,
            "parameters": copy.deepcopy(dict(self.parameters)),
        }
        if self.for_model:
            data["forModel"] = self.for_model
        if self.effect:
            data["effect"] = self.effect
        if self.user_only:
            data["userOnly"] = True
        return data


@dataclasses.dataclass(kw_only=True)
class ToolExecutionContext:
    """What a tool gets besides its arguments.

    ``workspace`` takes the place of a working directory (``workspaceDir``): the tool acts in that
    sandboxd workspace. ``signal`` is set when the engine aborts the call.
    """

    workspace: Workspace
    tool_call_id: str
    definition: ToolDefinitionConfig
    signal: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    approve: ApproveFn | None = None
    actor: Actor = "agent"
    vision: VisionFn | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolResult:
    """A tool's own account of how it ended."""

    stop_reason: StopReason | None = None
    """The tool's own stop reason; lowest priority when merged."""
    note: str = ""
    """Appended after the output cap, so it is never cut (e.g. the exit code)."""
    images: tuple[str, ...] = ()
    """Images as data URLs, appended after the text."""
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Machine-readable facts (``exit_code``, ``process_id``, ``spill_path``)."""


class BuiltinTool(Protocol):
    """A built-in tool, as the Environment runs it.

    ``execute`` is an async generator: it yields partial output as ``str`` and
    finally (at most once, last) a :class:`ToolResult`. It may raise; the
    Environment turns every error into output the model can read.
    """

    name: str
    definition: ToolDefinitionConfig

    def execute(self, args: Mapping[str, Any], ctx: ToolExecutionContext) -> AsyncIterator[str | ToolResult]:
        """Run one call."""
        ...
