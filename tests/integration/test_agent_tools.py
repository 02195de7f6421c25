"""The built-in agent tools through the Environment, against a real daemon and real Docker (issue 5)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from sandboxd_client import (
    Approval,
    Environment,
    ToolCall,
    ToolCallOutput,
    ToolCallPartial,
    ToolCallStart,
    ToolCallStop,
)
from sandboxd_client.tools import builtin_definitions, make_tool

pytestmark = pytest.mark.docker


def environment(workspace, **options) -> Environment:  # type: ignore[no-untyped-def]
    options.setdefault("approval", Approval(mode="allow-all"))
    options.setdefault("tools", [make_tool(d) for d in builtin_definitions().values()])
    return Environment(workspace, **options)


async def run(env: Environment, name: str, **arguments) -> ToolCallOutput:  # type: ignore[no-untyped-def]
    if name in {"exec_command", "input_command", "kill_command"}:
        arguments.setdefault("description", "test call")
    return await env.call(ToolCall(tool_call_id=f"t-{name}", name=name, arguments=arguments))


class TestExecOutputCap:
    @pytest.mark.parametrize("size", [15999, 16000, 16001, 16100, 20000, 1000000])
    @pytest.mark.parametrize("stream", ["stdout", "stderr"])
    async def test_cap_marker_and_note(self, workspace, size: int, stream: str) -> None:
        """The body is exactly the first 16000 characters; a marker only past 16000; the exit note last, whole."""
        env = environment(workspace)
        out = await run(
            env, "exec_command", cmd=f"python3 -c \"import sys; sys.{stream}.write('x'*{size}); sys.exit(7)\""
        )
        lines = out.output.split("\n")
        assert lines[0] == "x" * min(size, 16000)
        assert lines[-1] == "[exit code 7]"
        if size > 16000:
            assert len(lines) == 3
            assert lines[1].startswith(
                f"[… {size - 16000} more characters cut; the whole output is in /workspace/.sandboxd/spill/"
            )
            spill = lines[1].split(" is in ")[1].split(" ")[0]
            check = await workspace.exec(f"wc -c < {spill}").wait()
            assert check.stdout.strip() == str(size)
        else:
            assert len(lines) == 2
        assert out.metadata["exit_code"] == 7
        assert out.stop_reason == "completed"
        assert out.untrusted

    async def test_multibyte_cut_on_characters(self, workspace) -> None:
        """'a' + 20000 x 'é' keeps 'a' + 15999 x 'é', with no U+FFFD."""
        out = await run(
            environment(workspace), "exec_command", cmd="""python3 -c "import sys; sys.stdout.write('a'+'é'*20000)" """
        )
        assert out.output.split("\n")[0] == "a" + "é" * 15999
        assert "\ufffd" not in out.output

    async def test_invalid_utf8(self, workspace) -> None:
        """Bytes that are not UTF-8 show as U+FFFD, never an error."""
        out = await run(environment(workspace), "exec_command", cmd="printf 'ok\\377\\376end\\n'")
        assert out.output == "ok\ufffd\ufffdend\n[exit code 0]"

    async def test_no_output(self, workspace) -> None:
        """`true` gives [no output] and the exit-code note."""
        out = await run(environment(workspace), "exec_command", cmd="true")
        assert out.output == "[no output]\n[exit code 0]"

    async def test_ansi_and_redraws_are_cleaned(self, workspace) -> None:
        """Colours are stripped and a progress bar redrawn with CR shows only its final state."""
        out = await run(
            environment(workspace),
            "exec_command",
            cmd=(
                "printf '\\033[1;31mred\\033[0m\\n'; "
                "for i in 10 50 100; do printf '\\rprogress %s%%' $i; sleep 0.05; done; echo"
            ),
        )
        assert out.output == "red\nprogress 100%\n[exit code 0]"

    @pytest.mark.parametrize(
        ("printed", "shown"),
        [("x\\r\\ny\\n", "x\r\ny\n"), ("a\\rb\\n", "b\n"), ("a\\r\\r\\nb\\n", "a\r\nb\n")],
    )
    async def test_crlf_reaches_the_model(self, workspace, printed: str, shown: str) -> None:
        """An intentional CRLF stays in the model's text and in the partial events; a redraw collapses."""
        env = environment(workspace)
        call = ToolCall(
            tool_call_id="crlf", name="exec_command", arguments={"description": "d", "cmd": f"printf '{printed}'"}
        )
        events = [event async for event in env.run(call)]
        final = next(e for e in events if isinstance(e, ToolCallOutput))
        assert final.output == shown + "[exit code 0]"
        partial = "".join(e.text for e in events if isinstance(e, ToolCallPartial))
        assert partial == printed.replace("\\r", "\r").replace("\\n", "\n")  # partials are the raw text

    async def test_streams_interleave_in_order(self, workspace) -> None:
        """The model sees stdout and stderr in the order they were written."""
        out = await run(environment(workspace), "exec_command", cmd="echo one; echo two >&2; echo three")
        assert out.output == "one\ntwo\nthree\n[exit code 0]"


