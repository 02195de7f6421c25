"""The trace: every tool-call event as one JSON line, keyed by tool_call_id."""

from __future__ import annotations

import datetime
import json
import threading
from pathlib import Path
from typing import IO, Any

__all__ = ["Trace"]


class Trace:
    """Append-only JSON-lines trace.

    Args:
        target: a path (opened for appending) or a text stream; None keeps
            events in memory only.
        keep: also keep events in ``events`` (default: only when there is no target,
            so a long-running engine writing to a file does not grow in memory).
    """

    def __init__(self, target: str | Path | IO[str] | None = None, *, keep: bool | None = None) -> None:
        """Open the trace."""
        self.events: list[dict[str, Any]] = []
        self._keep = target is None if keep is None else keep
        self._lock = threading.Lock()
        self._owned = False
        self._stream: IO[str] | None
        if target is None or hasattr(target, "write"):
            self._stream = target  # type: ignore[assignment]
        else:
            self._stream = Path(target).open("a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._owned = True

    def record(self, event: str, tool_call_id: str, **fields: Any) -> dict[str, Any]:
        """Append one event (``tool_call.start``, ``approval_decision``, ...) and return it."""
        entry = {
            "time": datetime.datetime.now(datetime.UTC).isoformat(),
            "event": event,
            "tool_call_id": tool_call_id,
            **fields,
        }
        with self._lock:
            if self._keep:
                self.events.append(entry)
            if self._stream is not None:
                self._stream.write(json.dumps(entry, ensure_ascii=False, default=str) + "\n")
                self._stream.flush()
        return entry

    def close(self) -> None:
        """Close a trace file this object opened."""
        if self._owned and self._stream is not None:
            self._stream.close()
            self._stream = None
