"""The authentication layer: who is calling, bound to the call as its tenant."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import structlog

from ...audit import set_audit_tenant
from ...tenancy import Authenticator, reset_tenant, tenant_scope
from .._types import Context
from ._call import CallState, is_quiet
from ._layer import Layer

__all__ = ["Authentication"]


class Authentication(Layer):
    """Turns a call's bearer token into its tenant, then admits the call.

    The tenant is bound to the log context, the audit record and, for the domain services,
    :func:`sandboxd.tenancy.current_tenant` until the call ends. Only an authenticated call
    is admitted (:meth:`CallState.admit`): a large request is read then and not before.
    Health checks and reflection need no token.

    Args:
        authenticator: the tokens and their tenants (none: every caller is ``default``).
    """

    def __init__(self, authenticator: Authenticator | None = None) -> None:
        """Authenticate with ``authenticator``."""
        self.authenticator = authenticator or Authenticator()

    @contextlib.asynccontextmanager
    async def around(self, state: CallState, request: Any, context: Context) -> AsyncIterator[Any]:
        """Authenticate (raises UnauthenticatedError), admit, and unbind the tenant at the end."""
        if is_quiet(state.method):
            yield state.admit(request)
            return
        tenant = self.authenticator.tenant(tuple(context.invocation_metadata() or ()))
        structlog.contextvars.bind_contextvars(tenant=tenant)
        set_audit_tenant(tenant)
        scope = tenant_scope(tenant)
        try:
            yield state.admit(request)
        finally:
            reset_tenant(scope)
