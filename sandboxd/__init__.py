"""sandboxd: a gRPC daemon that runs agent workspaces in Docker containers."""

import os as _os

# As in sandboxd_client: gRPC core's routine INFO lines would interleave with the JSON log.
_os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

__version__ = "0.1.0"
