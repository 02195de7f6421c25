"""The instance's lease (``sandboxd.lease``): one container whose stdin this daemon holds open."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

import docker.errors
import structlog

from ...errors import BackendError, ImageNotFoundError, LeaseHeldError, SandboxdError
from ..base import LABEL_LEASE
from .client import LABEL_INSTANCE, DockerClient, _parse_time
from .errors import EngineErrorKind, kind_of

log = structlog.get_logger(__name__)

_LEASE_START_S = 15.0
"""A lease container created this long ago and never started is debris: its daemon died taking it."""


def _age_s(created: str) -> float:
    """Seconds since an engine timestamp (:func:`_parse_time`); unparsable counts as old."""
    try:
        moment = _parse_time(created)
    except ValueError:
        return float("inf")
    return (datetime.datetime.now(datetime.UTC) - moment).total_seconds()


class DockerLease:
    """A held lease: the attach to its container's stdin (see :meth:`DockerBackend.take_lease`)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, drop: Callable[[], Awaitable[None]]
    ) -> None:
        """Wrap the attach connection; ``drop`` removes the container."""
        self._reader, self._writer, self._drop = reader, writer, drop

    async def lost(self) -> None:
        """Return when the attach ends: the container ended (an engine restart), or the engine hung up."""
        try:
            with contextlib.suppress(ConnectionError, OSError):
                while await self._reader.read(4096):
                    pass  # the holder prints nothing; whatever comes is not the end
        finally:
            self._close()

    async def release(self) -> None:
        """Close the attach (the holder sees the end of its stdin and ends) and remove the container."""
        self._close()
        await self._drop()

    def _close(self) -> None:
        self._writer.close()
        self._writer.transport.abort()  # nothing is left to flush: the holder reads nothing of it


