"""The warm pool: started, idle workspaces kept per class, taken by a matching CreateWorkspace.

A *class* is everything fixed when a container is created: image, limits, network, runtime
and security settings. A ``CreateWorkspace`` whose spec resolves to a class's takes one of
its ready *members* instead of starting a container; what is the caller's alone (id,
tenant, env, labels, working directory, secrets, idle TTL) is applied then, so the claimed
workspace is indistinguishable from a fresh one (``PoolMembers.claim``). The pool
refills in the background after every claim, and a claim never waits for it: an empty pool
means a normal create.

Members are containers of this daemon's instance labelled ``sandboxd.pool=<class>`` with an
id no caller can name (``pool.<hex>``: workspace ids have no dot), so they are in no listing
and count toward no quota. A claim is recorded by the engine (``Backend.claim_container``),
so a claimed workspace survives a daemon restart with its id, tenant and spec. After a
restart every unclaimed member whose agent holds no session, whose class is still
configured and whose image is current is taken back; the rest are removed.

The pool follows demand. Besides the configured classes (``default``, and a pool file's), a
spec that no class serves and that callers ask for again (``DEMAND_ASKS`` creates within the
idle time) gets a *demand class* (``demand-N``) of its own, with up to ``DEMAND_CLASS_SIZE``
members, while the demand classes' members fit a memory budget (``pool_demand_memory_bytes``,
counted in their memory limits: what the engine may give them, not the few MiB an idle one
uses). A demand class nobody asks for in ``pool_demand_idle_s`` goes with its members; a
daemon that stops removes its demand members (the next run starts with no demand).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog
import yaml

from .backend.base import LABEL_POOL, ContainerInfo
from .errors import InvalidSpecError, SandboxdError
from .models import NetworkPolicy, ResourceLimits, Runtime, SecurityOptions, WorkspaceSpec

__all__ = [
    "LABEL_POOL",
    "MEMBER_PREFIX",
    "MemberFactory",
    "PoolClass",
    "PoolStatus",
    "WarmPool",
    "class_key",
    "read_pool_file",
]

log = structlog.get_logger(__name__)

MEMBER_PREFIX = "pool."
"""Members' ids start so: a workspace id has no dot, so no caller can name a member."""
CHECK_INTERVAL_S = 10.0
"""How often ready members are checked (agent still answering, image still current)."""
RETRY_AFTER_S = 10.0
"""Wait after a member failed to start before a class tries again (a missing image, an engine away)."""
CONCURRENT_STARTS = 2
"""Members started at once across all classes (the engine's work, not the daemon's, is the bound)."""
MAX_CLASSES = 32
MAX_CLASS_SIZE = 64
DEMAND_ASKS = 2
"""Creates of one spec (that no class serves) within the idle time that make a demand class."""
DEMAND_CLASS_SIZE = 2
"""Members a demand class keeps, budget allowing: a caller creating one after another (a test
suite, a benchmark) then finds one ready while the one it took is replaced."""
DEMAND_TRACKED = 64
"""Specs whose asks are remembered; the least recently asked is forgotten first."""
_CLASS_FIELDS = frozenset(
    {
        "name",
        "size",
        "image",
        "memory_bytes",
        "cpu_millis",
        "pids",
        "disk_bytes",
        "network",
        "runtime",
        "user",
        "added_capabilities",
        "root_capabilities",
        "allow_new_privileges",
        "read_only_root_filesystem",
    }
)


def _pool_network(value: object) -> NetworkPolicy:
    """A class's network: ``none`` or ``bridge`` (an allowlist workspace's network and proxy are its own)."""
    network = NetworkPolicy(str(value))
    if network is NetworkPolicy.ALLOWLIST:
        msg = "network 'allowlist' cannot be pooled: each allowlist workspace gets its own network and proxy"
        raise ValueError(msg)
    return network


