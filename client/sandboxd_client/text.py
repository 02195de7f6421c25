"""Model-facing text: ANSI stripped, carriage-return redraws collapsed, head kept under a cap.

The model sees clean text (the raw bytes stay available to clients
that want them); output over the cap is cut on a character boundary keeping
the head, with a marker saying how many characters were left out.
"""

from __future__ import annotations

import re

from sandboxd_protocol.redact import Redactor, StreamRedactor

__all__ = ["CleanStream", "Redactor", "StreamRedactor", "cap", "clean", "collapse_redraws", "strip_ansi"]

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), and two-character escapes (ESC + one byte).
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[PX^_][^\x1b]*\x1b\\"
    r"|\x1b[@-Z\\-_]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (colours, cursor moves, titles)."""
    return _ANSI.sub("", text)


def collapse_redraws(text: str) -> str:
    r"""Keep only what a terminal would show for lines redrawn with ``\r``.

    Each ``\r`` followed by more text on the same line returns to the start of
    the line, and that text overwrites what is there, so ``"10%\r100%\n"``
    becomes ``"100%\n"``. A ``\r`` right before a newline is not a redraw but
    a line ending (CRLF), which the agent may be investigating (a CRLF file, a
    script failing with ``$'\r': command not found``): it is kept, and the
    ``\r`` run that ends a redrawn line collapses to that one CRLF
    (``"a\r\r\nb"`` is ``"a\r\nb"``). A trailing ``\r`` with no newline after
    it draws nothing and is dropped.
    """
    if "\r" not in text:
        return text
    lines = text.split("\n")
    for index, line in enumerate(lines):
        body = line.rstrip("\r")
        ends_in_crlf = body != line and index < len(lines) - 1
        if "\r" in body:
            shown = ""
            for segment in body.split("\r"):
                shown = segment + shown[len(segment) :]
            body = shown
        lines[index] = body + "\r" if ends_in_crlf else body
    return "\n".join(lines)


def clean(text: str) -> str:
    """ANSI stripped, then redraws collapsed."""
    return collapse_redraws(strip_ansi(text))


def cap(text: str, limit: int, *, omitted_before: int = 0) -> tuple[str, int]:
    """Keep the first ``limit`` characters.

    Args:
        text: the text.
        limit: most characters kept; ``<= 0`` means no cap.
        omitted_before: characters already left out upstream, added to the count.

    Returns:
        The kept text and how many characters were left out in all.
    """
    if limit <= 0 or len(text) <= limit:
        return text, omitted_before
    return text[:limit], len(text) - limit + omitted_before


_ESCAPE_TAIL_CHARS = 256
"""Longest unfinished escape sequence held back between chunks before it is taken as text."""


class CleanStream:
    """Clean text (``clean``) computed as chunks arrive, keeping at most ``limit`` characters.

    Cleaning comes before the cap, so a progress bar redrawn a million
    times costs its final state, not a million frames, and nothing printed after
    a flood of escape codes is lost. Memory stays bounded: finished lines are kept
    up to ``limit`` characters and only counted past that; the line being drawn
    is kept to ``limit`` characters too.
    """

    def __init__(self, limit: int) -> None:
        """``limit <= 0`` keeps everything."""
        self.limit = limit
        self._kept: list[str] = []
        self._kept_chars = 0
        self.omitted = 0
        """Clean characters past the limit (final once :meth:`finish` was called)."""
        self._line = ""
        self._col = 0  # where the next character lands on the current line (a CR sends it to 0)
        self._line_extra = 0  # characters of the current line beyond what is kept of it
        self._cr = False  # the line's last character so far was a CR: a line ending if a newline comes next
        self._held = ""  # a chunk's tail that may be the start of an escape sequence

    def feed(self, text: str) -> None:
        """Add raw output."""
        text = self._held + text
        self._held = ""
        cut = text.rfind("\x1b")
        if cut >= 0 and len(text) - cut < _ESCAPE_TAIL_CHARS and _unfinished_escape(text[cut:]):
            text, self._held = text[:cut], text[cut:]
        pieces = strip_ansi(text).split("\n")
        for index, piece in enumerate(pieces):
            self._draw(piece)
            if index < len(pieces) - 1:
                self._end_line()

    def _draw(self, piece: str) -> None:
        cap_chars = self.limit + 1 if self.limit > 0 else None
        for number, segment in enumerate(piece.split("\r")):
            if number:  # a carriage return: the cursor goes back to the start of the line
                self._col = 0
                self._cr = True
            if segment:
                self._cr = False
                # Overwrite from the cursor on, as a terminal does.
                self._line = self._line[: self._col] + segment + self._line[self._col + len(segment) :]
                self._col += len(segment)
            if cap_chars is not None and len(self._line) > cap_chars:
                self._line_extra += len(self._line) - cap_chars
                self._line = self._line[:cap_chars]
                self._col = min(self._col, cap_chars)

    def _end_line(self) -> None:
        # CRs right before the newline are the line's ending (CRLF), not a redraw: one is kept.
        self._emit(self._line + ("\r\n" if self._cr else "\n"), self._line_extra)
        self._line, self._col, self._line_extra, self._cr = "", 0, 0, False

    def _emit(self, text: str, extra: int) -> None:
        if self.limit <= 0:
            self._kept.append(text)
            return
        room = self.limit - self._kept_chars
        if room > 0:
            self._kept.append(text[:room])
            self._kept_chars += min(room, len(text))
        self.omitted += max(0, len(text) - max(room, 0)) + extra

    def finish(self) -> str:
        """Flush what is pending and return the kept clean text (at most ``limit`` characters)."""
        if self._held:
            held, self._held = self._held, ""
            self._draw(strip_ansi(held))
        if self._line or self._line_extra:
            self._emit(self._line, self._line_extra)  # a CR with no newline after it draws nothing
            self._line, self._col, self._line_extra, self._cr = "", 0, 0, False
        return "".join(self._kept)


_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def _unfinished_escape(tail: str) -> bool:
    """Whether ``tail`` (starting with ESC) may be the first part of a longer escape sequence."""
    if len(tail) < 2:
        return True
    if tail[1] == "[":
        return not _CSI.match(tail)
    if tail[1] == "]":
        return "\x07" not in tail and "\x1b\\" not in tail[1:]
    if tail[1] in "PX^_":
        return "\x1b\\" not in tail[1:]
    return False
