"""The agent-facing contract without Docker: text shaping, approval, definitions, config, exports."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import jsonschema
import pytest
from sandboxd_client.approval import Approval
from sandboxd_client.config import ConfigError, load_tools, tools_from_config
from sandboxd_client.environment import check_arguments, merge_stop_reasons
from sandboxd_client.exports import to_anthropic, to_openai
from sandboxd_client.text import CleanStream, cap, clean, collapse_redraws, strip_ansi
from sandboxd_client.tools import ToolCall, builtin_definitions, default_definitions

SCHEMAS = Path(__file__).parent / "schemas"


class TestText:
    def test_ansi_is_stripped(self) -> None:
        """Colours, cursor moves and OSC titles disappear; the text stays."""
        assert strip_ansi("\x1b[31mred\x1b[0m \x1b[2K\x1b[1Gline \x1b]0;title\x07done") == "red line done"

    def test_redraws_collapse_to_the_final_state(self) -> None:
        """Progress redrawn with CR shows only its last state; a trailing CR with no newline draws nothing."""
        assert collapse_redraws("10%\r50%\r100%\nnext\n") == "100%\nnext\n"
        assert collapse_redraws("abcdef\rXY") == "XYcdef"
        assert collapse_redraws("a\rb\n") == "b\n"
        assert collapse_redraws("50%\r100%\r") == "100%"

    @pytest.mark.parametrize(
        ("raw", "shown"),
        [
            ("x\r\ny\n", "x\r\ny\n"),  # an intentional CRLF is a line ending, kept
            ("a\r\r\nb\n", "a\r\nb\n"),  # the CRs ending a line collapse to one CRLF
            ("10%\r100%\r\nnext\r\n", "100%\r\nnext\r\n"),  # a redraw ending in CRLF: its last frame, CRLF
            ("echo hi\r\n\r\n", "echo hi\r\n\r\n"),  # blank CRLF lines stay
            ("a\rb\n", "b\n"),
        ],
    )
    def test_crlf_is_a_line_ending_not_a_redraw(self, raw: str, shown: str) -> None:
        """A CR right before a newline is kept (CRLF); only a CR followed by more text redraws."""
        assert collapse_redraws(raw) == shown
        for size in (1, 2, 3):  # the same, fed as a stream in any split
            stream = CleanStream(0)
            for start in range(0, len(raw), size):
                stream.feed(raw[start : start + size])
            assert stream.finish() == shown

    def test_clean_does_both(self) -> None:
        """A coloured progress bar becomes its last frame in plain text."""
        assert clean("\x1b[32m[#   ]\x1b[0m\r\x1b[32m[####]\x1b[0m\n") == "[####]\n"

    def test_cap_keeps_the_head_on_characters(self) -> None:
        """The cut counts characters, not bytes, and keeps the head."""
        assert cap("a" + "é" * 20000, 16000) == ("a" + "é" * 15999, 4001)
        assert cap("short", 16000) == ("short", 0)
        assert cap("x" * 10, 0) == ("x" * 10, 0)


class TestStopReasons:
    @pytest.mark.parametrize(
        ("reasons", "merged"),
        [
            (("completed", "interrupted"), "interrupted"),
            (("completed", "timeout", "interrupted"), "interrupted"),
            (("failed", "timeout"), "timeout"),
            (("completed", "failed"), "failed"),
            (("completed", None), "completed"),
            ((None, None), "completed"),
        ],
    )
    def test_priority(self, reasons, merged) -> None:  # type: ignore[no-untyped-def]
        """User interrupt > timeout > tool error > the tool's own."""
        assert merge_stop_reasons(*reasons) == merged


def _call(name: str) -> ToolCall:
    return ToolCall(tool_call_id="c1", name=name, arguments={})


