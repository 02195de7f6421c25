"""A client in a long-lived process reconnects at once after a daemon restart."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

import grpc
import pytest
from sandboxd_client import SandboxClient, SandboxError

from tests.conftest import new_instance, spawned_daemon
from tests.integration.helpers import until_caught

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

OUTAGE_S = 45.0
"""How long the daemon is away: long enough for gRPC's default backoff to grow past 20 s."""


async def _first_success(client: SandboxClient, deadline_s: float = 30.0) -> float:
    """Poll ``health`` every 50 ms until it answers; the monotonic time it first did."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            await client.health()
        except SandboxError:
            await asyncio.sleep(0.05)
            continue
        return time.monotonic()
    pytest.fail(f"no answer within {deadline_s} s")


async def test_clients_reconnect_within_two_seconds_of_a_restart(tmp_path: Path, default_image: str) -> None:
    """After a 45 s outage, the client that lived through it and a fresh one both succeed within 2 s."""
    instance = new_instance()
    with spawned_daemon(tmp_path, instance) as (daemon, socket_path, _log):
        old = SandboxClient(socket_path=socket_path, retries=False)
        assert await old.health() == "SERVING"
        until_caught(daemon.pid, signal.SIGTERM)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)

    async def poll_through_the_outage() -> None:
        """The old client keeps trying, as an agent engine would: its backoff grows all this while."""
        while True:
            with contextlib.suppress(SandboxError):
                await old.health()
            await asyncio.sleep(0.2)

    polling = asyncio.create_task(poll_through_the_outage())
    await asyncio.sleep(OUTAGE_S)
    polling.cancel()
    try:
        with spawned_daemon(tmp_path, instance):  # returns once the socket accepts
            serving = await _serving(socket_path)
            async with SandboxClient(socket_path=socket_path, retries=False) as fresh:
                old_back, fresh_back = await asyncio.gather(_first_success(old), _first_success(fresh))
            assert old_back - serving < 2.0, f"the old client took {old_back - serving:.1f} s"
            assert fresh_back - serving < 2.0, f"a fresh client took {fresh_back - serving:.1f} s"
    finally:
        await old.close()


async def _serving(socket_path: str) -> float:
    """When the daemon answers health checks, seen by a channel of its own (no client options involved)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    options = [("grpc.use_local_subchannel_pool", 1)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        async with grpc.aio.insecure_channel(f"unix:{socket_path}", options=options) as channel:
            try:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.05)
                continue
        return time.monotonic()
    pytest.fail("the restarted daemon never answered")
