"""Where the daemon's Unix socket lives by default: :mod:`sandboxd_protocol.paths`."""

from sandboxd_protocol.paths import default_socket_path

__all__ = ["default_socket_path"]
