"""One round trip per tool call (issue 25): counted on the wire, under runc and gVisor.

The tool calls run through the client's tool interface (the Environment, as an agent engine
calls them) on a channel whose interceptors record every RPC the client makes and every
message each call receives. exec_command without stdin is one Exec request answered by one
stream (started, output, exited); read_file and write_file are one unary call each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from sandboxd_client import Approval, Environment, ToolCall
from sandboxd_client.tools import builtin_definitions, make_tool
from sandboxd_protocol.v1 import file_service_pb2_grpc as fgrpc
from sandboxd_protocol.v1 import process_service_pb2_grpc as pgrpc

pytestmark = pytest.mark.docker


@dataclasses.dataclass
class Wire:
    """What the client sent and received: (method, kinds of the messages that answered)."""

    calls: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)


def _method(details: grpc.aio.ClientCallDetails) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


class _Unary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        call = await continuation(details, request)
        response = await call
        self.wire.calls.append((_method(details), [type(response).__name__]))
        return response


class _Stream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        kinds: list[str] = []
        self.wire.calls.append((_method(details), kinds))
        call = await continuation(details, request)

        async def responses() -> AsyncIterator[Any]:
            async for response in call:
                kinds.append(response.WhichOneof("event") or "?")
                yield response

        return responses()


@pytest.fixture
async def counted(client, workspace, daemon):  # type: ignore[no-untyped-def]
    """The workspace's Environment on a channel that counts, and the Wire it counts on."""
    wire = Wire()
    channel = grpc.aio.insecure_channel(f"unix:{daemon.socket_path}", interceptors=[_Unary(wire), _Stream(wire)])
    # The client's own stubs, rebound to the counting channel: the calls are the client's.
    client._processes = pgrpc.ProcessServiceStub(channel)
    client._files = fgrpc.FileServiceStub(channel)
    env = Environment(
        workspace,
        approval=Approval(mode="allow-all"),
        tools=[make_tool(d) for d in builtin_definitions().values()],
    )
    yield env, wire
    await channel.close()


async def call(env: Environment, name: str, **arguments: Any):  # type: ignore[no-untyped-def]
    if name == "exec_command":
        arguments.setdefault("description", "round trip")
    return await env.call(ToolCall(tool_call_id=f"t-{name}", name=name, arguments=arguments))


async def test_exec_command_is_one_request_and_one_stream(counted) -> None:  # type: ignore[no-untyped-def]
    """exec_command of a command that ends in its window: one Exec, answered started, output, exited."""
    env, wire = counted
    out = await call(env, "exec_command", cmd="echo round-trip")
    assert out.output.startswith("round-trip\n"), out.output
    assert wire.calls == [("/sandboxd.v1.ProcessService/Exec", ["started", "output", "exited"])]


async def test_read_file_and_write_file_are_one_call_each(counted) -> None:  # type: ignore[no-untyped-def]
    """write_file then read_file of 100 lines: one WriteFile, then one ReadFile, and nothing else."""
    env, wire = counted
    text = "".join(f"line {i}\n" for i in range(1, 101))
    written = await call(env, "write_file", file_path="/tmp/hundred.txt", content=text)
    assert written.stop_reason == "completed", written.output
    read = await call(env, "read_file", file_path="/tmp/hundred.txt")
    assert read.output.splitlines()[99] == "   100\tline 100"
    assert wire.calls == [
        ("/sandboxd.v1.FileService/WriteFile", ["WriteFileResponse"]),
        ("/sandboxd.v1.FileService/ReadFile", ["ReadFileResponse"]),
    ]
