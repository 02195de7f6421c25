"""Prometheus metrics: off by default; served where told, read by prometheus_client's own parser."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sandboxd_client import SandboxClient

from tests.conftest import DaemonThread, make_settings

pytestmark = pytest.mark.docker


def scrape(address: str) -> tuple[str, dict[str, list[tuple[dict[str, str], float]]]]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return text, samples


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for found, v in samples.get(name, []) if all(found.get(k) == want for k, want in labels.items()))


async def test_metrics_count_calls_without_ids_in_labels(tmp_path: Path) -> None:
    thread = DaemonThread(make_settings(tmp_path, metrics_address="127.0.0.1:0")).start()
    try:
        assert thread.daemon is not None and thread.daemon.metrics is not None
        address = thread.daemon.metrics.address
        _, before = scrape(address)
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            ws = await client.create_workspace(labels={"test": "metrics"}, memory_bytes=256 * 1024**2)
            try:
                result = await ws.exec("printf 12345; exit 3").wait()
                assert result.exit_code == 3
                await ws.write_file("/workspace/a.txt", "x")
                bomb = await ws.exec("""python3 -c "a=[b'x'*10**7 for _ in range(10**6)]" """, timeout_s=30).wait()
                assert bomb.oom_killed
                _, during = scrape(address)
                assert value(during, "sandboxd_sessions", state="exited") >= 1  # the finished command, kept
                assert value(during, "sandboxd_engine_up") == 1
                assert value(during, "sandboxd_lease_held") >= 1  # summed over this process's daemons
            finally:
                await ws.delete()
        text, after = scrape(address)
        for name, labels, grew in (
            ("sandboxd_rpc_requests_total", {"method": "CreateWorkspace", "code": "OK"}, 1),
            ("sandboxd_rpc_requests_total", {"method": "Exec", "code": "OK"}, 1),
            ("sandboxd_rpc_requests_total", {"method": "WriteFile", "code": "OK"}, 1),
            ("sandboxd_rpc_duration_seconds_count", {"method": "Exec"}, 1),
            ("sandboxd_exec_start_seconds_count", {}, 1),
            ("sandboxd_output_bytes_total", {"stream": "stdout"}, 5),
            ("sandboxd_process_ends_total", {"stop_reason": "exited"}, 2),
            ("sandboxd_oom_kills_total", {}, 1),
        ):
            assert value(after, name, **labels) - value(before, name, **labels) >= grew, (name, labels)
        assert value(after, "sandboxd_docker_calls_total", outcome="ok") > value(
            before, "sandboxd_docker_calls_total", outcome="ok"
        )
        assert ws.workspace_id not in text  # no id, process id or token is ever a label value
        assert "p-" not in "".join(str(labels) for series in after.values() for labels, _ in series)
    finally:
        thread.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{address}/metrics", timeout=5)


def test_no_metrics_unless_asked_and_a_bad_address_stops_the_start(tmp_path: Path) -> None:
    from sandboxd.errors import InvalidSpecError

    thread = DaemonThread(make_settings(tmp_path / "a")).start()
    try:
        assert thread.daemon is not None and thread.daemon.metrics is None
    finally:
        thread.stop()
    bad = DaemonThread(make_settings(tmp_path / "b", metrics_address="nowhere"))
    with pytest.raises(InvalidSpecError, match="is not HOST:PORT"):
        bad.start()
    bad.loop.call_soon_threadsafe(bad.loop.stop)
    bad.thread.join(10)
    bad.loop.close()