def class_key(spec: WorkspaceSpec) -> tuple[Any, ...]:
    """What a resolved spec (before its user is read from the image) has in common with its class.

    Everything Docker fixes at container create, and nothing a claim applies.
    """
    return (spec.image, spec.limits, spec.network, spec.runtime, spec.security)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolClass:
    """One kind of member, and how many to keep ready."""

    name: str
    size: int
    spec: WorkspaceSpec
    """Resolved (every default filled in, the user as the request would give it)."""
    demand: bool = False
    """Made by the pool for a spec callers kept asking for, not configured."""

    @property
    def key(self) -> tuple[Any, ...]:
        """:func:`class_key` of its spec."""
        return class_key(self.spec)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolStatus:
    """A class as ``GetPool`` reports it."""

    pool_class: PoolClass
    ready: int
    starting: int
    claims: int
    misses: int


class MemberFactory(Protocol):
    """What the pool needs of workspaces: members made, checked and removed (``sandboxd.workspaces.PoolMembers``).

    The pool decides when; the factory knows how. Each call may raise what the engine raises
    (:class:`SandboxdError`), which the pool logs and outlives.
    """

    def resolve(self, spec: WorkspaceSpec) -> WorkspaceSpec:
        """A demand class's spec with every default applied, as a create's would be.

        Raises:
            InvalidSpecError: the spec is out of range.
        """
        ...

    async def create_member(self, pool_class: PoolClass, member_id: str) -> ContainerInfo:
        """Start a member of ``pool_class`` with id ``member_id``, whose agent has answered.

        Raises:
            SandboxdError: it could not be started (it is not left behind).
        """
        ...

    async def member_is_fresh(self, info: ContainerInfo, pool_class: PoolClass) -> bool:
        """Whether a member an earlier run left can be handed out (same spec, agent and image, untouched).

        Raises:
            SandboxdError: its agent cannot be reached.
        """
        ...

    def member_answers(self, member_id: str) -> bool:
        """Whether a ready member's agent link is up."""
        ...

    async def current_image_id(self, image: str) -> str | None:
        """The id of the image ``image`` names now; None if it is not on the engine."""
        ...

    async def remove_member(self, member_id: str) -> None:
        """Remove a member (nothing if it is gone)."""
        ...


def read_pool_file(path: str) -> list[tuple[str, int, WorkspaceSpec]]:
    """The classes of a pool file: a YAML list of mappings, one per class.

    Each has ``name`` and ``size``, and any of ``image``, ``memory_bytes``, ``cpu_millis``,
    ``pids``, ``disk_bytes``, ``network`` (``none``/``bridge``), ``runtime`` (``runc``/``runsc``),
    ``user``, ``added_capabilities``, ``root_capabilities``, ``allow_new_privileges``, ``read_only_root_filesystem``;
    unset ones take the daemon's defaults, as in ``CreateWorkspace``.

    Raises:
        InvalidSpecError: the file cannot be read, is not such a list, or a value is out of range.
    """
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        msg = f"pool file {path}: {exc}"
        raise InvalidSpecError(msg) from None
    if not isinstance(loaded, list) or len(loaded) > MAX_CLASSES:
        msg = f"pool file {path}: must be a list of at most {MAX_CLASSES} classes"
        raise InvalidSpecError(msg)
    classes = []
    for index, entry in enumerate(loaded):
        where = f"pool file {path}, class {index + 1}"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            msg = f"{where}: must be a mapping with a name"
            raise InvalidSpecError(msg)
        if unknown := sorted(set(entry) - _CLASS_FIELDS):
            msg = f"{where}: unknown fields {unknown}"
            raise InvalidSpecError(msg)
        size = entry.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_CLASS_SIZE:
            msg = f"{where}: size must be an integer from 0 to {MAX_CLASS_SIZE}"
            raise InvalidSpecError(msg)
        try:
            spec = _spec(entry)
        except (TypeError, ValueError) as exc:
            msg = f"{where}: {exc}"
            raise InvalidSpecError(msg) from None
        classes.append((entry["name"], size, spec))
    return classes


