"""E2B's control plane (its REST API, the subset the ``e2b`` SDK 2.x calls), on sandboxd's workspaces.

A sandbox is a workspace; its id is the workspace id. What E2B names maps as follows:

- ``templateID``: ``base`` is E2B's base template (``images/e2b``: the default image with E2B's
  user ``user``, working in ``/home/user``); the name of a snapshot of the tenant's starts from
  that snapshot; anything else is an image reference.
- ``metadata``: workspace labels ``e2b.metadata/KEY`` (keys of letters, digits, ``.``, ``_``,
  ``/`` and ``-``), so listing filters on them in the daemon.
- ``envVars``: the workspace's environment.
- ``timeout`` (seconds, default 300) with ``autoPause``: the workspace's lifetime and what its end
  does (delete, or pause).
- ``allow_internet_access: false``: no network.

Errors carry E2B's shape, ``{"code": HTTP_STATUS, "message": TEXT}``, and ``Should-Retry:
false`` where the SDK would otherwise retry what cannot succeed.

Source of the shapes: E2B's ``spec/openapi.yml`` and the ``e2b`` SDK 2.63.0's generated client.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import os
import re
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc
import structlog
from google.protobuf import duration_pb2
from sandboxd_protocol.v1 import network_service_pb2 as npb
from sandboxd_protocol.v1 import workspace_service_pb2 as wpb
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .gateway import Caller, Gateway, http_status

__all__ = ["ENVD_VERSION", "METADATA_PREFIX", "Refused", "control_routes", "json_body", "rest_endpoint"]

# The envd version the SDK is told: 0.6.4 turns on every code path of the SDK 2.63.0 this plane
# serves (e2b/envd/versions.py); below 0.4.0 it would send a user of its own, "user".
ENVD_VERSION = "0.6.4"
METADATA_PREFIX = "e2b.metadata/"
TEMPLATE_LABEL = "e2b.template"
DEFAULT_TEMPLATE = "base"
E2B_HOME = "/home/user"
DEFAULT_TIMEOUT_S = 300
_MAX_TIMEOUT_S = 24 * 3600
_METADATA_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,114}$")
_CLIENT_ID = "sandboxd"
_MAX_PAGE = 1000
_MAX_LISTED = 10_000

log = structlog.get_logger(__name__)


class Refused(Exception):
    """A request this plane answers with an E2B error (status and words) instead of a result."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@contextlib.contextmanager
def _missing_is_404(what: str) -> Iterator[None]:
    """NOT_FOUND (or an id that cannot be one) as E2B's 404 for ``what``."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
            raise Refused(404, f"{what} was not found") from None
        raise


def error_response(status: int, message: str) -> JSONResponse:
    """E2B's error body; ``Should-Retry: false`` stops the SDK retrying a 429/503 that will not pass."""
    return JSONResponse({"code": status, "message": message}, status_code=status, headers={"Should-Retry": "false"})


Handler = Callable[[Request, Gateway, Caller], Awaitable[Response]]


