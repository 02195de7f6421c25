r"""The Environment: every tool call finishes the same way.

For each complete call, in order: framing ``start`` (with the tool_call_id);
exactly one approval decision (a denial is an ``aborted`` output of exactly
``Tool call denied by user.``); the tool runs under its timeout and the
engine's abort signal, its partial output streamed as it comes; then the final
output is built:

1. model-facing text: ANSI sequences stripped, ``\r`` redraws collapsed;
2. known secret values masked;
3. cut to ``max_output_length`` characters keeping the head, with a marker
   counting what was left out (and naming the spill file with the whole output);
4. never empty: ``[no output]``;
5. the note (exit code, ...) and any error appended after the cut, images last;
6. ``stop_reason`` merged: user interrupt > timeout > tool error > the tool's own.

Then framing ``stop``. Nothing is ever raised into the engine: every failure
becomes output the model can read. Every event goes to the trace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets as _secrets
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from typing import Any, Literal

from ._client import Workspace
from .approval import Approval
from .errors import SandboxError
from .text import CleanStream, Redactor, cap
from .tools import assemble
from .tools._builtin import ToolError
from .tools._definitions import default_definitions
from .tools._types import (
    Actor,
    BuiltinTool,
    StopReason,
    ToolCall,
    ToolDefinitionConfig,
    ToolExecutionContext,
    ToolResult,
    VisionFn,
)
from .trace import Trace

__all__ = [
    "DENIED_OUTPUT",
    "NO_OUTPUT",
    "Environment",
    "ToolCallOutput",
    "ToolCallPartial",
    "ToolCallStart",
    "ToolCallStop",
    "ToolEvent",
    "check_arguments",
    "merge_stop_reasons",
]

DENIED_OUTPUT = "Tool call denied by user."
NO_OUTPUT = "[no output]"
_PRIORITY: tuple[StopReason, ...] = ("interrupted", "timeout", "failed")
_CANCEL_WAIT_S = 5.0
"""How long a cancelled tool may take to stop before the Environment stops waiting for it."""


def merge_stop_reasons(*reasons: StopReason | None) -> StopReason:
    """The priority: interrupted > timeout > failed > the tool's own (default completed)."""
    present = [r for r in reasons if r]
    for reason in _PRIORITY:
        if reason in present:
            return reason
    return present[-1] if present else "completed"


@dataclasses.dataclass(frozen=True)
class ToolCallStart:
    """Framing: the call begins."""

    tool_call_id: str
    name: str
    description: str
    """The call's own one-sentence ``description`` argument, for display; may be empty."""


@dataclasses.dataclass(frozen=True)
class ToolCallPartial:
    """Output as the tool produces it (raw text, not yet cleaned or cut)."""

    tool_call_id: str
    text: str


@dataclasses.dataclass(frozen=True)
class ToolCallOutput:
    """The final tool_call_output the model sees."""

    tool_call_id: str
    name: str
    output: str
    stop_reason: StopReason | str
    note: str
    images: tuple[str, ...]
    untrusted: bool
    """The text comes from the workspace: third-party content, not instructions."""
    metadata: Mapping[str, Any]
    omitted_chars: int


@dataclasses.dataclass(frozen=True)
class ToolCallStop:
    """Framing: the call is over."""

    tool_call_id: str
    stop_reason: StopReason | str


ToolEvent = ToolCallStart | ToolCallPartial | ToolCallOutput | ToolCallStop


_TYPE_WORDS = {
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "object": "an object",
    "array": "an array",
    "null": "null",
}


def _is_of(value: object, kind: str) -> bool:
    """JSON Schema's types: a bool is no number, and 250.0 is an integer (it is one mathematically)."""
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return isinstance(value, _JSON_TYPES.get(kind, (object,)))


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (Mapping,),
    "array": (list, tuple),
    "null": (type(None),),
}


def _range_words(low: float | None, high: float | None) -> str:
    """A numeric range as people say it: ``at least 1``, ``at most 10``, ``between 1 and 10``."""
    if low is not None and high is not None:
        return f"between {low:g} and {high:g}"
    return f"at least {low:g}" if low is not None else f"at most {high:g}"


