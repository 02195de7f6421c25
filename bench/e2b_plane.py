"""One `commands.run("true")` through the E2B plane vs sandboxd's gRPC client vs raw docker-py.

Usage: ``.venv/bin/python bench/e2b_plane.py [--runs N] [--runtime runc|runsc ...]``.
Starts a private daemon with ``--e2b-listen`` on a loopback port and its workspaces under the
runtime given, creates one sandbox with the unmodified ``e2b`` SDK (sync), and times, in turns
(the first of each triple rotating):
  e2b       Sandbox.commands.run("true") (Process/Start over HTTP/1.1 to the plane, which calls
            the daemon's Exec over its Unix socket, then streams start, end);
  grpc      SandboxClient.exec(same workspace, "true").wait() (the daemon's Exec);
  docker    docker-py exec_run(["true"]) in a container of the same image.
The E2B plane's own cost is the difference of the first two medians. Each sample comes
``--pace`` seconds after the previous one (0.3 s by default, as an agent's calls do): a
workspace's agent keeps a login shell started for the next command, and a call that comes
before it is ready pays for starting one, so back-to-back samples would favour whichever side
happens to follow a docker-py sample.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable

import docker
from _daemon import private_daemon_process
from exec_latency import DOCKER_OPTIONS
from sandboxd_client import SandboxClient


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def measure(runtime: str, runs: int, pace_s: float) -> None:
    port = _free_port()
    env = {"SANDBOXD_E2B_ADDRESS": f"127.0.0.1:{port}", "SANDBOXD_DEFAULT_RUNTIME": runtime}
    with private_daemon_process(env=env) as (socket_path, _pid):
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}"
        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY="bench")
        from e2b import Sandbox

        engine = docker.from_env()
        sandbox = Sandbox.create(timeout=3600)
        container = engine.containers.run("sandboxd/base:bookworm", runtime=runtime, **DOCKER_OPTIONS)
        loop = asyncio.new_event_loop()

        async def connect() -> SandboxClient:  # the channel belongs to the loop it is made in
            return SandboxClient(socket_path=socket_path, retries=False)

        client = loop.run_until_complete(connect())
        try:

            def e2b() -> None:
                sandbox.commands.run("true")

            def grpc() -> None:
                loop.run_until_complete(client.exec(sandbox.sandbox_id, "true").wait())

            def raw() -> None:
                container.exec_run(["true"])

            sides: dict[str, Callable[[], None]] = {"e2b": e2b, "grpc": grpc, "docker": raw}
            for side in sides.values():  # warm each path once: connections, the login shell's files
                side()
            samples: dict[str, list[float]] = {name: [] for name in sides}
            names = list(sides)
            for turn in range(runs):
                order = names[turn % 3 :] + names[: turn % 3]
                for name in order:
                    time.sleep(pace_s)
                    started = time.perf_counter()
                    sides[name]()
                    samples[name].append(time.perf_counter() - started)
        finally:
            loop.run_until_complete(client.close())
            loop.close()
            sandbox.kill()
            container.remove(force=True)
            engine.close()
    hour = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"{hour}; runtime {runtime}; commands.run('true') round trip, {runs} runs a side, interleaved, "
        f"{pace_s:g} s apart"
    )
    for name, taken in samples.items():
        ordered = sorted(taken)
        p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
        print(f"{name:7s} median {_median_ms(taken):7.2f} ms   p90 {p90 * 1000:7.2f} ms")
    plane = _median_ms(samples["e2b"]) - _median_ms(samples["grpc"])
    print(f"the E2B plane's own cost (e2b - grpc medians): {plane:+.2f} ms")
    print(f"ratio e2b / docker: {_median_ms(samples['e2b']) / _median_ms(samples['docker']):.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--runtime", action="append", choices=["runc", "runsc"])
    parser.add_argument("--pace", type=float, default=0.3, help="seconds between samples")
    opts = parser.parse_args()
    for runtime in opts.runtime or ["runc"]:
        measure(runtime, opts.runs, opts.pace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
