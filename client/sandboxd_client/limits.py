"""The size bounds of the sandboxd API: :mod:`sandboxd_protocol.limits`, which daemon and client share."""

from sandboxd_protocol.limits import *  # noqa: F403
from sandboxd_protocol.limits import __all__ as __all__