class TestCommandSessions:
    async def test_yield_then_ctrl_c(self, workspace) -> None:
        """sleep 30 with yield 500 returns a process_id; input_command Ctrl-C ends it with 130."""
        env = environment(workspace)
        first = await run(env, "exec_command", cmd="sleep 30", yield_time_ms=500)
        process_id = first.metadata["process_id"]
        assert process_id.startswith("p-")
        assert first.metadata["exit_code"] is None
        assert f"process_id={process_id}" in first.output
        stopped = await run(env, "input_command", process_id=process_id, chars="\u0003")
        assert stopped.metadata["exit_code"] == 130
        assert stopped.metadata["process_id"] is None  # it has exited: nothing left to drive
        assert stopped.output.endswith("[exit code 130, SIGINT]")
        assert stopped.stop_reason == "interrupted"

    async def test_process_id_exactly_while_running(self, workspace) -> None:
        """A finished command's result has process_id None and its exit code; a yielded one has both ways."""
        env = environment(workspace)
        done = await run(env, "exec_command", cmd="echo hi")
        assert (done.metadata["process_id"], done.metadata["exit_code"]) == (None, 0)
        running = await run(env, "exec_command", cmd="read line; echo got $line", yield_time_ms=250)
        process_id = running.metadata["process_id"]
        assert (process_id.startswith("p-"), running.metadata["exit_code"]) == (True, None)
        still = await run(env, "input_command", process_id=process_id, chars="", yield_time_ms=250)
        assert (still.metadata["process_id"], still.metadata["exit_code"]) == (process_id, None)
        ended = await run(env, "input_command", process_id=process_id, chars="x\n", yield_time_ms=5000)
        assert ended.output == "got x\n[exit code 0]"
        assert (ended.metadata["process_id"], ended.metadata["exit_code"]) == (None, 0)

    async def test_short_yield_is_clamped_and_said(self, workspace) -> None:
        """yield_time_ms 100 waits 250 ms and says so; a negative one is an error in words."""
        env = environment(workspace)
        first = await run(env, "exec_command", cmd="sleep 3", yield_time_ms=100)
        process_id = first.metadata["process_id"]
        assert first.output.endswith(
            f"[still running as process_id={process_id}; use input_command to send input, poll for output or "
            "send Ctrl-C]\n[yield_time_ms 100 raised to 250, the shortest wait]"
        )
        bad = await run(env, "input_command", process_id=process_id, yield_time_ms=-5)
        assert (bad.output, bad.stop_reason) == (
            "Error: argument 'yield_time_ms' of input_command must be a whole number of milliseconds, not negative "
            "(waits under 250 are raised to 250)",
            "failed",
        )
        done = await run(env, "input_command", process_id=process_id, yield_time_ms=10**9)
        assert done.output == (
            "[no output]\n[exit code 0]\n"
            "[yield_time_ms 1000000000 lowered to 129000, just under the tool's 130000 ms timeout]"
        )

    async def test_unknown_process_is_readable_output(self, workspace) -> None:
        """input_command on an unknown id is an error the model can read, not an exception."""
        out = await run(environment(workspace), "input_command", process_id="p-000000000000")
        assert out.stop_reason == "failed"
        assert out.output == "Error: process 'p-000000000000' not found"

    async def test_abort_while_timing_out_is_interrupted(self, workspace) -> None:
        """An engine abort while a timed-out call is still winding down makes it interrupted (the stronger)."""
        import dataclasses
        import io

        from PIL import Image

        buffer = io.BytesIO()
        Image.new("RGB", (2, 2)).save(buffer, "PNG")
        await workspace.write_file("slow.png", buffer.getvalue())

        async def slow_vision(image, prompt: str) -> str:  # type: ignore[no-untyped-def]
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                await asyncio.sleep(0.6)  # slow to stop: the abort arrives meanwhile
                raise
            return "never"

        definition = dataclasses.replace(builtin_definitions()["describe_image"], timeout_ms=1000)
        env = environment(workspace, tools=[make_tool(definition)], vision=slow_vision)
        abort = asyncio.Event()
        asyncio.get_running_loop().call_later(1.3, abort.set)
        call = ToolCall(tool_call_id="t-abort", name="describe_image", arguments={"source": "slow.png"})
        out = await env.call(call, abort=abort)
        assert out.stop_reason == "interrupted"
        assert out.output == "[no output]\n[interrupted by the user]"

    async def test_abort_stops_a_running_command(self, workspace) -> None:
        """An abort mid-command interrupts it: stop_reason interrupted, and the command gets Ctrl-C."""
        env = environment(workspace)
        abort = asyncio.Event()
        call = ToolCall(
            tool_call_id="t-abort-2",
            name="exec_command",
            arguments={
                "description": "d",
                "cmd": "trap 'echo got-int > /workspace/int.txt; exit 1' INT; echo ready; sleep 30 & wait",
            },
        )
        seen, out = "", None
        async for event in env.run(call, abort=abort):
            if isinstance(event, ToolCallPartial):
                seen += event.text
                if "ready" in seen:
                    abort.set()  # only now: the trap is in place, so the abort's Ctrl-C meets it
            elif isinstance(event, ToolCallOutput):
                out = event
        assert out is not None
        assert out.stop_reason == "interrupted"
        for _ in range(30):
            if (await workspace.exec("cat /workspace/int.txt 2>/dev/null").wait()).stdout:
                break
            await asyncio.sleep(0.1)
        assert (await workspace.exec("cat /workspace/int.txt").wait()).stdout == "got-int\n"

    async def test_timeout_alone(self, workspace) -> None:
        """A tool call that outlives its timeout stops with stop_reason timeout and says so."""
        import dataclasses

        definition = dataclasses.replace(builtin_definitions()["read_file"], timeout_ms=1)
        env = environment(workspace, tools=[make_tool(definition)])
        out = await run(env, "read_file", file_path="/etc/hostname")
        assert out.stop_reason == "timeout"
        assert out.output == "[no output]\n[timed out after 0.001 s]"

    async def test_framing(self, workspace) -> None:
        """Events are start, partial output..., the final output, stop — all with the tool_call_id."""
        env = environment(workspace)
        call = ToolCall(
            tool_call_id="frame-1",
            name="exec_command",
            arguments={"description": "count", "cmd": "echo a; sleep 0.3; echo b"},
        )
        events = [event async for event in env.run(call)]
        assert isinstance(events[0], ToolCallStart)
        assert events[0].description == "count"
        assert isinstance(events[-2], ToolCallOutput)
        assert isinstance(events[-1], ToolCallStop)
        assert {e.tool_call_id for e in events} == {"frame-1"}
        assert "".join(e.text for e in events if isinstance(e, ToolCallPartial)) == "a\nb\n"


