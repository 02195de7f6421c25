"""ListWorkspaces: one page of the caller's workspaces, oldest first, and the token of the next."""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Callable, Mapping

from sandboxd_protocol.limits import MAX_LIST_PAGE_SIZE

from ..backend.base import Backend, ContainerInfo
from ..errors import InvalidSpecError
from ..models import Workspace
from .specs import LABEL_SPEC, LABEL_TENANT, check_labels, spec_from_json

__all__ = ["DEFAULT_PAGE_SIZE", "PAGE_SPEC_BYTES", "list_page"]

DEFAULT_PAGE_SIZE = 100
"""Workspaces per ListWorkspaces page when the caller sets no page size."""

PAGE_SPEC_BYTES = 4 * 1024**2
"""A ListWorkspaces page ends before its stored specs pass this many bytes: with the daemon's
64 MiB message limit a page always fits, whatever workspaces an older release let be made."""


def _listing_key(info: ContainerInfo) -> tuple[datetime.datetime, str]:
    """The listing order: oldest first, ties by id, so that a page token is a position in it."""
    return (info.create_time, info.workspace_id)


def _page_token(last: Workspace) -> str:
    position = json.dumps([last.create_time.isoformat(), last.workspace_id]).encode()
    return base64.urlsafe_b64encode(position).decode().rstrip("=")


def _page_position(token: str) -> tuple[datetime.datetime, str] | None:
    """The listing position a page token names; None for the first page.

    Raises:
        InvalidSpecError: not a token this daemon gave.
    """
    if not token:
        return None
    try:
        if len(token) > 256:
            raise ValueError  # noqa: TRY301 - one refusal for every kind of bad token
        created, workspace_id = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        moment = datetime.datetime.fromisoformat(created)
        if not isinstance(workspace_id, str) or moment.tzinfo is None:
            raise ValueError  # noqa: TRY301
    except (ValueError, TypeError):
        msg = "page_token is not one this daemon gave (pass next_page_token as it came)"
        raise InvalidSpecError(msg) from None
    return moment, workspace_id


async def list_page(
    backend: Backend,
    label_selector: Mapping[str, str],
    *,
    tenant: str,
    page_size: int,
    page_token: str,
    describe: Callable[[ContainerInfo], Workspace],
) -> tuple[list[Workspace], str]:
    """One page of the tenant's workspaces carrying every label in ``label_selector``, oldest first.

    Args:
        backend: the engine the containers are listed from (one listing per page).
        label_selector: labels every listed workspace carries.
        tenant: whose workspaces are listed.
        page_size: most workspaces on the page; 0 means ``DEFAULT_PAGE_SIZE``, at most
            ``MAX_LIST_PAGE_SIZE``. A page also ends before its specs pass ``PAGE_SPEC_BYTES``
            (it always holds at least one workspace), so it fits one message.
        page_token: the token of the previous page; empty starts with the oldest.
        describe: a container as the workspace it is.

    Returns:
        The page and the token of the next one (empty when this is the last).

    Raises:
        InvalidSpecError: a bad selector, page size or token.
    """
    check_labels(label_selector, "label_selector")
    if not 0 <= page_size <= MAX_LIST_PAGE_SIZE:
        msg = f"page_size must be 0 (the default, {DEFAULT_PAGE_SIZE}) to {MAX_LIST_PAGE_SIZE}, got {page_size}"
        raise InvalidSpecError(msg)
    after = _page_position(page_token)
    selector = {**label_selector, LABEL_TENANT: tenant}
    infos = sorted(await backend.list_containers(selector), key=_listing_key)
    if label_selector:
        # Matched again on the workspace's own labels: a fork's container carries its source's
        # labels blank (an image's labels cannot be dropped), which a blank value would match.
        infos = [info for info in infos if _carries(info, label_selector)]
    remaining = [info for info in infos if after is None or _listing_key(info) > after]
    page: list[Workspace] = []
    spec_bytes = 0
    for info in remaining[: page_size or DEFAULT_PAGE_SIZE]:
        size = len(info.labels.get(LABEL_SPEC, ""))
        if page and spec_bytes + size > PAGE_SPEC_BYTES:
            break
        page.append(describe(info))
        spec_bytes += size
    more = len(page) < len(remaining)
    return page, _page_token(page[-1]) if more else ""


def _carries(info: ContainerInfo, label_selector: Mapping[str, str]) -> bool:
    """Whether the workspace's own labels (its spec's) hold every label of ``label_selector``."""
    spec = info.labels.get(LABEL_SPEC)
    own = spec_from_json(spec).labels if spec else info.labels
    return all(key in own and own[key] == value for key, value in label_selector.items())