class TestApproval:
    async def test_no_callback_means_deny(self) -> None:
        """The SDK default asks, and with nobody to ask, denies."""
        definitions = builtin_definitions()
        decision = await Approval().decide(_call("exec_command"), definitions["exec_command"], "agent")
        assert (decision.decision, decision.asked) == ("deny", False)

    async def test_read_only_mode(self) -> None:
        """read-only allows r tools without asking and asks for rw tools."""
        asked: list[str] = []

        async def approve(call: ToolCall) -> str:
            asked.append(call.name)
            return "allow"

        approval = Approval(approve=approve, mode="read-only")  # type: ignore[arg-type]
        definitions = builtin_definitions()
        read = await approval.decide(_call("read_file"), definitions["read_file"], "agent")
        write = await approval.decide(_call("write_file"), definitions["write_file"], "agent")
        assert (read.decision, read.asked, write.decision, write.asked) == ("allow", False, "allow", True)
        assert asked == ["write_file"]
        # An `r` tool with another effect is not a read: asked about, as the scheduler rule agrees.
        paying = dataclasses.replace(definitions["read_file"], name="pay", effect="money")
        decision = await approval.decide(_call("pay"), paying, "agent")
        assert (decision.decision, decision.asked) == ("allow", True)
        assert asked == ["write_file", "pay"]

    @pytest.mark.parametrize(("mode", "decision"), [("allow-all", "allow"), ("deny-all", "deny")])
    async def test_fixed_modes(self, mode, decision) -> None:  # type: ignore[no-untyped-def]
        """allow-all and deny-all never ask."""
        result = await Approval(mode=mode).decide(_call("write_file"), builtin_definitions()["write_file"], "agent")
        assert (result.decision, result.asked) == (decision, False)

    async def test_scheduler_only_reads(self) -> None:
        """A scheduler may run read tools (when allowed) and never write tools, and is never asked about."""
        calls: list[str] = []

        async def approve(call: ToolCall) -> str:
            calls.append(call.name)
            return "allow"

        definitions = builtin_definitions()
        approval = Approval(approve=approve, mode="allow-all")  # type: ignore[arg-type]
        assert (await approval.decide(_call("write_file"), definitions["write_file"], "scheduler")).decision == "deny"
        assert (await approval.decide(_call("read_file"), definitions["read_file"], "scheduler")).decision == "allow"
        asking = Approval(approve=approve, mode="always-ask")  # type: ignore[arg-type]
        assert (await asking.decide(_call("read_file"), definitions["read_file"], "scheduler")).decision == "deny"
        assert calls == []

    async def test_user_never_asked_and_user_only_tools(self) -> None:
        """A user's call is never asked about; a user-only tool refuses the agent."""
        import dataclasses

        definition = dataclasses.replace(builtin_definitions()["write_file"], user_only=True)
        approval = Approval(mode="deny-all")
        assert (await approval.decide(_call("write_file"), definition, "user")).decision == "allow"
        refused = await Approval(mode="allow-all").decide(_call("write_file"), definition, "agent")
        assert refused.decision == "deny"
        assert "only be used by the user" in refused.reason

    async def test_effect_policy_overrides_mode(self) -> None:
        """A per-effect policy decides before the mode does."""
        approval = Approval(mode="allow-all", policy={"write": "deny"})
        definitions = builtin_definitions()
        assert (await approval.decide(_call("write_file"), definitions["write_file"], "agent")).decision == "deny"
        assert (await approval.decide(_call("read_file"), definitions["read_file"], "agent")).decision == "allow"

    async def test_broken_callback_denies(self) -> None:
        """A callback that raises counts as deny."""

        async def broken(call: ToolCall) -> str:
            raise RuntimeError("ui crashed")

        approval = Approval(approve=broken)  # type: ignore[arg-type]
        result = await approval.decide(_call("exec_command"), builtin_definitions()["exec_command"], "agent")
        assert (result.decision, result.asked) == ("deny", True)


