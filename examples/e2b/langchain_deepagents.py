"""A LangChain deep agent's sandbox (``langchain-e2b``) on sandboxd, through the E2B plane.

Run ``sandboxd serve --e2b-listen 127.0.0.1:3000``, then, in a virtualenv with
``pip install langchain-e2b`` (it brings deepagents and the e2b SDK)::

    E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 E2B_API_KEY=any \
        python examples/e2b/langchain_deepagents.py

The agent's tools (execute, read_file, write_file, edit_file, ls, grep) run in a sandboxd
workspace of E2B's base template (user ``user`` in ``/home/user``, as langchain-e2b expects).
No model is called: a scripted chat model makes the tool calls a model would.
"""

import e2b
from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_e2b import E2BSandbox

WORKDIR = "/home/user"


class Scripted(GenericFakeChatModel):
    """Says the scripted messages in turn, whatever tools it is given."""

    def bind_tools(self, tools, **kwargs):  # type: ignore[no-untyped-def]
        """Keep saying the script (a real model would learn the tools here)."""
        return self


def main() -> None:
    sandbox = e2b.Sandbox.create(timeout=600)
    try:
        backend = E2BSandbox(sandbox=sandbox)
        calls = [
            ("execute", {"command": "uname -s; id -un"}),
            ("write_file", {"file_path": f"{WORKDIR}/a.txt", "content": "alpha\nbeta\n"}),
            ("edit_file", {"file_path": f"{WORKDIR}/a.txt", "old_string": "beta", "new_string": "BETA"}),
            ("read_file", {"file_path": f"{WORKDIR}/a.txt"}),
            ("grep", {"pattern": "BETA", "path": WORKDIR}),
        ]
        script = [
            AIMessage("", tool_calls=[{"name": name, "args": args, "id": str(n)}])
            for n, (name, args) in enumerate(calls)
        ]
        agent = create_deep_agent(model=Scripted(messages=iter([*script, AIMessage("done")])), backend=backend)
        for message in agent.invoke({"messages": [{"role": "user", "content": "go"}]})["messages"]:
            if message.type == "tool":
                print(f"{message.name}: {message.content!r}")
    finally:
        sandbox.kill()


if __name__ == "__main__":
    main()