def check_arguments(
    definition: ToolDefinitionConfig, arguments: object, *, clamped: Collection[str] = ()
) -> str | None:
    """A first check of a call's arguments against its schema: required, unknown, basic types, ranges.

    Args:
        definition: the tool's definition, whose model-facing schema is checked.
        arguments: the call's arguments.
        clamped: arguments whose ``minimum``/``maximum`` the tool clamps to instead of refusing
            (the tool then checks them itself; see ``yield_time_ms``).

    Returns:
        What is wrong, for the model to read; None when nothing is.
    """
    if not isinstance(arguments, Mapping):
        return "the arguments must be a JSON object"
    schema = definition.model_parameters()
    properties = schema.get("properties", {})
    missing = [name for name in schema.get("required", []) if name not in arguments]
    if missing:
        return f"missing required argument(s) for {definition.name}: {', '.join(missing)}"
    if schema.get("additionalProperties") is False:
        # A model may still send the call description after it was configured away.
        unknown = sorted(set(arguments) - set(properties) - {"description"})
        if unknown:
            return f"unknown argument(s) for {definition.name}: {', '.join(unknown)}"
    for name, value in arguments.items():
        expected = properties.get(name, {}).get("type")
        if expected is None:
            continue
        kinds = [expected] if isinstance(expected, str) else list(expected)
        if not any(_is_of(value, kind) for kind in kinds):
            words = " or ".join(_TYPE_WORDS.get(kind, kind) for kind in kinds)
            return f"argument {name!r} of {definition.name} must be {words}"
        if isinstance(value, int | float) and not isinstance(value, bool) and name not in clamped:
            low, high = properties[name].get("minimum"), properties[name].get("maximum")
            if (low is not None and value < low) or (high is not None and value > high):
                return f"argument {name!r} of {definition.name} must be {_range_words(low, high)}"
            if not -(2**63) <= value < 2**63:  # what travels as int64
                return f"argument {name!r} of {definition.name} is too large (it must fit in 64 bits)"
    return None


@dataclasses.dataclass
class _Error:
    message: str


_END = object()