class TestDefinitions:
    def test_the_default_table(self) -> None:
        """Names, permissions, timeouts and model kinds are the standard ones."""
        table = {d.name: (d.permission, d.timeout_ms, d.for_model) for d in default_definitions()}
        assert table == {
            "exec_command": ("rw", 120_000, None),
            "input_command": ("rw", 130_000, None),
            "read_file": ("r", 30_000, None),
            "edit_file": ("rw", 30_000, None),
            "write_file": ("rw", 30_000, None),
            "read_image": ("r", 60_000, "vision"),
            "describe_image": ("r", 90_000, "text-only"),
        }
        assert all(d.max_output_length == 16_000 for d in default_definitions())

    def test_descriptions_are_three_lines_of_what_when_and_precondition(self) -> None:
        """Three English lines (What / When / Precondition), each 60-200 characters."""
        for definition in builtin_definitions().values():
            lines = definition.description.split("\n")
            assert len(lines) == 3, definition.name
            for line in lines:
                assert 60 <= len(line) <= 200, (definition.name, line)
                assert line.isascii(), (definition.name, line)

    def test_command_tools_put_description_first_and_required(self) -> None:
        """exec/input/kill carry a required `description` argument, listed first; file tools do not."""
        for definition in builtin_definitions().values():
            properties = list(definition.parameters["properties"])
            if definition.name in {"exec_command", "input_command", "kill_command"}:
                assert properties[0] == "description"
                assert "description" in definition.parameters["required"]
            else:
                assert "description" not in properties

    def test_optional_arguments_declare_defaults(self) -> None:
        """Every optional argument has a default."""
        for definition in builtin_definitions().values():
            required = set(definition.parameters["required"])
            for name, schema in definition.parameters["properties"].items():
                if name not in required:
                    assert "default" in schema, (definition.name, name)

    def test_call_description_false_removes_it(self) -> None:
        """call_description: false drops the argument and its required entry at assembly."""
        import dataclasses

        exec_command = dataclasses.replace(builtin_definitions()["exec_command"], call_description=False)
        schema = exec_command.model_parameters()
        assert "description" not in schema["properties"]
        assert "description" not in schema["required"]
        assert "description" in builtin_definitions()["exec_command"].parameters["properties"]

    def test_every_schema_is_valid(self) -> None:
        """Each parameters object is a valid JSON Schema."""
        for definition in builtin_definitions().values():
            jsonschema.Draft202012Validator.check_schema(definition.parameters)


class TestArguments:
    def test_checks(self) -> None:
        """Missing, unknown and mistyped arguments are reported; good ones pass."""
        exec_command = builtin_definitions()["exec_command"]
        assert check_arguments(exec_command, {"description": "d", "cmd": "ls"}) is None
        assert "missing" in (check_arguments(exec_command, {"description": "d"}) or "")
        assert "unknown" in (check_arguments(exec_command, {"description": "d", "cmd": "ls", "x": 1}) or "")
        assert "whole number" in (
            check_arguments(exec_command, {"description": "d", "cmd": "ls", "yield_time_ms": "5"}) or ""
        )
        assert "whole number" in (
            check_arguments(exec_command, {"description": "d", "cmd": "ls", "yield_time_ms": True}) or ""
        )
        assert check_arguments(exec_command, ["not", "an", "object"]) == "the arguments must be a JSON object"

    def test_ranges_are_worded_for_people(self) -> None:
        """A bound is said as 'at least N' (never an int64 limit); clamped arguments are left to their tool."""
        read_file = builtin_definitions()["read_file"]
        assert check_arguments(read_file, {"file_path": "x", "offset": 0}) == (
            "argument 'offset' of read_file must be at least 1"
        )
        assert check_arguments(read_file, {"file_path": "x", "offset": 2**63}) == (
            "argument 'offset' of read_file is too large (it must fit in 64 bits)"
        )
        exec_command = builtin_definitions()["exec_command"]
        short = {"description": "d", "cmd": "ls", "yield_time_ms": 100}
        assert check_arguments(exec_command, short) == "argument 'yield_time_ms' of exec_command must be at least 250"
        assert check_arguments(exec_command, short, clamped={"yield_time_ms"}) is None

    @pytest.mark.parametrize(
        ("tool", "requested", "window_s", "note"),
        [
            ("exec_command", 100, 0.25, "[yield_time_ms 100 raised to 250, the shortest wait]"),
            ("exec_command", 0, 0.25, "[yield_time_ms 0 raised to 250, the shortest wait]"),
            ("exec_command", 250, 0.25, ""),
            ("exec_command", None, 60.0, ""),
            (
                "exec_command",
                10**30,
                119.0,
                f"[yield_time_ms {10**30} lowered to 119000, just under the tool's 120000 ms timeout]",
            ),
            ("input_command", 100, 0.25, "[yield_time_ms 100 raised to 250, the shortest wait]"),
            ("input_command", None, 0.25, ""),
            (
                "input_command",
                200_000,
                129.0,
                "[yield_time_ms 200000 lowered to 129000, just under the tool's 130000 ms timeout]",
            ),
        ],
    )
    def test_yield_is_clamped_with_a_note(self, tool: str, requested: int | None, window_s: float, note: str) -> None:
        """The yield range is a clamp: short or long values are moved into it and the note says so."""
        from sandboxd_client.tools._builtin import yield_window

        definition = builtin_definitions()[tool]
        args = {} if requested is None else {"yield_time_ms": requested}
        assert yield_window(args, 60_000 if tool == "exec_command" else 250, definition) == (window_s, note)

    def test_types_are_worded_and_integral_floats_are_integers(self) -> None:
        """'must be a whole number'; 250.0 is an integer (JSON Schema), 1.5 and true are not."""
        from sandboxd_client.tools._builtin import yield_window

        exec_command = builtin_definitions()["exec_command"]
        call = {"description": "d", "cmd": "ls"}
        assert check_arguments(exec_command, {**call, "yield_time_ms": 250.0}) is None
        for bad in (1.5, "500", True):
            assert check_arguments(exec_command, {**call, "yield_time_ms": bad}) == (
                "argument 'yield_time_ms' of exec_command must be a whole number"
            )
        input_command = builtin_definitions()["input_command"]
        assert check_arguments(input_command, {"description": "d", "process_id": "p", "yield_time_ms": "x"}) == (
            "argument 'yield_time_ms' of input_command must be a whole number or null"
        )
        assert yield_window({"yield_time_ms": 250.0}, 60_000, exec_command) == (0.25, "")

    @pytest.mark.parametrize("bad", [-5, -1, 1.5, "100", True])
    def test_yield_that_is_no_duration_is_an_argument_error(self, bad: object) -> None:
        """Negative or non-integer yields are refused with the range in words, never 9223372036854775807."""
        from sandboxd_client.tools._builtin import ToolArgumentError, yield_window

        with pytest.raises(ToolArgumentError) as caught:
            yield_window({"yield_time_ms": bad}, 250, builtin_definitions()["input_command"])
        assert str(caught.value) == (
            "argument 'yield_time_ms' of input_command must be a whole number of milliseconds, not negative "
            "(waits under 250 are raised to 250)"
        )


