"""The wire contract: committed stubs match the .proto files, and the files follow buf STANDARD style.

``buf`` itself cannot be fetched on machines without GitHub access, so the
rules this project relies on are checked here from protoc's descriptors.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import re
import tempfile
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]


def _generate_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc

    generate = _generate_module()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        well_known = str(importlib.resources.files("grpc_tools") / "_proto")
        args = [
            "protoc",
            f"-I{ROOT / 'proto'}",
            f"-I{well_known}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
        ]
        args += [str(p.relative_to(ROOT / "proto")) for p in generate.proto_files()]
        assert protoc.main(args) == 0
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def test_committed_stubs_match_the_protos() -> None:
    """Regenerating the stubs changes nothing (run `python proto/generate.py` after editing a .proto)."""
    generate = _generate_module()
    diff = generate.drift(generate.OUT_ROOT)
    assert not diff, "".join(diff[:80])


def test_committed_e2b_stubs_match_the_protos() -> None:
    """The E2B envd stubs regenerate unchanged too, with the pinned plugins."""
    generate = _generate_module()
    diff = generate.drift(generate.E2B_OUT_ROOT, generate.generate_e2b)
    assert not diff, "".join(diff[:80])


@pytest.fixture(scope="module")
def files() -> list[descriptor_pb2.FileDescriptorProto]:
    """The compiled .proto files with their comments."""
    return list(_descriptor_set().file)


class TestStyle:
    def test_package_and_layout(self, files) -> None:
        """Every file is package sandboxd.v1 under sandboxd/v1/."""
        for f in files:
            assert f.package == "sandboxd.v1"
            assert f.name.startswith("sandboxd/v1/") and f.name.endswith(".proto")

    def test_every_element_is_commented(self, files) -> None:
        """Services, RPCs, messages, fields, enums and values each carry a leading // comment."""
        missing = []
        for f in files:
            commented = {tuple(loc.path) for loc in f.source_code_info.location if loc.leading_comments.strip()}

            def need(path: tuple[int, ...], name: str, commented=commented, f=f) -> None:  # type: ignore[no-untyped-def]
                if path not in commented:
                    missing.append(f"{f.name}: {name}")

            for i, service in enumerate(f.service):
                need((6, i), service.name)
                for j, method in enumerate(service.method):
                    need((6, i, 2, j), f"{service.name}.{method.name}")
            for i, message in enumerate(f.message_type):
                need((4, i), message.name)
                for j, field in enumerate(message.field):
                    need((4, i, 2, j), f"{message.name}.{field.name}")
                synthetic = {field.oneof_index for field in message.field if field.proto3_optional}
                for j, oneof in enumerate(message.oneof_decl):
                    if j not in synthetic:  # an `optional` field's own oneof: the field is commented
                        need((4, i, 8, j), f"{message.name}.{oneof.name}")
            for i, enum in enumerate(f.enum_type):
                need((5, i), enum.name)
                for j, value in enumerate(enum.value):
                    need((5, i, 2, j), f"{enum.name}.{value.name}")
        assert not missing, missing

    def test_names(self, files) -> None:
        """PascalCase types, lower_snake_case fields, pluralised repeated fields, no nested types."""
        for f in files:
            for message in f.message_type:
                assert re.fullmatch(r"[A-Z][A-Za-z0-9]*", message.name), message.name
                assert not message.nested_type or all(n.options.map_entry for n in message.nested_type), message.name
                assert not message.enum_type, message.name
                for field in message.field:
                    assert re.fullmatch(r"[a-z][a-z0-9_]*", field.name), field.name
                    is_map = field.type_name.endswith("Entry")
                    if field.label == field.LABEL_REPEATED and not is_map:
                        assert field.name.endswith("s"), f"{message.name}.{field.name} should be plural"

    def test_enums(self, files) -> None:
        """Enum values are prefixed with the enum name and the zero value is *_UNSPECIFIED."""
        for f in files:
            for enum in f.enum_type:
                prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"
                assert enum.value[0].number == 0 and enum.value[0].name == prefix + "UNSPECIFIED", enum.name
                for value in enum.value:
                    assert value.name.startswith(prefix), value.name

    def test_rpc_request_response_unique(self, files) -> None:
        """Each RPC takes <Rpc>Request and returns <Rpc>Response, used by no other RPC."""
        seen: set[str] = set()
        for f in files:
            for service in f.service:
                assert service.name.endswith("Service")
                for method in service.method:
                    assert method.input_type == f".sandboxd.v1.{method.name}Request", method.name
                    assert method.output_type == f".sandboxd.v1.{method.name}Response", method.name
                    assert not {method.input_type, method.output_type} & seen
                    seen |= {method.input_type, method.output_type}
