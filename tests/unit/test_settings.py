"""Settings come from a mapping, never from import-time os.environ (no Docker)."""

from __future__ import annotations

import pytest

from sandboxd.errors import InvalidSpecError
from sandboxd.settings import Settings


class TestFromEnv:
    def test_defaults(self) -> None:
        """With an empty environment every default holds."""
        settings = Settings.from_env({})
        assert (settings.workspace_max_sessions, settings.tenant_max_sessions) == (64, 0)
        assert settings.output_memory_bytes == 256 * 1024**2
        assert settings.exec_timeout_s == 1800
        assert settings.output_buffer_bytes == 1024**2
        assert settings.kill_grace_s == 2.0
        assert settings.socket_path.endswith("sandboxd.sock")

    def test_env_values_are_parsed(self) -> None:
        """SANDBOXD_* variables are parsed by field type."""
        settings = Settings.from_env(
            {
                "SANDBOXD_WORKSPACE_MAX_SESSIONS": "8",
                "SANDBOXD_KILL_GRACE_S": "0.5",
                "SANDBOXD_DOCKER_RETRIES": "off",
                "SANDBOXD_IMAGE_ROUTE": "offline",
                "SANDBOXD_SOCKET": "/tmp/x.sock",
                "DOCKER_HOST": "tcp://127.0.0.1:2375",
            }
        )
        assert (settings.workspace_max_sessions, settings.kill_grace_s, settings.docker_retries) == (8, 0.5, False)
        assert settings.image_route == "offline"
        assert settings.socket_path == "/tmp/x.sock"
        assert settings.docker_host == "tcp://127.0.0.1:2375"

    def test_overrides_win(self) -> None:
        """Explicit overrides (CLI flags) beat the environment; None overrides are ignored."""
        settings = Settings.from_env({"SANDBOXD_INSTANCE": "env"}, instance="flag", listen_address=None)
        assert settings.instance == "flag"
        assert settings.listen_address == ""

    @pytest.mark.parametrize(
        ("name", "value"),
        [
            ("SANDBOXD_WORKSPACE_MAX_SESSIONS", "many"),
            ("SANDBOXD_DOCKER_RETRIES", "maybe"),
            ("SANDBOXD_IMAGE_ROUTE", "ftp"),
        ],
    )
    def test_bad_values_name_the_variable(self, name: str, value: str) -> None:
        """A value that does not parse is an error naming the variable."""
        with pytest.raises(InvalidSpecError, match=name):
            Settings.from_env({name: value})

    def test_a_setting_that_is_gone_is_refused_saying_what_replaced_it(self) -> None:
        """SANDBOXD_MAX_SESSIONS capped the whole daemon; a daemon told it refuses rather than ignore it."""
        with pytest.raises(InvalidSpecError, match=r"SANDBOXD_MAX_SESSIONS is no longer read: .* per workspace"):
            Settings.from_env({"SANDBOXD_MAX_SESSIONS": "276"})

    def test_xdg_runtime_dir(self) -> None:
        """Without SANDBOXD_SOCKET the socket lives under XDG_RUNTIME_DIR when set."""
        assert Settings.from_env({"XDG_RUNTIME_DIR": "/run/user/7"}).socket_path == "/run/user/7/sandboxd/sandboxd.sock"


def test_every_setting_is_in_the_readme_table() -> None:
    """Each field's environment variable has a row in the README's settings table."""
    import dataclasses
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    table = "\n".join(line for line in readme.splitlines() if line.startswith("| `"))
    documented = {
        "socket_path": "SANDBOXD_SOCKET",  # the socket path's variable is the client's name for it
    }
    missing = [
        name
        for name in (documented.get(f.name, f"SANDBOXD_{f.name.upper()}") for f in dataclasses.fields(Settings))
        if f"`{name}`" not in table
    ]
    assert missing == []


@pytest.mark.parametrize("instance", ["", "x y", "-lead", "a/b", "x" * 64, "emoji\u2603"])
def test_an_instance_the_engine_cannot_name_containers_after_is_refused(instance: str) -> None:
    with pytest.raises(InvalidSpecError, match="is not a valid instance label"):
        Settings.from_env({}, instance=instance)
