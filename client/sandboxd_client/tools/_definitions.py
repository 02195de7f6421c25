"""The built-in tool definitions, their descriptions written to the rules below.

Descriptions are English, three lines -- What / When / Precondition -- each
60 to 200 characters. Command tools carry a required ``description`` argument,
listed first; every optional argument declares its default.
"""

from __future__ import annotations

from typing import Any

from ._types import ToolDefinitionConfig

__all__ = ["DEFAULT_TOOL_NAMES", "EXTRA_TOOL_NAMES", "builtin_definitions", "default_definitions"]

_CALL_DESCRIPTION = {
    "type": "string",
    "description": (
        "One short sentence, shown to the user while the call runs, saying what this call does "
        "(e.g. 'Run the unit tests'). Write it first."
    ),
}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def builtin_definitions() -> dict[str, ToolDefinitionConfig]:
    """Every built-in tool, by name (fresh copies: callers may change them)."""
    definitions = [
        ToolDefinitionConfig(
            name="exec_command",
            description=(
                "Run a shell command in the workspace with bash -lc and stream its stdout and stderr back.\n"
                "Use for builds, tests, git, search and installs; use read_file, edit_file or write_file for files.\n"
                "Long runs return a process_id after yield_time_ms; drive them with input_command."
            ),
            permission="rw",
            timeout_ms=120_000,
            parameters=_object(
                {
                    "description": _CALL_DESCRIPTION,
                    "cmd": {
                        "type": "string",
                        "description": "Shell command line, run as `bash -lc CMD` in the workspace. Example: 'pytest -q'.",
                    },
                    "workdir": {
                        "type": "string",
                        "description": "Working directory; relative paths are under the workspace root. Default: the root.",
                        "default": "",
                    },
                    "yield_time_ms": {
                        "type": "integer",
                        "minimum": 250,
                        "description": (
                            "Milliseconds to wait in the foreground before returning a process_id while the "
                            "command keeps running. At least 250, capped just below the tool timeout."
                        ),
                        "default": 60_000,
                    },
                },
                ["description", "cmd"],
            ),
        ),
        ToolDefinitionConfig(
            name="input_command",
            description=(
                "Drive a command started by exec_command: write to its stdin, send Ctrl-C, or poll its output.\n"
                "Use after exec_command returned a process_id; send chars '\\u0003' alone to interrupt it.\n"
                "Needs a process_id from exec_command; output since the previous call is returned."
            ),
            permission="rw",
            timeout_ms=130_000,
            parameters=_object(
                {
                    "description": _CALL_DESCRIPTION,
                    "process_id": {
                        "type": "string",
                        "description": "The process_id exec_command returned, e.g. 'p-1a2b3c4d5e6f'.",
                    },
                    "chars": {
                        "type": "string",
                        "description": (
                            "Text to write to stdin (include '\\n' to press Enter). Exactly '\\u0003' alone "
                            "sends Ctrl-C. Empty only polls for new output."
                        ),
                        "default": "",
                    },
                    "yield_time_ms": {
                        "type": ["integer", "null"],
                        "minimum": 250,
                        "description": "Milliseconds to wait for output. Default (null): 250 after writing, 5000 when polling.",
                        "default": None,
                    },
                },
                ["description", "process_id"],
            ),
        ),
        ToolDefinitionConfig(
            name="read_file",
            description=(
                "Read a text file from the workspace with line numbers (cat -n style), a page of lines at a time.\n"
                "Use before editing, and to inspect files; use exec_command (e.g. grep) to search many files.\n"
                "Binary files are refused; when lines remain, the result says which offset to read next."
            ),
            permission="r",
            timeout_ms=30_000,
            parameters=_object(
                {
                    "file_path": {
                        "type": "string",
                        "description": "Absolute path, or a path relative to the workspace root. Example: 'src/app.py'.",
                    },
                    "offset": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "First line to return, counting from 1. Use the offset a previous page named.",
                        "default": 1,
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "Most lines to return; lower it for large files you only skim.",
                        "default": 2000,
                    },
                },
                ["file_path"],
            ),
        ),
        ToolDefinitionConfig(
            name="edit_file",
            description=(
                "Replace an exact string in an existing file and show the unified diff of the change.\n"
                "Use for targeted edits of code or config; use write_file to create a file or rewrite it whole.\n"
                "old_string must match the file exactly, whitespace included, and occur once unless replace_all."
            ),
            permission="rw",
            timeout_ms=30_000,
            parameters=_object(
                {
                    "file_path": {
                        "type": "string",
                        "description": "Absolute path, or a path relative to the workspace root, of an existing file.",
                    },
                    "old_string": {
                        "type": "string",
                        "description": "Exact text to replace, with enough surrounding lines to be unique. Not empty.",
                    },
                    "new_string": {
                        "type": "string",
                        "description": "Replacement text; must differ from old_string. Keep the file's indentation.",
                    },
                    "replace_all": {
                        "type": "boolean",
                        "description": "Replace every occurrence instead of requiring exactly one (e.g. a rename).",
                        "default": False,
                    },
                },
                ["file_path", "old_string", "new_string"],
            ),
        ),
        ToolDefinitionConfig(
            name="write_file",
            description=(
                "Create a file, or overwrite one whole, with exactly the given content; parent folders are created.\n"
                "Use for new files and full rewrites; prefer edit_file for changing part of an existing file.\n"
                "Reports lines and bytes written and, for an overwrite, a diff or a +X/-Y summary."
            ),
            permission="rw",
            timeout_ms=30_000,
            parameters=_object(
                {
                    "file_path": {
                        "type": "string",
                        "description": "Absolute path, or a path relative to the workspace root. Example: 'notes/todo.md'.",
                    },
                    "content": {
                        "type": "string",
                        "description": "The complete new content of the file; an empty string makes an empty file.",
                    },
                },
                ["file_path", "content"],
            ),
        ),
        ToolDefinitionConfig(
            name="read_image",
            description=(
                "Read an image (png, jpeg, gif or webp, up to 5 MB) from the workspace or an http(s) URL.\n"
                "Use to look at screenshots, plots or diagrams; the image is attached to the result.\n"
                "URLs are fetched from inside the workspace, so they need the workspace's network on."
            ),
            permission="r",
            for_model="vision",
            timeout_ms=60_000,
            parameters=_object(
                {
                    "source": {
                        "type": "string",
                        "description": "A workspace path (e.g. 'out/plot.png') or an http(s) URL of the image.",
                    },
                },
                ["source"],
            ),
        ),
        ToolDefinitionConfig(
            name="describe_image",
            description=(
                "Have a vision model look at an image (png, jpeg, gif or webp, up to 5 MB) and answer about it.\n"
                "Use to understand screenshots, plots or diagrams when you cannot see images yourself.\n"
                "Takes a workspace path or an http(s) URL; URLs need the workspace's network on."
            ),
            permission="r",
            for_model="text-only",
            timeout_ms=90_000,
            parameters=_object(
                {
                    "source": {
                        "type": "string",
                        "description": "A workspace path (e.g. 'out/plot.png') or an http(s) URL of the image.",
                    },
                    "prompt": {
                        "type": "string",
                        "description": "The question to ask about the image. Example: 'What does the error dialog say?'",
                        "default": "Describe the image in detail.",
                    },
                },
                ["source"],
            ),
        ),
        ToolDefinitionConfig(
            name="kill_command",
            description=(
                "Stop a command started by exec_command, and everything it started: SIGTERM, then SIGKILL.\n"
                "Use when Ctrl-C through input_command did not stop it, or to clean up a background server.\n"
                "Needs the process_id exec_command returned; reports which signal ended the command."
            ),
            permission="rw",
            timeout_ms=30_000,
            parameters=_object(
                {
                    "description": _CALL_DESCRIPTION,
                    "process_id": {
                        "type": "string",
                        "description": "The process_id exec_command returned, e.g. 'p-1a2b3c4d5e6f'.",
                    },
                    "grace_ms": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "Milliseconds between SIGTERM and SIGKILL, for the command to clean up.",
                        "default": 2000,
                    },
                },
                ["description", "process_id"],
            ),
        ),
    ]
    return {definition.name: definition for definition in definitions}


DEFAULT_TOOL_NAMES = (
    "exec_command",
    "input_command",
    "read_file",
    "edit_file",
    "write_file",
    "read_image",
    "describe_image",
)
"""The default set (every standard tool sandboxd serves); subagent tools belong to the engine."""
EXTRA_TOOL_NAMES = ("kill_command",)
"""Built in, but only used when a configuration lists them."""


def default_definitions() -> list[ToolDefinitionConfig]:
    """The default tool list, in the order of ``DEFAULT_TOOL_NAMES``."""
    every = builtin_definitions()
    return [every[name] for name in DEFAULT_TOOL_NAMES]
