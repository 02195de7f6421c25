"""A tiny Inspect AI task whose tool calls run in sandboxd workspaces.

    inspect eval examples/inspect/task.py --model openai/gpt-4o-mini

Each sample gets its own workspace, made from ``sandboxd.yaml`` beside this file (or the
daemon's defaults without it) and removed when the sample ends. The only sandboxd-specific
word is the sandbox's type.
"""

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash

WORDS = ["amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "harbor"]


@task
def echo_words() -> Task:
    """Ask for a word to be printed from a shell; the answer must name it."""
    return Task(
        dataset=[
            Sample(id=word, input=f"Use the bash tool to print the word {word}, then say what it printed.", target=word)
            for word in WORDS
        ],
        solver=[use_tools(bash(timeout=60)), generate()],
        scorer=includes(),
        sandbox=("sandboxd", "sandboxd.yaml"),
    )
