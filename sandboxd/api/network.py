"""NetworkService servicer: forwarded connections into workspaces, and their network policy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from sandboxd_protocol.v1 import network_service_pb2 as npb
from sandboxd_protocol.v1 import network_service_pb2_grpc as ngrpc

from .. import metrics
from ..audit import audit_fields
from ..errors import InvalidSpecError
from ..forwards import EOF, PortForwarder
from ..workspaces import WorkspaceManager
from . import convert
from ._types import Context

__all__ = ["FIRST_MESSAGE_TIMEOUT_S", "NetworkServicer"]

FIRST_MESSAGE_TIMEOUT_S = 30.0
"""Longest wait for a ForwardPort call's target: a stream that names none holds nothing for long."""


class NetworkServicer(ngrpc.NetworkServiceServicer):
    """Serves ForwardPort through a :class:`PortForwarder`, UpdateNetwork through the workspace manager."""

    def __init__(self, forwarder: PortForwarder, workspaces: WorkspaceManager) -> None:
        """Serve ``forwarder``'s connections and ``workspaces``' policies."""
        self.forwarder = forwarder
        self.workspaces = workspaces

    async def UpdateNetwork(self, request: npb.UpdateNetworkRequest, context: Context) -> npb.UpdateNetworkResponse:
        """Change a running workspace's network policy."""
        network = convert.network_policy(request.network)
        audit_fields(
            network=str(network or "none"), allowed_hosts=",".join(rule.host for rule in request.allowed_hosts)
        )
        workspace = await self.workspaces.update_network(
            request.workspace_id, network, convert.egress_rules(request.allowed_hosts)
        )
        return npb.UpdateNetworkResponse(workspace=convert.workspace_to_proto(workspace))

    async def ForwardPort(
        self, request_iterator: AsyncIterator[npb.ForwardPortRequest], context: Context
    ) -> AsyncIterator[npb.ForwardPortResponse]:
        """Relay one TCP connection; the first request names the target."""
        try:
            async with asyncio.timeout(FIRST_MESSAGE_TIMEOUT_S):
                first = await anext(aiter(request_iterator), None)
        except TimeoutError:
            msg = f"the first ForwardPort message must carry the target, within {FIRST_MESSAGE_TIMEOUT_S:g} s"
            raise InvalidSpecError(msg) from None
        if first is None or first.WhichOneof("message") != "target":
            msg = "the first ForwardPort message must carry the target"
            raise InvalidSpecError(msg)
        target = first.target
        audit_fields(workspace_id=target.workspace_id, port=target.port)
        sent = received = 0

        async def incoming() -> AsyncIterator[bytes]:
            nonlocal received
            async for message in request_iterator:
                if message.WhichOneof("message") != "data":
                    msg = "only the first ForwardPort message may carry a target"
                    raise InvalidSpecError(msg)
                received += len(message.data)
                yield message.data

        try:
            relay = self.forwarder.forward(target.workspace_id, target.port, incoming())
            async for data in relay:
                if data is EOF:
                    yield npb.ForwardPortResponse(eof=npb.ForwardPortEof())
                elif not data:
                    yield npb.ForwardPortResponse(connected=npb.ForwardPortConnected())
                else:
                    sent += len(data)
                    yield npb.ForwardPortResponse(data=data)
        finally:
            audit_fields(bytes_to_workspace=received, bytes_from_workspace=sent)
            metrics.FORWARD_BYTES.labels(direction="to_workspace").inc(received)
            metrics.FORWARD_BYTES.labels(direction="from_workspace").inc(sent)