class TestConfig:
    def _write(self, tmp_path: Path, text: str) -> Path:
        path = tmp_path / "system_config.yaml"
        path.write_text(textwrap.dedent(text))
        return path

    def test_omitted_means_defaults(self, tmp_path: Path) -> None:
        """No tools.builtin: every default tool."""
        assert [d.name for d in load_tools(self._write(tmp_path, "model: x\n"))] == [
            d.name for d in default_definitions()
        ]
        assert [d.name for d in tools_from_config({"tools": {"mcpServers": []}})] == [
            d.name for d in default_definitions()
        ]

    def test_builtin_replaces_the_list(self, tmp_path: Path) -> None:
        """Listing only exec_command offers only exec_command (no merge), with call_description honoured."""
        entry = builtin_definitions()["exec_command"].to_mapping()
        entry["call_description"] = False
        entry["description"] = "Run a shell command in the workspace."
        import yaml

        path = self._write(tmp_path, yaml.safe_dump({"tools": {"builtin": [entry], "mcpServers": []}}))
        definitions = load_tools(path)
        assert [d.name for d in definitions] == ["exec_command"]
        assert "description" not in definitions[0].model_parameters()["properties"]
        assert definitions[0].description == "Run a shell command in the workspace."

    @pytest.mark.parametrize(
        ("entry", "message"),
        [
            (
                {"name": "exec_command", "description": "d", "permission": "rw"},
                r"tools.builtin\[0\] \(exec_command\): parameters",
            ),
            (
                {
                    "name": "nope",
                    "description": "d",
                    "permission": "r",
                    "parameters": {"type": "object", "properties": {}},
                },
                r"\[0\] \(nope\): name",
            ),
            (
                {
                    "name": "read_file",
                    "description": "d",
                    "permission": "x",
                    "parameters": {"type": "object", "properties": {}},
                },
                r"permission",
            ),
            (
                {
                    "name": "read_file",
                    "description": "d",
                    "permission": "r",
                    "timeoutMs": "fast",
                    "parameters": {"type": "object", "properties": {}},
                },
                r"timeoutMs",
            ),
        ],
    )
    def test_errors_name_entry_and_field(self, entry, message) -> None:  # type: ignore[no-untyped-def]
        """A bad entry is refused with its index, name and the offending field."""
        with pytest.raises(ConfigError, match=message):
            tools_from_config({"tools": {"builtin": [entry]}})

    def test_duplicates_and_shapes(self) -> None:
        """A tool listed twice, or builtin that is not a list, is an error."""
        entry = builtin_definitions()["read_file"].to_mapping()
        with pytest.raises(ConfigError, match="listed twice"):
            tools_from_config({"tools": {"builtin": [entry, entry]}})
        with pytest.raises(ConfigError, match="must be a list"):
            tools_from_config({"tools": {"builtin": {"name": "x"}}})


