"""``system_config.yaml``: ``tools.builtin`` replaces the default tool list.

The list is not merged with the defaults: omit ``tools.builtin`` to get every
default tool; write it, and exactly the tools listed are offered, each with its
complete definition (``parameters`` JSON Schema included). Entries are checked
with jsonschema, and errors name the entry and the field. Needs the ``agent``
extra (PyYAML, jsonschema).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .tools._builtin import IMPLEMENTATIONS
from .tools._definitions import default_definitions
from .tools._types import ToolDefinitionConfig

__all__ = ["ENTRY_SCHEMA", "ConfigError", "load_tools", "tools_from_config"]


class ConfigError(ValueError):
    """The configuration is not valid; the message names the entry and field."""


ENTRY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "description", "permission", "parameters"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "enum": sorted(IMPLEMENTATIONS)},
        "description": {"type": "string", "minLength": 1},
        "permission": {"enum": ["r", "rw"]},
        "forModel": {"enum": ["vision", "text-only"]},
        "timeoutMs": {"type": "integer"},
        "maxOutputLength": {"type": "integer"},
        "call_description": {"type": "boolean"},
        "effect": {"type": "string", "minLength": 1},
        "userOnly": {"type": "boolean"},
        "untrusted": {"type": "boolean"},
        "parameters": {
            "type": "object",
            "required": ["type", "properties"],
            "properties": {"type": {"const": "object"}, "properties": {"type": "object"}},
        },
    },
}
"""JSON Schema of one ``tools.builtin`` entry (the keys of a ``ToolDefinitionConfig``)."""


def tools_from_config(config: Mapping[str, Any] | None) -> list[ToolDefinitionConfig]:
    """The tool definitions a parsed configuration asks for.

    Raises:
        ConfigError: ``tools`` or an entry is malformed (the message names which).
    """
    import jsonschema

    tools = (config or {}).get("tools")
    if tools is None:
        return default_definitions()
    if not isinstance(tools, Mapping):
        msg = "tools: must be a mapping with a 'builtin' list"
        raise ConfigError(msg)
    if "builtin" not in tools:
        return default_definitions()
    entries = tools["builtin"]
    if not isinstance(entries, list):
        msg = "tools.builtin: must be a list of tool definitions"
        raise ConfigError(msg)
    validator = jsonschema.Draft202012Validator(ENTRY_SCHEMA)
    definitions = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        label = f"tools.builtin[{index}]"
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            label += f" ({entry['name']})"
        errors = sorted(validator.iter_errors(entry), key=lambda e: list(e.absolute_path))
        if errors:
            error = errors[0]
            field = ".".join(str(part) for part in error.absolute_path) or "entry"
            if error.validator == "required":
                field = str(error.message).split("'")[1] if "'" in error.message else field
            msg = f"{label}: {field}: {error.message}"
            raise ConfigError(msg)
        if entry["name"] in seen:
            msg = f"{label}: name: {entry['name']!r} is listed twice"
            raise ConfigError(msg)
        seen.add(entry["name"])
        try:
            jsonschema.Draft202012Validator.check_schema(entry["parameters"])
        except jsonschema.SchemaError as exc:
            msg = f"{label}: parameters: not a valid JSON Schema: {exc.message}"
            raise ConfigError(msg) from None
        definitions.append(ToolDefinitionConfig.from_mapping(entry))
    return definitions


def load_tools(path: str | Path) -> list[ToolDefinitionConfig]:
    """Read ``system_config.yaml`` and return the tool definitions it asks for.

    Raises:
        ConfigError: the file is not YAML or not a valid configuration.
    """
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses a key given twice in one mapping (YAML would keep the last)."""

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [loader.construct_object(key, deep=deep) for key, _ in node.value]
        for key in keys:
            if keys.count(key) > 1:
                msg = f"{path}: line {node.start_mark.line + 1}: key {key!r} is given twice"
                raise ConfigError(msg)
        return loader.construct_mapping(node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"{path}: cannot read the configuration: {exc}"
        raise ConfigError(msg) from None
    try:
        config = yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        msg = f"{path}: not valid YAML: {exc}"
        raise ConfigError(msg) from None
    if config is not None and not isinstance(config, Mapping):
        msg = f"{path}: the top level must be a mapping"
        raise ConfigError(msg)
    return tools_from_config(config)
