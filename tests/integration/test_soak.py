"""A minute of many callers through two daemon kills: every output and exit right, nothing lost.

The short form of ``bench/soak.py`` (an hour, an engine restart and agent kills there): 8
workspaces with 2 callers each run the mixed work (``true``, ``seq`` checked byte for byte,
a 1 MiB file and its hash, a Ctrl-C'd ``sleep``, a background counter polled turns later)
while the daemon is SIGKILLed twice and started again. Calls that meet the daemon away fail
UNAVAILABLE and are retried within their budget; streams resume from their last byte.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

_SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def _load_soak():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_soak", _SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_soak"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def test_a_minute_of_mixed_work_through_two_daemon_kills_loses_nothing(
    tmp_path: Path, default_image: str
) -> None:
    soak = _load_soak()
    opts = soak.parser().parse_args(
        ["--minutes", "1", "--workspaces", "8", "--callers", "2", "--daemon-kill-every-s", "20"]
    )
    assert isinstance(opts, argparse.Namespace)
    report = await soak.soak(opts, tmp_path)
    summary = (
        f"errors {dict(report.errors)}, wrong outputs {report.wrong_outputs[:3]}, wrong exits "
        f"{report.wrong_exits[:3]}, lost {report.lost[:3]}, faults {report.faults}"
    )
    assert [fault.split(": ", 1)[1] for fault in report.faults] == ["the daemon was SIGKILLed and started again"] * 2
    assert report.wrong == 0, summary
    assert sum(report.calls.values()) > 100, dict(report.calls)  # every kind ran, through both kills
    assert set(report.calls) == set(soak.KINDS), dict(report.calls)
    assert sum(report.retried.values()) > 0, "no call met the daemon away: the kills were not felt"
    assert report.samples, "the daemon was never sampled"