class TestExports:
    def test_openai_format(self) -> None:
        """Every tool validates against the OpenAI function-tool schema."""
        schema = json.loads((SCHEMAS / "openai_function_tool.json").read_text())
        exported = to_openai(default_definitions())
        assert [t["function"]["name"] for t in exported] == [d.name for d in default_definitions()]
        for tool in exported:
            jsonschema.validate(tool, schema)

    def test_anthropic_format(self) -> None:
        """Every tool validates against the Anthropic tool schema."""
        schema = json.loads((SCHEMAS / "anthropic_tool.json").read_text())
        for tool in to_anthropic(default_definitions()):
            jsonschema.validate(tool, schema)

    def test_user_only_tools_are_not_exported(self) -> None:
        """Tools hidden from the model are not in the exports."""
        import dataclasses

        hidden = [dataclasses.replace(d, user_only=d.name == "write_file") for d in default_definitions()]
        assert "write_file" not in [t["name"] for t in to_anthropic(hidden)]


class TestStreams:
    def _run(self, chunks: list[str], limit: int) -> tuple[str, int]:
        from sandboxd_client.text import CleanStream

        stream = CleanStream(limit)
        for chunk in chunks:
            stream.feed(chunk)
        return stream.finish(), stream.omitted

    def test_matches_clean_on_any_split(self) -> None:
        """Fed in any pieces, the stream gives what clean() gives on the whole."""
        from sandboxd_client.text import clean

        text = "\x1b[1;32mok\x1b[0m\r\nbar 10%\rbar 100%\nplain\x1b]0;t\x07 end\n"
        for size in (1, 2, 3, 5, 8, 13):
            chunks = [text[i : i + size] for i in range(0, len(text), size)]
            assert self._run(chunks, 0) == (clean(text), 0), size

    def test_cap_counts_clean_characters(self) -> None:
        """Past the limit, clean characters are counted, not raw ones."""
        assert self._run(["x" * 20000], 16000) == ("x" * 16000, 4000)
        assert self._run([f"\r{i}%" for i in range(1, 30001)] + ["\n"], 100) == ("30000%\n", 0)

    def test_redactor_across_chunks(self) -> None:
        """A secret split across chunks never comes out, in any split."""
        from sandboxd_client.text import Redactor

        text = "a supersecret b supersecret"
        for size in range(1, 8):
            redactor = Redactor(["supersecret"])
            out = "".join(redactor.feed(text[i : i + size]) for i in range(0, len(text), size)) + redactor.flush()
            assert out == "a [REDACTED] b [REDACTED]"


class TestStrictConfig:
    def test_duplicate_keys(self, tmp_path: Path) -> None:
        """A key given twice in one mapping is an error naming it, not a silent override."""
        path = tmp_path / "c.yaml"
        path.write_text("tools:\n  builtin:\n    - name: read_file\n      name: write_file\n")
        with pytest.raises(ConfigError, match="'name' is given twice"):
            load_tools(path)

    def test_unreadable_files(self, tmp_path: Path) -> None:
        """Missing files, directories and non-UTF-8 bytes are ConfigError, not raw exceptions."""
        bad = tmp_path / "bad.yaml"
        bad.write_bytes(b"tools: \xff\xfe\n")
        for path in (tmp_path / "missing.yaml", tmp_path, bad):
            with pytest.raises(ConfigError, match="cannot read"):
                load_tools(path)

    def test_policy_values_are_checked(self) -> None:
        """An unknown policy rule is refused instead of quietly meaning deny."""
        with pytest.raises(ValueError, match="bogus"):
            Approval(policy={"write": "bogus"})  # type: ignore[dict-item]
