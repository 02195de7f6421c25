"""Type aliases shared by the servicers."""

from typing import Any, TypeAlias

import grpc

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
"""The servicer context of any sandboxd RPC."""
