"""Inspect AI's sandbox provider for sandboxd: ``sandbox="sandboxd"`` in a task.

Installed with ``pip install 'sandboxd-client[inspect]'``, which registers the ``sandboxd`` sandbox
type through Inspect's ``inspect_ai`` entry point. A task says ``sandbox="sandboxd"`` (the daemon's
defaults, or a ``sandboxd.yaml`` beside the task) or ``sandbox=("sandboxd", "config.yaml")``; the
file's keys are :class:`SandboxdConfig`'s.
"""

from ._config import DEFAULT_ROOT_CAPABILITIES, SandboxdConfig, ServiceConfig
from ._environment import SandboxdSandboxEnvironment

__all__ = ["DEFAULT_ROOT_CAPABILITIES", "SandboxdConfig", "SandboxdSandboxEnvironment", "ServiceConfig"]
