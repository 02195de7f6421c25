"""A whole Inspect AI eval in sandboxd workspaces: examples/inspect/task.py, 8 samples at once.

Inspect's mock model (``mockllm/model``) is scripted to call the ``bash`` tool once and then
answer with what it printed, so the eval runs end to end with no model provider: Inspect's
``eval()`` in a process of its own (as ``inspect eval`` runs it), the task's config file found
beside it, one workspace per sample, the tool's output in the log, the score, and nothing left.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from inspect_ai.log import read_eval_log
from inspect_ai.model import ChatMessageTool
from sandboxd_client import SandboxClient

from tests.conftest import DaemonThread

pytestmark = pytest.mark.docker

EXAMPLE = Path(__file__).parents[2] / "examples" / "inspect"

_RUNNER = textwrap.dedent(
    """
    import sys

    from inspect_ai import eval
    from inspect_ai.model import ChatMessageTool, ModelOutput, ModelUsage, get_model


    def answer(messages):
        last = messages[-1]
        if isinstance(last, ChatMessageTool):
            return ModelOutput.from_content(model="mockllm", content=f"It printed: {last.text}")
        word = messages[0].text.split("print the word ")[1].split(",")[0]
        # Each command says when it began and ended, so the test sees the samples overlap.
        # And what it found in /workspace before it left a file there: its own workspace is empty.
        command = f"date +%s.%N; ls -A /workspace | wc -l; touch /workspace/taken; sleep 5; echo {word}; date +%s.%N"
        return ModelOutput.for_tool_call(model="mockllm", tool_name="bash", tool_arguments={"command": command})


    def script(messages, tools, tool_choice, config):
        output = answer(messages)
        # Set, the mock model counts no tokens: its count needs tiktoken's tables, a download.
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return output


    [log] = eval(
        sys.argv[1],
        model=get_model("mockllm/model", custom_outputs=script),
        max_samples=8,
        max_sandboxes=8,
        log_dir=sys.argv[2],
        display="none",
    )
    print(log.location)
    """
)


@pytest.mark.parametrize("runtime", ["runc", pytest.param("runsc", marks=pytest.mark.runsc)])
async def test_an_eval_of_eight_samples_runs_them_at_once_and_leaves_nothing(
    tmp_path: Path, daemon: DaemonThread, runtime: str, request: pytest.FixtureRequest
) -> None:
    from .helpers import skip_without

    skip_without(runtime, request)
    task = tmp_path / "task.py"
    shutil.copy(EXAMPLE / "task.py", task)
    config = (EXAMPLE / "sandboxd.yaml").read_text().replace("runtime: runc", f"runtime: {runtime}")
    (tmp_path / "sandboxd.yaml").write_text(f"address: unix:{daemon.socket_path}\n{config}")
    (tmp_path / "run.py").write_text(_RUNNER)

    run = subprocess.run(
        [sys.executable, "run.py", task.name, "logs"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    log = read_eval_log(run.stdout.strip().splitlines()[-1])

    assert log.status == "success", log.error
    assert log.eval.sandbox is not None and log.eval.sandbox.type == "sandboxd"
    assert log.samples is not None and len(log.samples) == 8
    spans = []
    for sample in log.samples:
        tool = [m for m in sample.messages if isinstance(m, ChatMessageTool)]
        assert len(tool) == 1 and tool[0].error is None, sample.id
        began, found, word, ended = tool[0].text.split()
        assert (word, found) == (sample.id, "0")  # one workspace per sample
        spans.append((float(began), float(ended)))
        assert sample.scores is not None and sample.scores["includes"].value == "C", sample.id
    # Their workspaces start as fast as the engine makes them: at some moment at least half run at once
    # (a serial eval has one; this machine's two cores, loaded by the suite, see six to eight).
    peak = max(sum(b <= moment < e for b, e in spans) for moment, _ in spans)
    assert peak >= 4, f"at most {peak} samples ran at once: {sorted(spans)}"
    assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == 1.0

    async with SandboxClient(socket_path=daemon.socket_path, retries=False) as client:
        assert await client.list_workspaces({"inspect.provider": "sandboxd"}) == []
