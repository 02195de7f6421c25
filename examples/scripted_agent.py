"""A scripted agent loop: a fixed list of tool calls standing in for a model, run end to end.

It shows the whole contract an engine gets from sandboxd-client: tool
definitions to offer a model, an Environment that runs each call (approval,
streaming, output shaping, stop reasons), and the trace. No model is needed:
the "model" is the list below, and each step checks what it got back.

Usage (with a daemon running, e.g. `.venv/bin/sandboxd serve &`):

    .venv/bin/python examples/scripted_agent.py [--socket PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from sandboxd_client import Approval, Environment, SandboxClient, ToolCall, ToolCallOutput, ToolCallPartial
from sandboxd_client.exports import to_anthropic
from sandboxd_client.tools import default_tools

STEPS = [
    ("write_file", {"file_path": "calc/calc.py", "content": "def add(a, b):\n    return a - b\n"}),
    (
        "write_file",
        {
            "file_path": "calc/test_calc.py",
            "content": (
                "import unittest\nfrom calc import add\n\n\n"
                "class T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
            ),
        },
    ),
    ("exec_command", {"description": "Run the tests", "cmd": "cd calc && python3 -m unittest -q", "workdir": ""}),
    ("read_file", {"file_path": "calc/calc.py"}),
    ("edit_file", {"file_path": "calc/calc.py", "old_string": "return a - b", "new_string": "return a + b"}),
    ("exec_command", {"description": "Run the tests again", "cmd": "cd calc && python3 -m unittest -q"}),
    (
        "exec_command",
        {
            "description": "Start a server that runs until stopped",
            "cmd": "python3 -u -c 'import time\nwhile True: print(\"tick\"); time.sleep(0.2)'",
            "yield_time_ms": 700,
        },
    ),
    ("input_command", {"description": "Stop the server with Ctrl-C", "process_id": "$LAST_PROCESS", "chars": "\u0003"}),
]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", help="daemon socket (default: SANDBOXD_SOCKET or the per-user default)")
    opts = parser.parse_args()
    async with SandboxClient(socket_path=opts.socket) as client:
        workspace = await client.create_workspace(labels={"example": "scripted-agent"})
        try:
            tools = default_tools(model="vision")
            print(f"offering {len(tools)} tools, e.g. {json.dumps(to_anthropic([tools[0].definition])[0])[:100]}…")
            env = Environment(workspace, tools=tools, approval=Approval(mode="allow-all"))
            last_process = ""
            outputs: list[ToolCallOutput] = []
            for number, (name, arguments) in enumerate(STEPS, 1):
                arguments = {k: (last_process if v == "$LAST_PROCESS" else v) for k, v in arguments.items()}
                print(f"\n>>> step {number}: {name} {json.dumps(arguments)[:90]}")
                async for event in env.run(ToolCall(tool_call_id=f"step-{number}", name=name, arguments=arguments)):
                    if isinstance(event, ToolCallPartial):
                        print(f"    | {event.text.rstrip()}"[:120])
                    elif isinstance(event, ToolCallOutput):
                        outputs.append(event)
                        print(
                            f"    = stop_reason={event.stop_reason}\n"
                            + "\n".join(f"    {line}" for line in event.output.splitlines())
                        )
                        last_process = event.metadata.get("process_id") or last_process
            checks = {
                "first test run failed": outputs[2].metadata.get("exit_code") == 1,
                "second test run passed": outputs[5].metadata.get("exit_code") == 0,
                "server yielded a process_id": outputs[6].metadata.get("exit_code") is None,
                "Ctrl-C stopped it": outputs[7].metadata.get("exit_code") == 130,
                "every call is in the trace": len([e for e in env.trace.events if e["event"] == "approval_decision"])
                == len(STEPS),
            }
            print()
            for what, ok in checks.items():
                print(f"{'ok ' if ok else 'FAIL'} {what}")
            return 0 if all(checks.values()) else 1
        finally:
            await workspace.delete()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
