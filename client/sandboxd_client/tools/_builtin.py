"""The built-in tools: thin adapters from the tools' arguments to sandboxd calls.

Each ``execute`` yields partial output (``str``) and ends with one
:class:`ToolResult`. Errors are raised; the Environment turns them into output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from .._exec import Dropped, ExecHandle, Exited, Output, Yielded
from ._types import StopReason, ToolDefinitionConfig, ToolExecutionContext, ToolResult

__all__ = ["IMPLEMENTATIONS", "ToolArgumentError", "ToolError", "make_tool"]

MIN_YIELD_MS = 250
"""yield_time_ms is at least 250."""
DEFAULT_EXEC_YIELD_MS = 60_000
INPUT_WRITE_YIELD_MS = 250
INPUT_POLL_YIELD_MS = 5_000
_OWN_STOP: dict[str, StopReason] = {"timeout": "timeout", "interrupted": "interrupted", "failed": "failed"}


class ToolError(Exception):
    """A failure the model should read as it is (the Environment shows the message, no type name)."""


class ToolArgumentError(ToolError):
    """An argument has the wrong type or value."""


def _text(args: Mapping[str, Any], name: str, *, default: str | None = None) -> str:
    value = args.get(name, default)
    if not isinstance(value, str):
        msg = f"argument {name!r} must be a string"
        raise ToolArgumentError(msg)
    return value


def _whole(value: object) -> int | None:
    """``value`` as an int when it is a whole number (``250.0`` is, as JSON Schema says); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) else None