def _spec(entry: Mapping[str, Any]) -> WorkspaceSpec:
    def number(name: str) -> int:
        value = entry.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            msg = f"{name} must be an integer"
            raise TypeError(msg)
        return value

    def names(name: str) -> tuple[str, ...]:
        value = entry.get(name, [])
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            msg = f"{name} must be a list of names"
            raise TypeError(msg)
        return tuple(value)

    return WorkspaceSpec(
        image=str(entry.get("image", "")),
        limits=ResourceLimits(
            memory_bytes=number("memory_bytes"),
            cpu_millis=number("cpu_millis"),
            pids=number("pids"),
            disk_bytes=number("disk_bytes"),
        ),
        network=_pool_network(entry.get("network", "none")),
        runtime=Runtime(entry["runtime"]) if entry.get("runtime") else None,
        idle_ttl_s=0.0,
        security=SecurityOptions(
            added_capabilities=names("added_capabilities"),
            root_capabilities=names("root_capabilities"),
            allow_new_privileges=bool(entry.get("allow_new_privileges", False)),
            user=str(entry.get("user", "")),
            read_only_root_filesystem=bool(entry.get("read_only_root_filesystem", False)),
        ),
    )


class WarmPool:
    """Keeps each class's members ready, hands them out, and starts new ones in the background.

    Args:
        members: makes, checks and removes members; resolves the specs of demand classes.
        classes: the classes to keep; names are unique.
        demand_memory_bytes: the demand classes' budget, in bytes of memory limits; 0 makes none.
        demand_idle_s: a demand class not asked for in this long, in seconds, goes.
        keep_on_close: whether the configured classes' ready members stay when the pool closes.
    """

    def __init__(
        self,
        members: MemberFactory,
        classes: Sequence[PoolClass],
        *,
        demand_memory_bytes: int = 0,
        demand_idle_s: float = 600.0,
        keep_on_close: bool = True,
    ) -> None:
        """Prepare the pool; :meth:`start` begins filling it."""
        self.members = members
        self.keep_on_close = keep_on_close
        self.demand_memory_bytes = demand_memory_bytes
        self.demand_idle_s = demand_idle_s
        self._asks: collections.OrderedDict[tuple[Any, ...], collections.deque[float]] = collections.OrderedDict()
        self._asked_at: dict[str, float] = {}
        """Demand classes: when each was last asked for."""
        self._demand_serial = 0
        self.classes = {c.name: c for c in classes if c.size > 0}
        self._by_key = {c.key: c for c in self.classes.values()}
        self._ready: dict[str, collections.deque[ContainerInfo]] = {name: collections.deque() for name in self.classes}
        self._starting: collections.Counter[str] = collections.Counter()
        self._claims: collections.Counter[str] = collections.Counter()
        self._misses: collections.Counter[str] = collections.Counter()
        self._failed_at: dict[str, float] = {}
        self._gate = asyncio.Semaphore(CONCURRENT_STARTS)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._starts: set[asyncio.Task[None]] = set()
        # Removals run on their own, so that a check or a start cancelled at close cannot
        # leave a member it had taken off its class half removed; close waits for them.
        self._removals: set[asyncio.Task[None]] = set()

    def match(self, spec: WorkspaceSpec) -> PoolClass | None:
        """The class a resolved spec belongs to, if any (never an allowlist's: no class is one).

        A spec that none serves is counted as asked for, and may make a demand class for the
        creates that follow.
        """
        if spec.network is NetworkPolicy.ALLOWLIST:
            return None
        now = time.monotonic()
        found = self._by_key.get(class_key(spec))
        if found is None:
            self._ask(spec, now)
        elif found.demand:
            self._asked_at[found.name] = now
        return found

    def _demand_bytes(self) -> int:
        return sum(c.size * c.spec.limits.memory_bytes for c in self.classes.values() if c.demand)

    def _ask(self, spec: WorkspaceSpec, now: float) -> None:
        """Count an ask for a spec no class serves; at ``DEMAND_ASKS``, make its demand class if it fits."""
        if self.demand_memory_bytes <= 0:
            return
        key = class_key(spec)
        asks = self._asks.setdefault(key, collections.deque(maxlen=DEMAND_ASKS))
        self._asks.move_to_end(key)
        asks.append(now)
        while len(self._asks) > DEMAND_TRACKED:
            self._asks.popitem(last=False)
        if len(asks) < DEMAND_ASKS or now - asks[0] > self.demand_idle_s:
            return
        cost = max(spec.limits.memory_bytes, 1)
        size = min(DEMAND_CLASS_SIZE, (self.demand_memory_bytes - self._demand_bytes()) // cost)
        if size < 1:
            log.info("pool.demand_over_budget", image=spec.image, runtime=spec.runtime, memory_bytes=cost)
            return
        # The class's spec holds what Docker fixes at create, and nothing of this caller's.
        asked = WorkspaceSpec(
            image=spec.image,
            limits=spec.limits,
            network=spec.network,
            runtime=spec.runtime,
            security=spec.security,
            idle_ttl_s=0.0,
        )
        try:
            resolved = self.members.resolve(asked)
        except SandboxdError:
            return
        if class_key(resolved) != key:
            return  # resolving it again would make it another class: nothing to keep warm
        del self._asks[key]
        self._demand_serial += 1
        pool_class = PoolClass(name=f"demand-{self._demand_serial}", size=size, spec=resolved, demand=True)
        self.classes[pool_class.name] = pool_class
        self._by_key[key] = pool_class
        self._ready[pool_class.name] = collections.deque()
        self._asked_at[pool_class.name] = now
        log.info(
            "pool.demand_class_added",
            pool_class=pool_class.name,
            size=size,
            image=resolved.image,
            runtime=resolved.runtime,
            memory_bytes=resolved.limits.memory_bytes,
        )
        self.start()
        self._wake.set()

    async def _let_idle_demand_go(self) -> None:
        """Remove the demand classes nobody asked for in ``demand_idle_s``, and their members."""
        now = time.monotonic()
        for name, asked_at in list(self._asked_at.items()):
            if now - asked_at > self.demand_idle_s:
                self._remove_class(name)

    def _remove_class(self, name: str) -> None:
        pool_class = self.classes.pop(name)
        self._asked_at.pop(name, None)
        if self._by_key.get(pool_class.key) is pool_class:
            del self._by_key[pool_class.key]
        ready = self._ready.pop(name)
        log.info("pool.class_removed", pool_class=name, demand=pool_class.demand, members=len(ready))
        for info in ready:
            self._remove_member(info.workspace_id)

    def _remove_member(self, member_id: str) -> None:
        async def remove() -> None:
            try:
                await self.members.remove_member(member_id)
            except SandboxdError as exc:
                log.warning("pool.member_not_removed", member=member_id, error=exc.message)

        task = asyncio.create_task(remove(), name=f"pool-remove-{member_id}")
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    def take(self, pool_class: PoolClass) -> ContainerInfo | None:
        """A ready member of the class, or None (counted as a miss); either way a refill is due."""
        ready = self._ready.get(pool_class.name)
        self._wake.set()
        if not ready:
            self._misses[pool_class.name] += 1
            return None
        self._claims[pool_class.name] += 1
        return ready.popleft()

    def status(self) -> list[PoolStatus]:
        """Every class, with what it holds now and its counts since the daemon started."""
        return [
            PoolStatus(
                pool_class=c,
                ready=len(self._ready[c.name]),
                starting=self._starting[c.name],
                claims=self._claims[c.name],
                misses=self._misses[c.name],
            )
            for c in self.classes.values()
        ]

    async def adopt(self, members: Sequence[ContainerInfo]) -> None:
        """Take back the members an earlier run left, or remove them.

        A member is kept if its class is configured with the same spec, it runs the current
        agent, and its agent holds no session (nothing ever ran in it).
        """
        kept = 0
        for info in members:
            pool_class = self.classes.get(info.labels.get(LABEL_POOL, ""))
            try:
                if (
                    pool_class is not None
                    and len(self._ready[pool_class.name]) < pool_class.size
                    and await self.members.member_is_fresh(info, pool_class)
                ):
                    self._ready[pool_class.name].append(info)
                    kept += 1
                    continue
            except SandboxdError as exc:
                log.info("pool.member_unusable", member=info.workspace_id, error=exc.message)
            await self.members.remove_member(info.workspace_id)
        if members:
            log.info("pool.adopted", kept=kept, removed=len(members) - kept)

    def start(self) -> None:
        """Begin keeping the classes full, for as long as the daemon runs."""
        if (self.classes or self.demand_memory_bytes > 0) and self._task is None:
            self._task = asyncio.create_task(self._run(), name="warm-pool")

    async def close(self) -> None:
        """Stop refilling; members being started are finished or removed.

        The configured classes' ready members stay for the next run unless ``keep_on_close`` is
        false; the demand classes' go.
        """
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._starts):
            task.cancel()
        if self._starts:
            await asyncio.gather(*self._starts, return_exceptions=True)
        for name in [c.name for c in self.classes.values() if c.demand or not self.keep_on_close]:
            self._remove_class(name)
        if self._removals:
            await asyncio.gather(*self._removals, return_exceptions=True)

    async def _run(self) -> None:
        checked = time.monotonic()
        while True:
            self._fill()
            try:
                async with asyncio.timeout(max(0.0, checked + CHECK_INTERVAL_S - time.monotonic())):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if time.monotonic() - checked >= CHECK_INTERVAL_S:
                checked = time.monotonic()
                try:
                    await self._let_idle_demand_go()
                    await self._check()
                except Exception:  # the pool must outlive any one failure (an engine away)
                    log.exception("pool.check_failed")

    def _fill(self) -> None:
        for pool_class in self.classes.values():
            failed = self._failed_at.get(pool_class.name)
            if failed is not None and time.monotonic() - failed < RETRY_AFTER_S:
                continue
            missing = pool_class.size - len(self._ready[pool_class.name]) - self._starting[pool_class.name]
            for _ in range(max(0, missing)):
                self._starting[pool_class.name] += 1
                task = asyncio.create_task(self._start_member(pool_class), name=f"pool-{pool_class.name}")
                self._starts.add(task)
                task.add_done_callback(self._starts.discard)

    async def _start_member(self, pool_class: PoolClass) -> None:
        member_id = f"{MEMBER_PREFIX}{secrets.token_hex(6)}"
        try:
            async with self._gate:
                began = time.monotonic()
                info = await self.members.create_member(pool_class, member_id)
        except SandboxdError as exc:
            self._failed_at[pool_class.name] = time.monotonic()
            log.warning("pool.member_failed", pool_class=pool_class.name, error=exc.message)
            asyncio.get_running_loop().call_later(RETRY_AFTER_S, self._wake.set)
            return
        finally:
            self._starting[pool_class.name] -= 1
        self._failed_at.pop(pool_class.name, None)
        if self.classes.get(pool_class.name) is not pool_class:
            self._remove_member(member_id)  # a demand class let go meanwhile
            return
        self._ready[pool_class.name].append(info)
        log.info(
            "pool.member_ready",
            pool_class=pool_class.name,
            member=member_id,
            start_s=round(time.monotonic() - began, 3),
            ready=len(self._ready[pool_class.name]),
        )

    async def _check(self) -> None:
        """Drop members whose agent stopped answering or whose image was rebuilt since."""
        for pool_class in list(self.classes.values()):
            ready = self._ready.get(pool_class.name, collections.deque())
            current = await self.members.current_image_id(pool_class.spec.image)
            for info in list(ready):
                fresh = current is not None and info.image_id == current
                if (fresh and self.members.member_answers(info.workspace_id)) or info not in ready:
                    continue  # fine, or claimed while the image was looked up
                ready.remove(info)
                log.info("pool.member_dropped", member=info.workspace_id, stale_image=not fresh)
                await self.members.remove_member(info.workspace_id)
        self._wake.set()
