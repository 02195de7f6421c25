"""DockerBackend: the Docker SDK behind the :class:`~sandboxd.backend.base.Backend` seam.

Split the way docker-py splits its API client: a shared client, one table of errors, and
one module per resource, each a mixin that :class:`DockerBackend` composes:

- ``client``: the engine connection, blocking calls off the loop, retries;
- ``errors``: the one table that classifies the engine's errors, and their translation;
- ``claims``: what a workspace's container is called, and pool members claimed as workspaces;
- ``images``: images, the engine's facts, the agent volume;
- ``snapshots``: a container's files made an image (``layers``: its one layer, written on the
  host), and a fork's /workspace from one;
- ``checkpoints``: a container's processes saved by its runtime, and containers restored from them;
- ``containers``: workspace containers and their volumes, from create to remove;
- ``exec``: execs and the raw streams that carry them, and direct sockets;
- ``networks``: a workspace's own network and its egress proxy;
- ``lease``: the instance's lease.

Every ``docker.errors`` / ``requests`` failure is translated in this package into a
``SandboxdError`` (``raise ... from exc``); nothing above it sees the SDK.
"""

from __future__ import annotations

from .claims import LABEL_MEMBER
from .client import API_VERSION, LABEL_INSTANCE, LABEL_MANAGED, LABEL_WORKSPACE
from .containers import ContainersMixin
from .exec import EXEC_RUN_TIMEOUT_S, DockerExecStream, ExecMixin, UnixSocketStream
from .lease import DockerLease, LeaseMixin
from .networks import NetworksMixin

__all__ = [
    "API_VERSION",
    "EXEC_RUN_TIMEOUT_S",
    "LABEL_INSTANCE",
    "LABEL_MANAGED",
    "LABEL_MEMBER",
    "LABEL_WORKSPACE",
    "DockerBackend",
    "DockerExecStream",
    "DockerLease",
    "UnixSocketStream",
]


class DockerBackend(ContainersMixin, ExecMixin, NetworksMixin, LeaseMixin):
    """Workspaces as Docker containers on one engine.

    Args:
        docker_host: engine address, ``unix:///path`` or ``tcp://host:port``.
        instance: value of the ``sandboxd.instance`` label on everything created.
        timeout_s: timeout of each blocking API call, in seconds.
        retries: retry idempotent calls on transient failures (bounded, jittered).
    """