class TestFileTools:
    async def test_write_read_edit(self, workspace) -> None:
        """write_file, read_file and edit_file give their standard messages."""
        env = environment(workspace)
        written = await run(env, "write_file", file_path="notes.txt", content="alpha\nbeta\n")
        assert written.output == "Created /workspace/notes.txt (2 lines, 11 bytes)"
        read = await run(env, "read_file", file_path="notes.txt")
        assert read.output == "     1\talpha\n     2\tbeta"
        edited = await run(env, "edit_file", file_path="notes.txt", old_string="beta", new_string="gamma")
        assert edited.output.startswith("Replaced 1 occurrence(s) in /workspace/notes.txt\n--- a/workspace/notes.txt")
        missing = await run(env, "edit_file", file_path="notes.txt", old_string="zeta", new_string="eta")
        assert missing.stop_reason == "failed"
        assert missing.output.startswith("Error: old_string was not found")

    async def test_read_image_attaches_the_image(self, workspace) -> None:
        """read_image returns a short text and the image as a data URL after it."""
        import io

        from PIL import Image

        buffer = io.BytesIO()
        Image.new("RGB", (3, 2), (9, 9, 9)).save(buffer, "PNG")
        await workspace.write_file("pic.png", buffer.getvalue())
        out = await run(environment(workspace), "read_image", source="pic.png")
        assert out.output == f"pic.png: image/png, 3x2 pixels, {len(buffer.getvalue())} bytes"
        assert out.images[0].startswith("data:image/png;base64,")

    async def test_describe_image_uses_the_engines_vision(self, workspace) -> None:
        """describe_image hands the image and question to the engine's vision model."""
        import io

        from PIL import Image

        buffer = io.BytesIO()
        Image.new("RGB", (5, 4)).save(buffer, "PNG")
        await workspace.write_file("d.png", buffer.getvalue())
        seen = []

        async def vision(image, prompt: str) -> str:  # type: ignore[no-untyped-def]
            seen.append((image.width, image.height, prompt))
            return "a black rectangle"

        out = await run(environment(workspace, vision=vision), "describe_image", source="d.png", prompt="What is it?")
        assert out.output == "a black rectangle"
        assert seen == [(5, 4, "What is it?")]