def _integer(args: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = args.get(name, default)
    if value is None:
        return None
    if (whole := _whole(value)) is None:
        msg = f"argument {name!r} must be a whole number"
        raise ToolArgumentError(msg)
    return whole


def yield_window(args: Mapping[str, Any], default_ms: int, definition: ToolDefinitionConfig) -> tuple[float, str]:
    """The ``yield_time_ms`` argument as a window in seconds, clamped, and a note when it was.

    At least 250 ms, and under the tool's timeout by a second. Models
    often send short yields (a quick look): a value outside the range is clamped, not
    refused, and the note (``[yield_time_ms 100 raised to 250]``) tells the model so.

    Args:
        args: the call's arguments; a missing or null ``yield_time_ms`` means ``default_ms``.
        default_ms: the window when none is given, in milliseconds.
        definition: the tool's definition, whose ``timeout_ms`` caps the window.

    Returns:
        ``(window in seconds, note)``; the note is empty when nothing was clamped.

    Raises:
        ToolArgumentError: a value that is not a whole number of milliseconds, or is negative.
    """
    given = args.get("yield_time_ms")
    requested = default_ms if given is None else _whole(given)
    if requested is None or requested < 0:
        msg = (
            f"argument 'yield_time_ms' of {definition.name} must be a whole number of milliseconds, not negative "
            f"(waits under {MIN_YIELD_MS} are raised to {MIN_YIELD_MS})"
        )
        raise ToolArgumentError(msg)
    window = max(requested, MIN_YIELD_MS)
    cap_ms = max(definition.timeout_ms - 1000, MIN_YIELD_MS) if definition.timeout_ms > 0 else None
    if cap_ms is not None and window > cap_ms:
        window = cap_ms
    note = ""
    if window > requested:
        note = f"[yield_time_ms {requested} raised to {window}, the shortest wait]"
    elif window < requested:
        note = (
            f"[yield_time_ms {requested} lowered to {window}, just under the tool's {definition.timeout_ms} ms timeout]"
        )
    return window / 1000, note


def exit_note(event: Exited) -> str:
    """``[exit code 7]``, with the signal and why it stopped when that says more."""
    parts = [f"exit code {event.exit_code}"]
    if event.signal:
        parts.append(event.signal)
    if event.oom_killed:
        parts.append(f"killed for using more than its {event.memory_limit_bytes} bytes of memory")
    elif event.stop_reason == "timeout":
        parts.append("stopped at its timeout")
    elif event.stop_reason == "failed" and event.message:
        parts.append(event.message)
    return "[" + ", ".join(parts) + "]"


def _notes(*notes: str) -> str:
    return "\n".join(note for note in notes if note)


async def _drive(handle: ExecHandle, clamped: str = "") -> AsyncIterator[str | ToolResult]:
    """Turn an exec or input stream into partial text and a final result (``clamped``: the yield's note)."""
    async for event in handle:
        match event:
            case Output() if event.text:
                yield event.text
            case Dropped():
                yield f"\n[… {event.dropped_bytes} bytes of output were dropped while nobody was reading …]\n"
            case Exited():
                yield ToolResult(
                    stop_reason=_OWN_STOP.get(event.stop_reason, "completed"),
                    note=_notes(exit_note(event), clamped),
                    metadata={
                        "exit_code": event.exit_code,
                        "signal": event.signal,
                        # A process_id only while the command runs on; a finished one has none.
                        "process_id": None,
                        "spill_path": event.spill_path,
                    },
                )
            case Yielded():
                yield ToolResult(
                    stop_reason="completed",
                    note=_notes(
                        f"[still running as process_id={event.process_id}; use input_command to send input, "
                        "poll for output or send Ctrl-C]",
                        clamped,
                    ),
                    metadata={
                        "exit_code": None,
                        "process_id": event.process_id,
                        "spill_path": f"/workspace/.sandboxd/spill/{event.process_id}.out",
                    },
                )


@dataclasses.dataclass
class _Tool:
    definition: ToolDefinitionConfig

    @property
    def name(self) -> str:
        return self.definition.name


class ExecCommand(_Tool):
    """exec_command: ``bash -lc CMD``, stdout and stderr merged in order, yield to a process_id."""

    clamped_arguments = frozenset({"yield_time_ms"})
    """Arguments whose schema bounds this tool clamps to (with a note) instead of refusing."""

    async def execute(self, args: Mapping[str, Any], ctx: ToolExecutionContext) -> AsyncIterator[str | ToolResult]:
        """Run the command; see the tool's description."""
        workspace = ctx.workspace
        window_s, clamped = yield_window(args, DEFAULT_EXEC_YIELD_MS, ctx.definition)
        handle = workspace.client.exec(
            workspace.workspace_id,
            _text(args, "cmd"),
            workdir=_text(args, "workdir", default=""),
            yield_after_s=window_s,
            merge_stderr=True,
            spill_after_bytes=max(ctx.definition.max_output_length, 0),
        )
        async for item in _drive(handle, clamped):
            yield item


class InputCommand(_Tool):
    """input_command: write, Ctrl-C or poll, then the output since the previous call."""

    clamped_arguments = frozenset({"yield_time_ms"})
    """Arguments whose schema bounds this tool clamps to (with a note) instead of refusing."""

    async def execute(self, args: Mapping[str, Any], ctx: ToolExecutionContext) -> AsyncIterator[str | ToolResult]:
        """Drive the process; see the tool's description."""
        chars = _text(args, "chars", default="")
        window_s, clamped = yield_window(args, INPUT_WRITE_YIELD_MS if chars else INPUT_POLL_YIELD_MS, ctx.definition)
        handle = ctx.workspace.client.input(_text(args, "process_id"), chars, yield_after_s=window_s)
        async for item in _drive(handle, clamped):
            yield item


class KillCommand(_Tool):
    """kill_command: SIGTERM, grace, SIGKILL over the whole tree."""

    async def execute(self, args: Mapping[str, Any], ctx: ToolExecutionContext) -> AsyncIterator[str | ToolResult]:
        """Stop the process; see the tool's description."""
        process_id = _text(args, "process_id")
        grace_ms = _integer(args, "grace_ms", 2000)
        exited = await ctx.workspace.client.kill(process_id, grace_s=(grace_ms or 0) / 1000)
        yield f"Stopped {process_id}."
        yield ToolResult(note=exit_note(exited), metadata={"exit_code": exited.exit_code, "process_id": None})


class ReadFile(_Tool):
    """read_file: a page of ``cat -n`` text."""

    async def execute(self, args: Mapping[str, Any], ctx: ToolExecutionContext) -> AsyncIterator[str | ToolResult]:
        """Read the page; see the tool's description."""
        page = await ctx.workspace.read_file(
            _text(args, "file_path"), offset=_integer(args, "offset", 1) or 1, limit=_integer(args, "limit", 2000) or 0
        )
        yield page.content
        yield ToolResult(stop_reason="completed", metadata={"next_offset": page.next_offset})


class EditFile(_Tool):
    """edit_file: exact replacement with a unified diff."""

    async def execute(self, args: Mapping[str, Any], ctx: ToolExecutionContext) -> AsyncIterator[str | ToolResult]:
        """Apply the edit; see the tool's description."""
        replace_all = args.get("replace_all", False)
        if not isinstance(replace_all, bool):
            msg = "argument 'replace_all' must be true or false"
            raise ToolArgumentError(msg)
        result = await ctx.workspace.edit_file(
            _text(args, "file_path"), _text(args, "old_string"), _text(args, "new_string"), replace_all=replace_all
        )
        yield result.message
        yield ToolResult(stop_reason="completed", metadata={"replacements": result.replacements})


class WriteFile(_Tool):
    """write_file: create or overwrite atomically."""

    async def execute(self, args: Mapping[str, Any], ctx: ToolExecutionContext) -> AsyncIterator[str | ToolResult]:
        """Write the file; see the tool's description."""
        result = await ctx.workspace.write_file(_text(args, "file_path"), _text(args, "content"))
        yield result.message
        yield ToolResult(stop_reason="completed", metadata={"created": result.created})


class ReadImage(_Tool):
    """read_image: the image itself, attached as a data URL (vision models)."""

    async def execute(self, args: Mapping[str, Any], ctx: ToolExecutionContext) -> AsyncIterator[str | ToolResult]:
        """Read the image; see the tool's description."""
        source = _text(args, "source")
        image = await ctx.workspace.read_image(source)
        yield f"{source}: {image.mime_type}, {image.width}x{image.height} pixels, {len(image.data)} bytes"
        yield ToolResult(stop_reason="completed", images=(image.data_url(),))


class DescribeImage(_Tool):
    """describe_image: an engine-supplied vision model answers about the image (text-only models)."""

    async def execute(self, args: Mapping[str, Any], ctx: ToolExecutionContext) -> AsyncIterator[str | ToolResult]:
        """Ask about the image; see the tool's description."""
        if ctx.vision is None:
            msg = "describe_image needs a vision model, and the engine configured none"
            raise ToolError(msg)
        image = await ctx.workspace.read_image(_text(args, "source"))
        yield await ctx.vision(image, _text(args, "prompt", default="Describe the image in detail."))
        yield ToolResult(stop_reason="completed")


IMPLEMENTATIONS: dict[str, Callable[[ToolDefinitionConfig], Any]] = {
    "exec_command": ExecCommand,
    "input_command": InputCommand,
    "kill_command": KillCommand,
    "read_file": ReadFile,
    "edit_file": EditFile,
    "write_file": WriteFile,
    "read_image": ReadImage,
    "describe_image": DescribeImage,
}
"""Tool name -> implementation; a configured tool must name one of these."""


def make_tool(definition: ToolDefinitionConfig) -> Any:
    """The built-in tool for ``definition`` (its name picks the implementation).

    Raises:
        KeyError: no built-in tool has that name.
    """
    return IMPLEMENTATIONS[definition.name](definition)
