"""The Inspect provider's configuration file: keys, sizes, services, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError
from sandboxd_client.inspect import SandboxdConfig, SandboxdSandboxEnvironment
from sandboxd_client.inspect._config import load_config


def test_a_file_s_keys_and_sizes(tmp_path: Path) -> None:
    path = tmp_path / "sandboxd.yaml"
    path.write_text(
        "image: sandboxd/base:bookworm\nruntime: runsc\nmemory: 512m\ndisk: 1.5GiB\ncpus: 0.5\npids: 64\n"
        "network: allowlist\nallowed_hosts: [pypi.org, '*.github.com:443']\nenv: {A: '1'}\n"
        "secrets: {TOKEN: github}\nroot_capabilities: []\n"
    )
    config = load_config(str(path))
    assert (config.image, config.runtime, config.cpus, config.pids) == ("sandboxd/base:bookworm", "runsc", 0.5, 64)
    assert (config.memory, config.disk) == (512 * 2**20, int(1.5 * 2**30))
    assert (config.network, config.allowed_hosts) == ("allowlist", ("pypi.org", "*.github.com:443"))
    assert (config.env, config.secrets, config.root_capabilities) == ({"A": "1"}, {"TOKEN": "github"}, ())
    assert load_config(None) == SandboxdConfig()
    assert load_config(config) is config


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("imgae: x\n", "imgae"),  # a typo is not silently a default
        ("memory: lots\n", "512m"),
        ("memory: true\n", "512m"),
        ("network: open\n", "network"),
        ("runtime: kata\n", "runtime"),
        ("services: {'bad name': {}}\n", "bad name"),
        ("services: {db: {address: x}}\n", "address"),
    ],
)
def test_a_wrong_key_or_value_is_refused_naming_it(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "sandboxd.yaml"
    path.write_text(text)
    with pytest.raises(ValidationError, match=words):
        load_config(str(path))


def test_a_file_that_is_not_a_mapping_or_not_there(tmp_path: Path) -> None:
    path = tmp_path / "sandboxd.yaml"
    path.write_text("- image: x\n")
    with pytest.raises(ValueError, match="a mapping of keys"):
        load_config(str(path))
    with pytest.raises(FileNotFoundError):
        load_config(str(tmp_path / "missing.yaml"))


def test_services_take_the_top_level_s_keys_and_add_to_its_env() -> None:
    config = SandboxdConfig.model_validate(
        {
            "memory": "1g",
            "env": {"A": "top", "B": "top"},
            "labels": {"team": "x"},
            "services": {"db": {"env": {"B": "db"}, "runtime": "runsc"}, "default": {"memory": "2g"}},
        }
    )
    workspaces = config.workspaces()
    assert list(workspaces) == ["default", "db"]
    assert (workspaces["default"].memory, workspaces["default"].env) == (2 * 2**30, {"A": "top", "B": "top"})
    db = workspaces["db"]
    assert (db.memory, db.runtime, db.env, db.labels) == (2**30, "runsc", {"A": "top", "B": "db"}, {"team": "x"})


def test_a_config_survives_an_eval_log_s_round_trip() -> None:
    config = SandboxdConfig.model_validate({"memory": "1g", "services": {"db": {"cpus": 2}}})
    again = SandboxdSandboxEnvironment.config_deserialize(config.model_dump())
    assert again == config


def test_another_model_is_read_by_its_fields() -> None:
    class Other(BaseModel):
        image: str = "x:1"

    assert load_config(Other(image="y:2")).image == "y:2"