class TestApprovalFlow:
    async def test_deny_is_exact_and_traced(self, workspace) -> None:
        """A denial is an aborted output of exactly 'Tool call denied by user.' with a trace event."""

        async def deny(call: ToolCall) -> str:
            return "deny"

        env = environment(workspace, approval=Approval(approve=deny, mode="always-ask"))  # type: ignore[arg-type]
        out = await run(env, "write_file", file_path="x.txt", content="x")
        assert (out.output, out.stop_reason) == ("Tool call denied by user.", "aborted")
        decisions = [e for e in env.trace.events if e["event"] == "approval_decision"]
        assert len(decisions) == 1
        assert (decisions[0]["decision"], decisions[0]["actor"], decisions[0]["mode"]) == (
            "deny",
            "agent",
            "always-ask",
        )
        assert (await workspace.exec("test -e x.txt; echo $?").wait()).stdout == "1\n"

    async def test_read_only_mode_asks_only_for_writes(self, workspace) -> None:
        """read-only: read_file runs unasked, write_file asks (exactly once)."""
        asked: list[str] = []

        async def approve(call: ToolCall) -> str:
            asked.append(call.name)
            return "allow"

        env = environment(workspace, approval=Approval(approve=approve, mode="read-only"))  # type: ignore[arg-type]
        await run(env, "read_file", file_path="/etc/hostname")
        await run(env, "write_file", file_path="y.txt", content="y")
        assert asked == ["write_file"]

    async def test_scheduler_cannot_write(self, workspace) -> None:
        """A scheduler's write_file is denied without asking."""
        asked: list[str] = []

        async def approve(call: ToolCall) -> str:
            asked.append(call.name)
            return "allow"

        env = environment(workspace, approval=Approval(approve=approve, mode="always-ask"))  # type: ignore[arg-type]
        call = ToolCall(tool_call_id="s1", name="write_file", arguments={"file_path": "z.txt", "content": "z"})
        out = await env.call(call, actor="scheduler")
        assert (out.output, out.stop_reason) == ("Tool call denied by user.", "aborted")
        assert asked == []

    async def test_secrets_are_masked(self, workspace) -> None:
        """Known secret values never reach the model's output."""
        env = environment(workspace, secrets=["hunter2-secret"])
        out = await run(env, "exec_command", cmd="echo the password is hunter2-secret")
        assert out.output == "the password is [REDACTED]\n[exit code 0]"
        assert all("hunter2-secret" not in json.dumps(e) for e in env.trace.events)


class TestCommandLineAndMcp:
    def test_sandboxctl_tool(self, daemon, workspace_id) -> None:
        """`sandboxctl tool WS exec_command '{...}'` prints what the model would see."""
        run_ = subprocess.run(
            [
                sys.executable,
                "-m",
                "sandboxd_client.cli",
                "--socket",
                daemon.socket_path,
                "tool",
                workspace_id,
                "exec_command",
                '{"cmd":"echo hi","description":"say hi"}',
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (run_.stdout, run_.returncode) == ("hi\n[exit code 0]\n", 0)
        as_json = subprocess.run(
            [
                sys.executable,
                "-m",
                "sandboxd_client.cli",
                "--socket",
                daemon.socket_path,
                "tool",
                workspace_id,
                "exec_command",
                '{"cmd":"exit 3","description":"fail"}',
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        message = json.loads(as_json.stdout)
        assert (message["output"], message["exit_code"], message["stop_reason"]) == (
            "[no output]\n[exit code 3]",
            3,
            "completed",
        )
        assert message["process_id"] is None  # finished: only a running command has a process_id

    async def test_mcp_client_session(self, daemon, workspace_id) -> None:
        """A real MCP client lists the tools and runs exec_command on a real workspace."""
        from mcp.client.session import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "sandboxd_client.cli", "--socket", daemon.socket_path, "mcp", workspace_id],
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.list_tools()
            names = [tool.name for tool in listed.tools]
            assert names == ["exec_command", "input_command", "read_file", "edit_file", "write_file", "read_image"]
            result = await session.call_tool("exec_command", {"cmd": "echo from-mcp", "description": "mcp test"})
            assert result.content[0].text == "from-mcp\n[exit code 0]"
            assert not result.is_error


def test_scripted_agent_example(daemon) -> None:
    """examples/scripted_agent.py runs end to end against the daemon and all its checks pass."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "scripted_agent.py"
    run_ = subprocess.run(
        [sys.executable, str(example), "--socket", daemon.socket_path], capture_output=True, text=True, timeout=120
    )
    assert run_.returncode == 0, run_.stdout + run_.stderr
    assert run_.stdout.count("ok ") == 5
