"""An MCP server (stdio) offering the sandboxd tools on one workspace.

Run it with ``sandboxctl mcp WS``; any MCP host (an IDE, an agent framework)
can then list the tools and call them. Calls go through the same
:class:`~sandboxd_client.environment.Environment` as in-process engines, so
output shaping, stop reasons and approval are identical. Needs the ``mcp``
extra (the official ``mcp`` package).
"""

from __future__ import annotations

import secrets
from typing import Any

from .environment import Environment
from .tools._types import ToolCall

__all__ = ["serve_stdio"]


def build_server(environment: Environment) -> Any:
    """The MCP ``Server`` for an environment (exposed for tests and embedding)."""
    import mcp.types as types
    from mcp.server.lowlevel import Server

    from . import __version__

    async def list_tools(_ctx: Any, _params: Any) -> Any:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=d.name, description=d.description, input_schema=d.model_parameters())
                for d in environment.definitions()
            ]
        )

    async def call_tool(_ctx: Any, params: Any) -> Any:
        call = ToolCall(
            tool_call_id=f"mcp-{secrets.token_hex(6)}", name=params.name, arguments=dict(params.arguments or {})
        )
        output = await environment.call(call)
        content: list[Any] = [types.TextContent(type="text", text=output.output)]
        for url in output.images:
            header, _, data = url.partition(",")
            content.append(
                types.ImageContent(type="image", data=data, mime_type=header.removeprefix("data:").split(";")[0])
            )
        return types.CallToolResult(content=content, is_error=output.stop_reason in {"failed", "aborted"})

    return Server("sandboxd", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(environment: Environment) -> None:
    """Serve MCP over this process's stdin/stdout until the host hangs up."""
    from mcp.server.stdio import stdio_server

    server = build_server(environment)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
