"""The daemon's side of the agent protocol (``agent/PROTOCOL.md``): the one package that speaks it.

Every workspace runs ``sandboxd-agent`` as its main process. An :class:`AgentLink`
is the daemon's one connection to it, multiplexing every process session, file
operation and forwarded connection as a numbered channel. Nothing outside this
package sees a frame.

Modules, lowest first (each imports only those above it):

- ``paths``: where the agent is inside a workspace (the build module imports it from here).
- ``errors``: what goes wrong (:class:`ProtocolError`, :class:`AgentLost`...).
- ``codec``: the link's frames and the file-operation helper's frames, and the
  checked reading of their JSON fields.
- ``messages``: the typed reports and requests (:class:`Welcome`, :class:`ExitReport`,
  :class:`StartRequest`) and :class:`SessionEvents`, what a process session hears.
- ``window``: :class:`SendWindow`, how far a sender may be ahead of what the agent took.
- ``routes``: the channels (:class:`SessionChannel`, file operations, forwards), which
  reach the link only through the small ``Frames`` protocol.
- ``dial``: :class:`~sandboxd.agent.dial.Dialer`, how a connection reaches the agent
  (straight to its socket from the host, else a bridge).
- ``link``: :class:`AgentLink`, the connection itself: handshake, reconnects, dispatch.
"""

from __future__ import annotations

from .codec import (
    MAX_MESSAGE_CHARS,
    MAX_PAYLOAD_BYTES,
    PROTOCOL_VERSION,
    FileData,
    FileLine,
    FileReply,
    FileResult,
    encode,
    from_container_json,
)
from .codec import FrameDecoder as _Decoder
from .errors import (
    AgentBehindEngine,
    AgentLost,
    FileOperationError,
    FileOperationRefused,
    ForwardError,
    ProtocolError,
)
from .link import AgentLink
from .messages import ExitReport, SessionEvents, SessionState, StartRequest, Welcome
from .paths import AGENT_PATH
from .routes import ForwardedConnection, SessionChannel
from .window import SendWindow

__all__ = [
    "AGENT_PATH",
    "MAX_MESSAGE_CHARS",
    "MAX_PAYLOAD_BYTES",
    "PROTOCOL_VERSION",
    "AgentBehindEngine",
    "AgentLink",
    "AgentLost",
    "ExitReport",
    "FileData",
    "FileLine",
    "FileOperationError",
    "FileOperationRefused",
    "FileReply",
    "FileResult",
    "ForwardError",
    "ForwardedConnection",
    "ProtocolError",
    "SendWindow",
    "SessionChannel",
    "SessionEvents",
    "SessionState",
    "StartRequest",
    "Welcome",
    "_Decoder",
    "encode",
    "from_container_json",
]
