"""An 8-sample Inspect AI eval: sandbox "sandboxd" vs Inspect's own "docker" provider, in turns.

The task is ``examples/inspect/task.py``; Inspect's mock model is scripted to make one ``bash``
tool call per sample (``echo WORD``) and then answer, so the wall time is the sandboxes' own:
8 started at once, one command each, 8 removed. The same image for both (``sandboxd/base:bookworm``),
one CPU and 512 MiB each, no network. Each eval runs in a fresh process (as ``inspect eval``
does); the figure is the time of Inspect's ``eval()`` call in it, which includes every sandbox's
start and cleanup. The sides alternate, the first side alternating from pair to pair.

Inspect's docker provider drives Docker Compose v2 (``docker compose``). ``--docker-config DIR``
names a Docker client configuration directory whose ``cli-plugins`` holds it, for a machine
whose own Compose is older (Debian bookworm has 1.29). It also refuses a Docker Engine older
than 24.0.6 (bookworm's is 20.10); ``--skip-engine-check`` lets it run on one anyway, and the
figures then say so.

    .venv/bin/python bench/inspect_eval.py --rounds 5 [--runtime runsc] [--docker-config /tmp/dockercfg]
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _daemon import IMAGE, private_daemon

EXAMPLE = Path(__file__).parents[1] / "examples" / "inspect"

RUNNER = textwrap.dedent(
    """
    import sys
    import time

    from inspect_ai import eval
    from inspect_ai.model import ChatMessageTool, ModelOutput, ModelUsage, get_model


    def script(messages, tools, tool_choice, config):
        last = messages[-1]
        if isinstance(last, ChatMessageTool):
            output = ModelOutput.from_content(model="mockllm", content=f"It printed: {last.text}")
        else:
            word = messages[0].text.split("print the word ")[1].split(",")[0]
            call = {"command": f"echo {word}"}
            output = ModelOutput.for_tool_call(model="mockllm", tool_name="bash", tool_arguments=call)
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)  # no tiktoken download
        return output


    kind, config = sys.argv[1], sys.argv[2]
    if sys.argv[3:] == ["--skip-engine-check"]:
        import inspect_ai.util._sandbox.docker.prereqs as prereqs

        async def skipped():
            return None

        prereqs.validate_docker_engine = skipped
    began = time.monotonic()
    [log] = eval(
        "task.py",
        model=get_model("mockllm/model", custom_outputs=script),
        sandbox=(kind, config),
        max_samples=8,
        max_sandboxes=8,
        log_dir="logs",
        display="none",
    )
    took = time.monotonic() - began
    assert log.status == "success", log.error
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
    print(took)
    """
)


def compose_file(runtime: str) -> str:
    """Inspect's docker provider's sandbox: the same image, limits and (no) network as sandboxd's."""
    return textwrap.dedent(
        f"""
        services:
          default:
            image: {IMAGE}
            x-local: true
            init: true
            command: tail -f /dev/null
            network_mode: none
            mem_limit: 512m
            cpus: 1
            runtime: {runtime}
        """
    )


def one_eval(directory: Path, kind: str, config: str, env: dict[str, str], extra: list[str]) -> float:
    run = subprocess.run(
        [sys.executable, "run.py", kind, config, *extra],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if run.returncode != 0:
        msg = f"the {kind} eval failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        raise SystemExit(msg)
    return float(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="evals per side")
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    parser.add_argument("--docker-config", default="", help="DOCKER_CONFIG for Inspect's docker provider")
    parser.add_argument(
        "--skip-engine-check",
        action="store_true",
        help="let Inspect's docker provider run on a Docker Engine older than the 24.0.6 it asks for",
    )
    options = parser.parse_args()

    with private_daemon() as socket_path, tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        shutil.copy(EXAMPLE / "task.py", directory / "task.py")
        (directory / "run.py").write_text(RUNNER)
        (directory / "sandboxd.yaml").write_text(
            f"address: unix:{socket_path}\nruntime: {options.runtime}\nmemory: 512m\ncpus: 1\nnetwork: none\n"
        )
        (directory / "compose.yaml").write_text(compose_file(options.runtime))
        env = dict(os.environ)
        if options.docker_config:
            env["DOCKER_CONFIG"] = options.docker_config
        sides = {"sandboxd": ("sandboxd", "sandboxd.yaml"), "docker": ("docker", "compose.yaml")}
        extra = {"sandboxd": [], "docker": ["--skip-engine-check"] if options.skip_engine_check else []}
        for name, (kind, config) in sides.items():  # once each unmeasured: images, caches, the agent's volume
            one_eval(directory, kind, config, env, extra[name])
        times: dict[str, list[float]] = {name: [] for name in sides}
        for round_ in range(options.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for name in order:
                times[name].append(one_eval(directory, *sides[name], env, extra[name]))

    hour = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{hour}; runtime {options.runtime}; 8-sample Inspect eval, {options.rounds} rounds a side, interleaved")
    mine, theirs = statistics.median(times["sandboxd"]), statistics.median(times["docker"])
    for name, values in times.items():
        print(f"{name:9} median {statistics.median(values):6.2f} s   all {' '.join(f'{v:.2f}' for v in values)}")
    print(f"ratio (median, sandboxd / docker): {mine / theirs:.2f}x")


if __name__ == "__main__":
    main()
