"""The provider's configuration: what a task's ``sandbox=("sandboxd", "sandboxd.yaml")`` file says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["DEFAULT_ROOT_CAPABILITIES", "SandboxdConfig", "ServiceConfig", "load_config"]

DEFAULT_ROOT_CAPABILITIES = (
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "NET_BIND_SERVICE",
    "SETGID",
    "SETUID",
    "SYS_CHROOT",
)
"""What ``exec(user="root")`` may do by default: Docker's default set for a container's root less
MKNOD, NET_RAW, SETFCAP and SETPCAP, enough to add users and install packages. The workspace's own
(non-root) user gets none of them."""

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _bytes(value: Any) -> int:
    """A size as bytes: an integer, or text such as ``512m``, ``2G``, ``1.5GiB``."""
    if isinstance(value, bool):
        msg = f"a size must be a number of bytes or text such as 512m, got {value!r}"
        raise ValueError(msg)  # noqa: TRY004 (pydantic reports a validator's ValueError as the key's error)
    if isinstance(value, int):
        return value
    match = _SIZE_RE.fullmatch(str(value))
    if match is None:
        msg = f"a size must be a number of bytes or text such as 512m, got {value!r}"
        raise ValueError(msg)
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


class ServiceConfig(BaseModel):
    """One workspace of a sample: every key maps to a field of sandboxd's WorkspaceSpec.

    Unset keys take the daemon's defaults (a named service takes the top level's first).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str | None = None
    """Image (default: the daemon's workspace image)."""
    runtime: Literal["runc", "runsc"] | None = None
    """OCI runtime; ``runsc`` is gVisor (default: the daemon's)."""
    memory: int | None = None
    """Memory limit in bytes, or text such as ``512m``."""
    cpus: float | None = None
    """CPU quota in CPUs (``0.5``)."""
    pids: int | None = None
    """Process limit."""
    disk: int | None = None
    """Size cap of /workspace in bytes, or text such as ``1g`` (a tmpfs)."""
    network: Literal["none", "bridge", "allowlist"] | None = None
    """Network policy (default ``none``)."""
    allowed_hosts: tuple[str, ...] | None = None
    """With ``network: allowlist``, what it may reach: ``HOST[:PORT[,PORT...]]``, ``*.domain``, IP, CIDR."""
    env: dict[str, str] | None = None
    """Environment of every command."""
    secrets: dict[str, str] | None = None
    """Environment variables whose values are the daemon's secrets: ``{VAR: SECRET_NAME}``, masked in output."""
    user: str | None = None
    """User commands and file operations run as (default: the image's non-root user)."""
    root_capabilities: tuple[str, ...] | None = None
    """What ``exec(user="root")`` keeps (default :data:`DEFAULT_ROOT_CAPABILITIES`; ``[]`` for none)."""
    added_capabilities: tuple[str, ...] | None = None
    """Capabilities every command keeps, whatever its user (default none)."""
    working_dir: str | None = None
    """The sample's working directory: where relative paths resolve (default /workspace)."""
    read_only: bool | None = None
    """Root filesystem read-only (/workspace and /tmp stay writable)."""
    idle_ttl: float | None = None
    """Seconds idle before the daemon removes the workspace, a net for a killed eval (0: never)."""
    labels: dict[str, str] | None = None
    """Labels of the workspace (``inspect.*`` ones are the provider's)."""

    @field_validator("memory", "disk", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return None if value is None else _bytes(value)

    def over(self, base: ServiceConfig) -> ServiceConfig:
        """This service's keys, each unset one ``base``'s; ``env``, ``secrets`` and ``labels`` add to ``base``'s."""
        theirs = base.model_dump(exclude_none=True)
        mine = self.model_dump(exclude_unset=True, exclude_none=True)
        for key in ("env", "secrets", "labels"):
            if key in mine and key in theirs:
                mine[key] = {**theirs[key], **mine[key]}
        return ServiceConfig.model_validate({**theirs, **mine})


class SandboxdConfig(ServiceConfig):
    """A task's sandboxd configuration: the ``default`` workspace's keys, and named services.

    ``services`` maps each further workspace's name to its own keys; each takes the top level's
    values for the keys it leaves unset, and its ``env``, ``secrets`` and ``labels`` add to the
    top level's. A sample gets one workspace per service and ``default``
    (named ``default``, the first Inspect hands out).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str | None = None
    """The daemon: ``unix:/path`` or ``HOST:PORT`` (TLS) (default: ``SANDBOXD_ADDRESS`` or the default socket)."""
    services: dict[str, ServiceConfig] = Field(default_factory=dict)

    @field_validator("services")
    @classmethod
    def _names(cls, services: dict[str, ServiceConfig]) -> dict[str, ServiceConfig]:
        for name in services:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", name):
                msg = f"service name {name!r} must be 1-63 letters, digits, '.', '_' or '-'"
                raise ValueError(msg)
        return services

    def workspaces(self) -> dict[str, ServiceConfig]:
        """Each workspace of a sample by name, ``default`` first."""
        base = ServiceConfig.model_validate(self.model_dump(exclude={"address", "services"}, exclude_none=True))
        named = {name: service.over(base) for name, service in self.services.items()}
        return {"default": named.pop("default", base), **named}


def load_config(config: BaseModel | str | None) -> SandboxdConfig:
    """The configuration Inspect handed over: none, a YAML file's path, or a model.

    Raises:
        FileNotFoundError: the file is not there.
        ValueError: the file or model is not a sandboxd configuration (its message says which key).
    """
    if config is None:
        return SandboxdConfig()
    if isinstance(config, SandboxdConfig):
        return config
    if isinstance(config, BaseModel):
        return SandboxdConfig.model_validate(config.model_dump(exclude_unset=True))
    path = Path(config)
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        msg = f"{path}: a sandboxd configuration is a mapping of keys (image, memory, network, ...)"
        raise ValueError(msg)  # noqa: TRY004 (the file's content is wrong, not the caller's argument)
    return SandboxdConfig.model_validate(data)