class LeaseMixin(DockerClient):
    """Taking and dropping the instance's lease."""

    async def take_lease(
        self,
        *,
        image: str,
        argv: Sequence[str],
        holder: str,
        wait_s: float,
        stale: Callable[[str], bool] = lambda holder: False,
        alive: Callable[[str], bool] = lambda holder: False,
    ) -> DockerLease:
        """Hold this instance's label: a container named ``sandboxd-<instance>.lease`` (see Backend).

        The engine's names are unique, so one container of that name is the whole lock. It is
        created with stdin open for one attach, attached to before it starts (as ``docker run``
        does, so no moment exists when it runs with nobody attached), and removed by the
        engine when it ends. One found running is waited for up to ``wait_s`` (a daemon just
        gone takes its lease with it within moments), unless ``stale`` says its holder is this
        very process from before (the engine kept it running): that one goes; or ``alive``
        says its holder lives on (a process seen running): that one is refused at once. One created but
        not started is another daemon's take under way, and is waited for too, unless older
        than ``_LEASE_START_S`` (its daemon died in the middle); one that ended is debris of an
        engine restart. Debris is removed.
        """
        name = f"sandboxd-{self.instance}.lease"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s

        def past_deadline() -> bool:
            return loop.time() >= deadline

        while True:
            found = await self._lease_in_the_way(name, stale, alive, past_deadline=past_deadline)
            if found == "held":
                await asyncio.sleep(0.1)
                continue
            if found == "removed":
                continue  # debris gone: looked at again
            created_id = await self._create_lease_container(name, image=image, argv=argv, holder=holder)
            if created_id is None:
                continue  # another daemon's, made just now: looked at again
            lease = await self._attach_and_start(created_id, past_deadline=past_deadline)
            if lease is not None:
                return lease

    async def _lease_in_the_way(
        self,
        name: str,
        stale: Callable[[str], bool],
        alive: Callable[[str], bool],
        *,
        past_deadline: Callable[[], bool],
    ) -> Literal["free", "held", "removed"]:
        """Look at the lease container ``name``: ``free`` when there is none.

        ``held`` while another holder's is to be waited for; ``removed`` when it was debris (it
        ended, or a take abandoned over ``_LEASE_START_S`` ago, or this very process's from
        before), which is removed.

        Raises:
            LeaseHeldError: it is held still and ``past_deadline()``, or its holder is ``alive``.
        """
        api = self._api()
        try:
            attrs = await self._call(api.inspect_container, name, idempotent=True)
        except docker.errors.NotFound:
            return "free"
        state = attrs.get("State") or {}
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        held_by = labels.get(LABEL_LEASE, "")
        starting = state.get("Status") == "created" and _age_s(attrs.get("Created", "")) < _LEASE_START_S
        if state.get("Paused") and not stale(held_by):
            # A paused holder cannot read the end of its input, so it would outlive a dead daemon
            # for ever: resumed, it goes if its daemon is gone, and holds on for a live one.
            with contextlib.suppress(BackendError, docker.errors.NotFound):
                await self._call(api.unpause, attrs["Id"])
                log.warning("lease.resumed", lease=name)
            return "held"
        if (state.get("Running") or starting or state.get("Status") == "removing") and not stale(held_by):
            if not past_deadline() and not (state.get("Running") and alive(held_by)):
                return "held"
            msg = f"the lease {name} is held"
            raise LeaseHeldError(msg, held_by)
        try:
            await self._call(api.remove_container, attrs["Id"], force=True)
        except docker.errors.NotFound:
            pass
        except BackendError:
            await asyncio.sleep(0.05)  # the engine removing it already (it ended)
        return "removed"

    async def _create_lease_container(self, name: str, *, image: str, argv: Sequence[str], holder: str) -> str | None:
        """Create the lease container, not yet started; return its id, or None when the name was just taken.

        Raises:
            ImageNotFoundError: ``image`` is not on the engine.
        """
        api = self._api()
        try:
            created = await self._call(
                api.create_container,
                image,
                name=name,
                entrypoint=list(argv),
                command=[],
                user="65534:65534",
                # Not detached: the SDK sets StdinOnce, so the engine closes its stdin when the
                # first attach (this daemon's) ends.
                stdin_open=True,
                labels={LABEL_INSTANCE: self.instance, LABEL_LEASE: holder},
                network_disabled=True,
                host_config=api.create_host_config(
                    auto_remove=True,
                    network_mode="none",
                    cap_drop=["ALL"],
                    security_opt=["no-new-privileges:true"],
                    read_only=True,
                    pids_limit=16,
                    mem_limit=32 * 1024 * 1024,
                ),
            )
        except docker.errors.ImageNotFound as exc:
            msg = f"image {image!r} is not present on the Docker engine"
            raise ImageNotFoundError(msg) from exc
        except BackendError as exc:
            if kind_of(exc) is EngineErrorKind.NAME_IN_USE:
                return None
            raise
        return str(created["Id"])

    async def _attach_and_start(self, container_id: str, *, past_deadline: Callable[[], bool]) -> DockerLease | None:
        """Attach to the lease container's stdin, then start it; None when it was removed meanwhile.

        Attached before it starts, as ``docker run`` does: no moment exists when it runs with
        nobody attached.

        Raises:
            docker.errors.NotFound, BackendError: it was removed meanwhile and ``past_deadline()``.
        """
        reader, writer, status = await self._hijack(
            f"containers/{container_id}/attach?stream=1&stdin=1&stdout=1&stderr=1", b"", "attaching"
        )
        if status not in (101, 200):
            writer.close()
            return None  # removed as debris by another daemon starting at this moment
        lease = DockerLease(reader, writer, functools.partial(self._drop_lease, container_id))
        try:
            await self._call(self._api().start, container_id)
        except (docker.errors.NotFound, BackendError):
            # Removed as debris meanwhile (NotFound, or "marked for removal"): looked at again.
            await lease.release()
            if past_deadline():
                raise
            await asyncio.sleep(0.05)
            return None
        except BaseException:
            await lease.release()
            raise
        return lease

    async def _drop_lease(self, container_id: str) -> None:
        with contextlib.suppress(docker.errors.NotFound, SandboxdError):
            await self._call(self._api().remove_container, container_id, force=True)