class Environment:
    """Runs tool calls for one agent session on one workspace.

    Args:
        workspace: where the tools act.
        tools: the tools on offer; None means the default tools.
        approval: the approval rules; None means mode ``always-ask`` with no
            callback, i.e. every call that needs asking is denied.
        trace: where events go; None keeps them in memory (``trace.events``).
        vision: the engine's vision model, for describe_image.
        secrets: values that must never appear in results (masked as ``[REDACTED]``).
        model: the session model's kind, which picks read_image or describe_image
            when ``tools`` is None.
    """

    def __init__(
        self,
        workspace: Workspace,
        *,
        tools: Sequence[BuiltinTool] | None = None,
        approval: Approval | None = None,
        trace: Trace | None = None,
        vision: VisionFn | None = None,
        secrets: Iterable[str] = (),
        model: Literal["vision", "text-only"] = "vision",
    ) -> None:
        """Set up the environment."""
        self.workspace = workspace
        chosen = list(tools) if tools is not None else assemble(default_definitions(), model=model)
        self.tools: dict[str, BuiltinTool] = {tool.name: tool for tool in chosen}
        self.approval = approval or Approval()
        self.trace = trace or Trace()
        self.vision = vision
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._redactor = Redactor(self.secrets)

    def definitions(self) -> list[ToolDefinitionConfig]:
        """What the model is offered: every tool but the user-only ones."""
        return [tool.definition for tool in self.tools.values() if not tool.definition.user_only]

    async def call(
        self, call: ToolCall, *, actor: Actor = "agent", abort: asyncio.Event | None = None
    ) -> ToolCallOutput:
        """Run one call to the end and return its final output."""
        final: ToolCallOutput | None = None
        async for event in self.run(call, actor=actor, abort=abort):
            if isinstance(event, ToolCallOutput):
                final = event
        assert final is not None
        return final

    async def run(
        self, call: ToolCall, *, actor: Actor = "agent", abort: asyncio.Event | None = None
    ) -> AsyncIterator[ToolEvent]:
        """Run one call: start, partial outputs, the final output, stop. Never raises.

        Args:
            call: the complete tool call.
            actor: who makes it (``user``, ``agent`` or ``scheduler``).
            abort: set by the engine to interrupt the call (a user interrupt).
        """
        call_id = call.tool_call_id or f"call-{_secrets.token_hex(6)}"
        description = call.arguments.get("description", "") if isinstance(call.arguments, Mapping) else ""
        arguments = self._redact_value(dict(call.arguments)) if isinstance(call.arguments, Mapping) else {}
        self.trace.record("tool_call.start", call_id, name=call.name, arguments=arguments, actor=actor)
        yield ToolCallStart(tool_call_id=call_id, name=call.name, description=str(description or ""))

        tool = self.tools.get(call.name)
        problem = (
            None
            if tool is None
            else check_arguments(tool.definition, call.arguments, clamped=getattr(tool, "clamped_arguments", ()))
        )
        if tool is None:
            final = self._finish(
                call_id, call.name, None, None, f"Error: there is no tool named {call.name!r}.", "failed"
            )
        elif problem is not None:
            final = self._finish(call_id, call.name, None, None, f"Error: {problem}.", "failed")
        else:
            decision = await self.approval.decide(call, tool.definition, actor)
            self.trace.record(
                "approval_decision",
                call_id,
                name=call.name,
                decision=decision.decision,
                asked=decision.asked,
                reason=decision.reason,
                actor=decision.actor,
                mode=decision.mode,
                effect=decision.effect,
            )
            if decision.decision == "deny":
                final = ToolCallOutput(
                    tool_call_id=call_id,
                    name=call.name,
                    output=DENIED_OUTPUT,
                    stop_reason="aborted",
                    note="",
                    images=(),
                    untrusted=False,
                    metadata={},
                    omitted_chars=0,
                )
            else:
                limit = tool.definition.max_output_length
                text = CleanStream(limit + self._redactor.holdback if limit > 0 else 0)
                outcome: dict[str, Any] = {}
                async for partial in self._execute(tool, call, call_id, actor, abort, text, outcome):
                    yield partial
                final = self._finish(
                    call_id,
                    call.name,
                    text,
                    outcome.get("result"),
                    outcome.get("error", ""),
                    outcome.get("stop"),
                    definition=tool.definition,
                )
        self.trace.record(
            "tool_call.output",
            call_id,
            name=final.name,
            output=final.output,
            stop_reason=final.stop_reason,
            images=len(final.images),
            metadata=dict(final.metadata),
        )
        yield final
        self.trace.record("tool_call.stop", call_id, stop_reason=final.stop_reason)
        yield ToolCallStop(tool_call_id=call_id, stop_reason=final.stop_reason)

    async def _execute(
        self,
        tool: BuiltinTool,
        call: ToolCall,
        call_id: str,
        actor: Actor,
        abort: asyncio.Event | None,
        text: CleanStream,
        outcome: dict[str, Any],
    ) -> AsyncIterator[ToolCallPartial]:
        """Run the tool under its timeout and the abort signal, streaming its partial output."""
        definition = tool.definition
        signal = abort or asyncio.Event()
        ctx = ToolExecutionContext(
            workspace=self.workspace,
            tool_call_id=call_id,
            definition=definition,
            signal=signal,
            approve=self.approval.approve,
            actor=actor,
            vision=self.vision,
        )
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def produce() -> None:
            try:
                async for item in tool.execute(call.arguments, ctx):
                    await queue.put(item)
            except asyncio.CancelledError:
                raise
            except SandboxError as exc:
                await queue.put(_Error(f"Error: {exc.message}"))
            except ToolError as exc:
                await queue.put(_Error(f"Error: {exc}"))
            except Exception as exc:  # a tool must never raise into the engine
                await queue.put(_Error(f"Error: {type(exc).__name__}: {exc}"))
            finally:
                queue.put_nowait(_END)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + definition.timeout_ms / 1000 if definition.timeout_ms > 0 else None
        producer = asyncio.create_task(produce())
        aborted = asyncio.create_task(signal.wait())
        live = Redactor(self.secrets)  # partial output may split a secret across chunks
        try:
            while True:
                getter = asyncio.create_task(queue.get())
                timeout = None if deadline is None else max(0.0, deadline - loop.time())
                done, _ = await asyncio.wait({getter, aborted}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    outcome["stop"] = "interrupted" if aborted in done or signal.is_set() else "timeout"
                    break
                item = getter.result()
                if item is _END:
                    break
                if isinstance(item, ToolResult):
                    outcome["result"] = item
                elif isinstance(item, _Error):
                    outcome["error"] = item.message
                    outcome["stop"] = "failed"
                elif isinstance(item, str) and item:
                    text.feed(item)
                    shown = live.feed(item)
                    if shown:
                        self.trace.record("tool_call.partial_output", call_id, text=shown)
                        yield ToolCallPartial(tool_call_id=call_id, text=shown)
        finally:
            aborted.cancel()
            if not producer.done():
                # Cancelling the tool cancels its sandboxd call, which the daemon delivers as Ctrl-C.
                producer.cancel()
                # A tool slow to stop gets a few seconds; the engine is never held hostage by it.
                await asyncio.wait({producer}, timeout=_CANCEL_WAIT_S)
        rest = live.flush()
        if rest:
            self.trace.record("tool_call.partial_output", call_id, text=rest)
            yield ToolCallPartial(tool_call_id=call_id, text=rest)
        # Whatever else happened while the call wound down counts too; the merge picks the strongest.
        stops = {outcome["stop"]} if outcome.get("stop") else set()
        if signal.is_set():
            stops.add("interrupted")
        if deadline is not None and loop.time() >= deadline:
            stops.add("timeout")
        if stops:
            outcome["stop"] = merge_stop_reasons(*stops)
        if outcome.get("stop") == "timeout":
            outcome["error"] = f"[timed out after {definition.timeout_ms / 1000:g} s]"
        elif outcome.get("stop") == "interrupted":
            outcome["error"] = "[interrupted by the user]"

    def _redact_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._redact(value)
        if isinstance(value, Mapping):
            return {key: self._redact_value(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self._redact_value(item) for item in value]
        return value

    def _redact(self, text: str) -> str:
        return self._redactor.redact(text)

    def _finish(
        self,
        call_id: str,
        name: str,
        text: CleanStream | None,
        result: ToolResult | None,
        error: str,
        stop: StopReason | None,
        *,
        definition: ToolDefinitionConfig | None = None,
    ) -> ToolCallOutput:
        limit = definition.max_output_length if definition is not None else 0
        cleaned = text.finish() if text is not None else ""
        omitted_before = text.omitted if text is not None else 0
        # Secrets are masked before the cut, so a cut can never leave half of one visible.
        body, omitted = cap(self._redact(cleaned), limit, omitted_before=omitted_before)
        if not body.strip() and not omitted:
            # A failed call's error says it all; otherwise the model is told there was no output.
            body = "" if stop == "failed" and error else NO_OUTPUT
        metadata = dict(result.metadata) if result is not None else {}
        notes = []
        if omitted:
            marker = f"[… {omitted} more characters cut"
            if metadata.get("spill_path"):
                marker += f"; the whole output is in {metadata['spill_path']} (read it with read_file)"
            notes.append(marker + " …]")
        note = result.note if result is not None else ""
        if note:
            notes.append(self._redact(note))
        if error:
            notes.append(self._redact(error))
        output = body
        if notes:
            output = (body if not body or body.endswith("\n") else body + "\n") + "\n".join(notes)
        own = result.stop_reason if result is not None else None
        return ToolCallOutput(
            tool_call_id=call_id,
            name=name,
            output=output,
            stop_reason=merge_stop_reasons(own, stop),
            note=note,
            images=result.images if result is not None else (),
            untrusted=definition.untrusted if definition is not None else False,
            metadata=metadata,
            omitted_chars=omitted,
        )
