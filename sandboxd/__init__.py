"""sandboxd: a gRPC daemon that runs agent workspaces in Docker containers."""

__version__ = "0.1.0"
