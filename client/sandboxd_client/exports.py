"""Tool schemas in the formats model APIs take: OpenAI function tools and Anthropic tools."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .tools._types import ToolDefinitionConfig

__all__ = ["to_anthropic", "to_openai"]


def _offered(definitions: Sequence[ToolDefinitionConfig]) -> list[ToolDefinitionConfig]:
    return [d for d in definitions if not d.user_only]


def to_openai(definitions: Sequence[ToolDefinitionConfig]) -> list[dict[str, Any]]:
    """``[{"type": "function", "function": {"name", "description", "parameters"}}]`` (Chat Completions)."""
    return [
        {
            "type": "function",
            "function": {"name": d.name, "description": d.description, "parameters": d.model_parameters()},
        }
        for d in _offered(definitions)
    ]


def to_anthropic(definitions: Sequence[ToolDefinitionConfig]) -> list[dict[str, Any]]:
    """``[{"name", "description", "input_schema"}]`` (Anthropic Messages API)."""
    return [
        {"name": d.name, "description": d.description, "input_schema": d.model_parameters()}
        for d in _offered(definitions)
    ]