def rest_endpoint(handler: Handler, gateway: Gateway) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` as a route's endpoint: the caller from ``X-API-Key``; refusals and RPC errors in E2B's shape."""

    async def endpoint(request: Request) -> Response:
        caller = Caller(token=(request.headers.get("x-api-key") or "").strip())
        try:
            return await handler(request, gateway, caller)
        except Refused as exc:
            return error_response(exc.status, exc.message)
        except grpc.aio.AioRpcError as exc:
            return error_response(http_status(exc), exc.details() or exc.code().name.lower())
        except Exception:
            log.exception("e2b.request_failed", path=request.url.path, method=request.method)
            return error_response(500, "the daemon failed to serve this request; its log says why")

    return endpoint


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object ({} when empty); 400 when it is not one."""
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise Refused(400, "the request body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "the request body must be a JSON object")
    return body


def _timeout(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _MAX_TIMEOUT_S:
        raise Refused(400, f"timeout must be whole seconds, 1 to {_MAX_TIMEOUT_S}; got {value!r}")
    return value


def _strings(value: object, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise Refused(400, f"{field} must be an object of strings")
    return value


def metadata_labels(metadata: dict[str, str]) -> dict[str, str]:
    """Workspace labels for E2B metadata (``e2b.metadata/KEY``).

    Raises:
        Refused: 400 for a key a label cannot carry.
    """
    for key in metadata:
        if not _METADATA_KEY_RE.fullmatch(key):
            raise Refused(
                400, f"metadata key {key[:64]!r} is not supported: letters, digits, '.', '_', '/', '-'; at most 115"
            )
    return {METADATA_PREFIX + key: value for key, value in metadata.items()}


_ALL_TRAFFIC = frozenset({"0.0.0.0/0", "::/0"})
_NETWORK_FIELDS = frozenset({"allowOut", "denyOut", "allowPublicTraffic", "dnsServers"})


def egress_of(network: object, *, internet_default: bool) -> tuple[wpb.NetworkPolicy, list[wpb.EgressRule]]:
    """E2B's ``network`` options as sandboxd's policy and allowlist, or 400 for what it cannot express.

    E2B allows all egress unless ``denyOut`` says otherwise, and ``allowOut`` wins over it. Denying
    everything (``0.0.0.0/0``) with ``allowOut`` entries is sandboxd's ALLOWLIST of those entries
    (host names, ``*.`` patterns, IP addresses and CIDR blocks; ports 80 and 443, through its egress
    proxy); denying everything alone is no network; nothing denied is the internet (Docker's
    bridge) unless ``allow_internet_access`` is false. Denying only some destinations, and E2B's
    header rules, SOCKS proxy, HTTPS ports and host masks, cannot be expressed: 400, never
    accepted and then not applied.
    """
    if not isinstance(network, dict):
        raise Refused(400, "network must be an object")
    unknown = sorted(k for k, v in network.items() if k not in _NETWORK_FIELDS and v not in (None, [], {}, ""))
    if unknown:
        raise Refused(400, f"network options {', '.join(unknown)} are not served by sandboxd (egress rules only)")
    if network.get("allowPublicTraffic") is False:
        raise Refused(400, "allowPublicTraffic false: sandboxd does not route public traffic to sandboxes at all")
    allow, deny = network.get("allowOut") or [], network.get("denyOut") or []
    if (
        not all(isinstance(x, str) for x in [*allow, *deny])
        or not isinstance(allow, list)
        or not isinstance(deny, list)
    ):
        raise Refused(400, "allowOut and denyOut must be lists of strings")
    denies_all = bool(_ALL_TRAFFIC & set(deny)) or not internet_default
    if deny and not _ALL_TRAFFIC & set(deny):
        raise Refused(
            400,
            "denyOut of some destinations only cannot be expressed by sandboxd's allowlist: deny 0.0.0.0/0 "
            "and list what is allowed in allowOut",
        )
    if not denies_all:
        return wpb.NETWORK_POLICY_BRIDGE, []
    if not allow:
        return wpb.NETWORK_POLICY_NONE, []
    return wpb.NETWORK_POLICY_ALLOWLIST, [wpb.EgressRule(host=host) for host in allow]


def _sandbox(workspace: wpb.Workspace, caller: Caller) -> dict[str, Any]:
    """The ``Sandbox`` body of create, connect and fork."""
    return {
        "templateID": workspace.spec.labels.get(TEMPLATE_LABEL) or workspace.spec.image,
        "sandboxID": workspace.workspace_id,
        "clientID": _CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        # The SDK gives envd whatever it is handed here (X-Access-Token): the caller's own key,
        # which is the sandboxd token the data plane then calls with.
        "envdAccessToken": caller.token or None,
        "trafficAccessToken": None,
        "domain": None,
    }


def _detail(workspace: wpb.Workspace) -> dict[str, Any]:
    """The ``SandboxDetail`` / ``ListedSandbox`` body."""
    spec = workspace.spec
    started = workspace.create_time.ToDatetime(tzinfo=datetime.UTC)
    # A paused sandbox, or one with no lifetime, has no end: E2B's API still wants one.
    expires = (
        workspace.expire_time.ToDatetime(tzinfo=datetime.UTC)
        if workspace.HasField("expire_time")
        else datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3650)
    )
    cpus = spec.limits.cpu_millis // 1000 if spec.limits.cpu_millis else os.cpu_count() or 1
    return {
        "templateID": spec.labels.get(TEMPLATE_LABEL) or spec.image,
        "sandboxID": workspace.workspace_id,
        "clientID": _CLIENT_ID,
        "startedAt": started.isoformat().replace("+00:00", "Z"),
        "endAt": expires.isoformat().replace("+00:00", "Z"),
        "envdVersion": ENVD_VERSION,
        "cpuCount": max(1, cpus),
        "memoryMB": spec.limits.memory_bytes // (1024 * 1024),
        "diskSizeMB": spec.limits.disk_bytes // (1024 * 1024),
        "state": "paused" if workspace.state == wpb.WORKSPACE_STATE_PAUSED else "running",
        "metadata": {
            key.removeprefix(METADATA_PREFIX): value
            for key, value in spec.labels.items()
            if key.startswith(METADATA_PREFIX)
        },
        "allowInternetAccess": spec.network != wpb.NETWORK_POLICY_NONE,
        "lifecycle": {
            "autoResume": False,
            "onTimeout": "pause" if spec.idle_action == wpb.IDLE_ACTION_PAUSE else "kill",
        },
    }


async def _source(request: Request, gateway: Gateway, caller: Caller, template: str) -> tuple[str, str, str]:
    """``(image, working_dir, snapshot)`` for a ``templateID``: E2B's base, a snapshot, or an image.

    ``base`` is E2B's base template (``images/e2b``: user ``user``, working in ``/home/user``).
    """
    if template == DEFAULT_TEMPLATE:
        return request.app.state.base_image, E2B_HOME, ""
    try:
        await gateway.workspaces.GetSnapshot(wpb.GetSnapshotRequest(name=template), metadata=caller.metadata())
    except grpc.aio.AioRpcError as exc:
        if exc.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
            raise
        return template, "", ""
    return "", "", template


async def create(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``POST /v2/sandboxes`` (and ``/sandboxes``): a new workspace, 201 and its ``Sandbox``."""
    body = await json_body(request)
    template = body.get("templateID") or DEFAULT_TEMPLATE
    if not isinstance(template, str):
        raise Refused(400, "templateID must be a string")
    timeout = _timeout(body["timeout"]) if body.get("timeout") is not None else DEFAULT_TIMEOUT_S
    image, working_dir, snapshot = await _source(request, gateway, caller, template)
    spec = wpb.WorkspaceSpec(
        image=image,
        working_dir=working_dir,
        env=_strings(body.get("envVars"), "envVars"),
        labels={**metadata_labels(_strings(body.get("metadata"), "metadata")), TEMPLATE_LABEL: template[:1024]},
        idle_action=wpb.IDLE_ACTION_PAUSE if body.get("autoPause") is True else wpb.IDLE_ACTION_DELETE,
        lifetime=duration_pb2.Duration(seconds=timeout),
    )
    # E2B resumes a paused sandbox on traffic only when asked to (autoResume.enabled).
    auto_resume = body.get("autoResume")
    spec.auto_resume = isinstance(auto_resume, dict) and auto_resume.get("enabled") is True
    # sandboxd's default is no network, E2B's is the internet: asking for it gets Docker's bridge.
    internet = body.get("allow_internet_access")
    if internet is True:
        spec.network = wpb.NETWORK_POLICY_BRIDGE
    elif internet is False:
        spec.network = wpb.NETWORK_POLICY_NONE
    if body.get("network") is not None:
        policy, rules = egress_of(body["network"], internet_default=internet is not False)
        spec.network = policy
        spec.allowed_hosts.extend(rules)
    idempotency = request.headers.get("idempotency-key", "")
    try:
        created = await gateway.workspaces.CreateWorkspace(
            wpb.CreateWorkspaceRequest(spec=spec, from_snapshot=snapshot, request_id=idempotency[:64]),
            metadata=caller.metadata(),
        )
    except grpc.aio.AioRpcError as exc:
        if template != DEFAULT_TEMPLATE or exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        raise Refused(
            404, f"E2B's base template image {image} is not built: run `sandboxd images build` ({exc.details()})"
        ) from None
    return JSONResponse(_sandbox(created.workspace, caller), status_code=201)


async def _get(gateway: Gateway, caller: Caller, sandbox_id: str) -> wpb.Workspace:
    with _missing_is_404(f"sandbox {sandbox_id}"):
        return await gateway.workspace(sandbox_id, caller)


async def get_info(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``GET /sandboxes/{id}``: 200 and its ``SandboxDetail``, or 404."""
    return JSONResponse(_detail(await _get(gateway, caller, request.path_params["sandbox_id"])))


def _metadata_filter(query: str) -> dict[str, str]:
    # The SDK quotes each key and value, joins them as a query string, and that string is quoted
    # again as the parameter's value (e2b/sandbox_sync/paginator.py): unquote twice.
    return {
        METADATA_PREFIX + urllib.parse.unquote(key): urllib.parse.unquote(value)
        for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True)
    }


def _page_token(workspace: wpb.Workspace) -> str:
    where = json.dumps([workspace.create_time.ToNanoseconds(), workspace.workspace_id]).encode()
    return base64.urlsafe_b64encode(where).decode()


def _after(token: str) -> tuple[int, str]:
    try:
        nanos, workspace_id = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError):
        raise Refused(400, "nextToken is not one this API gave") from None
    if not isinstance(nanos, int) or not isinstance(workspace_id, str):
        raise Refused(400, "nextToken is not one this API gave")
    return nanos, workspace_id


async def list_sandboxes(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``GET /v2/sandboxes``: the tenant's running and paused workspaces, one page at a time.

    As E2B: newest first (``order=asc``: oldest first), ``state`` and ``startedAfter`` filter
    before the page is cut, and ``X-Next-Token`` names where the next page starts (the last
    sandbox given: one made or removed meanwhile moves no other).
    """
    query = request.query_params
    states = {s for s in query.get("state", "running,paused").split(",") if s}
    if not states <= {"running", "paused"}:
        raise Refused(400, f"state must be running and/or paused, got {query.get('state')!r}")
    try:
        limit = int(query.get("limit", "100"))
    except ValueError:
        raise Refused(400, "limit must be a whole number") from None
    if not 1 <= limit <= _MAX_PAGE:
        raise Refused(400, f"limit must be 1 to {_MAX_PAGE}")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise Refused(400, f"order must be asc or desc, got {order!r}")
    started_after = None
    if query.get("startedAfter"):
        try:
            started_after = datetime.datetime.fromisoformat(query["startedAfter"])
        except ValueError:
            raise Refused(400, "startedAfter is not an ISO 8601 time") from None
        if started_after.tzinfo is None:
            started_after = started_after.replace(tzinfo=datetime.UTC)
    selector = _metadata_filter(query.get("metadata", ""))
    if query.get("template"):
        selector[TEMPLATE_LABEL] = query["template"]
    wanted = {{"running": wpb.WORKSPACE_STATE_RUNNING, "paused": wpb.WORKSPACE_STATE_PAUSED}[s] for s in states}
    found: list[wpb.Workspace] = []
    token = ""
    while True:  # the tenant's workspaces are bounded by its quota; the listing is, in all
        response = await gateway.workspaces.ListWorkspaces(
            wpb.ListWorkspacesRequest(label_selector=selector, page_size=_MAX_PAGE, page_token=token),
            metadata=caller.metadata(),
        )
        found += [
            w
            for w in response.workspaces
            if w.state in wanted
            and (started_after is None or w.create_time.ToDatetime(tzinfo=datetime.UTC) >= started_after)
        ]
        token = response.next_page_token
        if not token or len(found) > _MAX_LISTED:
            break

    def key(workspace: wpb.Workspace) -> tuple[int, str]:
        return workspace.create_time.ToNanoseconds(), workspace.workspace_id

    newest_first = order == "desc"
    found.sort(key=key, reverse=newest_first)
    if query.get("nextToken"):
        after = _after(query["nextToken"])
        found = [w for w in found if (key(w) < after if newest_first else key(w) > after)]
    page = found[:limit]
    headers = {"X-Next-Token": _page_token(page[-1])} if len(found) > limit else {}
    return JSONResponse([_detail(w) for w in page], headers=headers)


async def kill(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``DELETE /sandboxes/{id}``: 204, or 404 (the SDK's ``kill`` then says False)."""
    sandbox_id = request.path_params["sandbox_id"]
    with _missing_is_404(f"sandbox {sandbox_id}"):
        await gateway.workspaces.DeleteWorkspace(
            wpb.DeleteWorkspaceRequest(workspace_id=sandbox_id), metadata=caller.metadata()
        )
    return Response(status_code=204)


async def set_timeout(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``POST /sandboxes/{id}/timeout``: the sandbox now ends ``timeout`` seconds from now; 204."""
    sandbox_id = request.path_params["sandbox_id"]
    given = (await json_body(request)).get("timeout")
    # E2B takes 0 as "time out now": the shortest lifetime sandboxd has, a second.
    timeout = 1 if given == 0 and not isinstance(given, bool) else _timeout(given)
    await _get(gateway, caller, sandbox_id)  # a 404 of E2B's shape for a sandbox that is not there
    await gateway.workspaces.SetWorkspaceLifetime(
        wpb.SetWorkspaceLifetimeRequest(workspace_id=sandbox_id, lifetime=duration_pb2.Duration(seconds=timeout)),
        metadata=caller.metadata(),
    )
    return Response(status_code=204)


async def pause(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``POST /sandboxes/{id}/pause``: 204, 409 when it is paused already, or 404."""
    workspace = await _get(gateway, caller, request.path_params["sandbox_id"])
    if workspace.state == wpb.WORKSPACE_STATE_PAUSED:
        raise Refused(409, f"sandbox {workspace.workspace_id} is paused already")
    await gateway.workspaces.PauseWorkspace(
        wpb.PauseWorkspaceRequest(workspace_id=workspace.workspace_id), metadata=caller.metadata()
    )
    return Response(status_code=204)


async def connect(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``POST /v2/sandboxes/{id}/connect``: 200 for a running sandbox, 201 for one it resumed.

    A ``timeout`` in the body moves the end to that long from now if that is later (E2B never
    shortens a sandbox's life on connect).
    """
    sandbox_id = request.path_params["sandbox_id"]
    body = await json_body(request)
    workspace = await _get(gateway, caller, sandbox_id)
    status = 200
    if workspace.state == wpb.WORKSPACE_STATE_PAUSED:
        resumed = await gateway.workspaces.ResumeWorkspace(
            wpb.ResumeWorkspaceRequest(workspace_id=sandbox_id), metadata=caller.metadata()
        )
        workspace, status = resumed.workspace, 201
    if body.get("timeout") is not None:
        timeout = _timeout(body["timeout"])
        ends = workspace.expire_time.ToDatetime(tzinfo=datetime.UTC) if workspace.HasField("expire_time") else None
        # E2B's connect only ever moves a running sandbox's end later (one just resumed has
        # its whole lifetime again, which the timeout replaces when longer).
        if ends is None or ends < datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=timeout):
            await gateway.workspaces.SetWorkspaceLifetime(
                wpb.SetWorkspaceLifetimeRequest(
                    workspace_id=sandbox_id, lifetime=duration_pb2.Duration(seconds=timeout)
                ),
                metadata=caller.metadata(),
            )
    return JSONResponse(_sandbox(workspace, caller), status_code=status)


def _snapshot_info(snapshot: wpb.Snapshot) -> dict[str, Any]:
    return {"snapshotID": snapshot.name, "names": [snapshot.name]}


async def create_snapshot(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``POST /sandboxes/{id}/snapshots``: the sandbox's files as a snapshot (a template); 201."""
    workspace = await _get(gateway, caller, request.path_params["sandbox_id"])
    name = (await json_body(request)).get("name") or f"snap-{secrets.token_hex(6)}"
    if not isinstance(name, str):
        raise Refused(400, "name must be a string")
    made = await gateway.workspaces.SnapshotWorkspace(
        wpb.SnapshotWorkspaceRequest(workspace_id=workspace.workspace_id, name=name), metadata=caller.metadata()
    )
    return JSONResponse(_snapshot_info(made.snapshot), status_code=201)


async def list_snapshots(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``GET /snapshots``: the tenant's snapshots, of one sandbox (``sandboxID``) or name if asked."""
    query = request.query_params
    listed = await gateway.workspaces.ListSnapshots(wpb.ListSnapshotsRequest(), metadata=caller.metadata())
    items = [
        _snapshot_info(s)
        for s in listed.snapshots
        if query.get("sandboxID") in (None, s.source_workspace_id) and query.get("name") in (None, s.name)
    ]
    return JSONResponse(items)


async def delete_snapshot(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``DELETE /templates/{id}``: a snapshot; 204, or 404 (the SDK then says False)."""
    name = request.path_params["template_id"]
    with _missing_is_404(f"snapshot {name}"):
        await gateway.workspaces.DeleteSnapshot(wpb.DeleteSnapshotRequest(name=name), metadata=caller.metadata())
    return Response(status_code=204)


async def fork(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``POST /sandboxes/{id}/fork``: ``count`` (1-20) new sandboxes with the source's files; 201.

    The source is snapshotted (its files: processes do not come along), each fork is created from
    the snapshot, and the snapshot is deleted (the forks keep its image). Each item is a
    ``{"sandbox": ...}`` or an ``{"error": ...}``, as E2B gives them.
    """
    workspace = await _get(gateway, caller, request.path_params["sandbox_id"])
    body = await json_body(request)
    count = body.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 20:
        raise Refused(400, f"count must be 1 to 20, got {count!r}")
    timeout = _timeout(body["timeout"]) if body.get("timeout") is not None else DEFAULT_TIMEOUT_S
    name = f"fork-{secrets.token_hex(6)}"
    await gateway.workspaces.SnapshotWorkspace(
        wpb.SnapshotWorkspaceRequest(workspace_id=workspace.workspace_id, name=name), metadata=caller.metadata()
    )
    try:
        spec = wpb.WorkspaceSpec(lifetime=duration_pb2.Duration(seconds=timeout))
        made = await asyncio.gather(
            *(
                gateway.workspaces.CreateWorkspace(
                    wpb.CreateWorkspaceRequest(spec=spec, from_snapshot=name), metadata=caller.metadata()
                )
                for _ in range(count)
            ),
            return_exceptions=True,
        )
    finally:
        await gateway.workspaces.DeleteSnapshot(wpb.DeleteSnapshotRequest(name=name), metadata=caller.metadata())
    items: list[dict[str, Any]] = []
    for result in made:
        if isinstance(result, grpc.aio.AioRpcError):
            status = http_status(result)
            items.append({"error": {"code": status, "message": result.details() or result.code().name.lower()}})
        elif isinstance(result, BaseException):
            raise result
        else:
            items.append({"sandbox": _sandbox(result.workspace, caller)})
    return JSONResponse(items, status_code=201)


async def update_network(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """``PUT /sandboxes/{id}/network``: the sandbox's egress replaced whole (:func:`egress_of`); 204."""
    workspace = await _get(gateway, caller, request.path_params["sandbox_id"])
    policy, rules = egress_of(await json_body(request), internet_default=True)
    await gateway.network.UpdateNetwork(
        npb.UpdateNetworkRequest(workspace_id=workspace.workspace_id, network=policy, allowed_hosts=rules),
        metadata=caller.metadata(),
    )
    return Response(status_code=204)


async def unsupported(request: Request, gateway: Gateway, caller: Caller) -> Response:
    """E2B's cloud features sandboxd has no counterpart for: 501, in E2B's error shape."""
    return error_response(
        501, f"{request.method} {request.url.path} is an E2B cloud feature that sandboxd does not serve"
    )


def control_routes(gateway: Gateway) -> list[Route]:
    """The REST routes, each calling sandboxd's services through ``gateway``."""

    def route(path: str, handler: Handler, method: str) -> Route:
        return Route(path, rest_endpoint(handler, gateway), methods=[method])

    return [
        route("/v2/sandboxes", create, "POST"),
        route("/sandboxes", create, "POST"),
        route("/v2/sandboxes", list_sandboxes, "GET"),
        route("/sandboxes", list_sandboxes, "GET"),
        route("/sandboxes/{sandbox_id}", get_info, "GET"),
        route("/sandboxes/{sandbox_id}", kill, "DELETE"),
        route("/sandboxes/{sandbox_id}/timeout", set_timeout, "POST"),
        route("/sandboxes/{sandbox_id}/pause", pause, "POST"),
        route("/v2/sandboxes/{sandbox_id}/connect", connect, "POST"),
        route("/sandboxes/{sandbox_id}/connect", connect, "POST"),
        route("/sandboxes/{sandbox_id}/resume", connect, "POST"),
        route("/sandboxes/{sandbox_id}/snapshots", create_snapshot, "POST"),
        route("/snapshots", list_snapshots, "GET"),
        # The SDK quotes the whole id ("team%2Fname%3Atag"), which the router sees unquoted.
        route("/templates/{template_id:path}", delete_snapshot, "DELETE"),
        route("/sandboxes/{sandbox_id}/fork", fork, "POST"),
        route("/sandboxes/{sandbox_id}/metrics", unsupported, "GET"),
        route("/sandboxes/{sandbox_id}/network", update_network, "PUT"),
        route("/templates", unsupported, "POST"),
        route("/v2/templates", unsupported, "POST"),
    ]
