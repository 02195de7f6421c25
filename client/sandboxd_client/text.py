"""Model-facing text: ANSI stripped, carriage-return redraws collapsed, head kept under a cap.

SPEC §6: the model sees clean text (the raw bytes stay available to clients
that want them); output over the cap is cut on a character boundary keeping
the head, with a marker saying how many characters were left out.
"""

from __future__ import annotations

import re

__all__ = ["cap", "clean", "collapse_redraws", "strip_ansi"]

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

    Each ``\r`` returns to the start of the line and the next text overwrites
    what is there, so ``"10%\r100%"`` becomes ``"100%"``. A ``\r`` right before
    a newline (CRLF) is just a line ending.
    """
    if "\r" not in text:
        return text
    lines = []
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if "\r" in line:
            shown = ""
            for segment in line.split("\r"):
                shown = segment + shown[len(segment) :]
            line = shown
        lines.append(line)
    return "\n".join(lines)


def clean(text: str) -> str:
    """ANSI stripped, then redraws collapsed."""
    return collapse_redraws(strip_ansi(text))


def cap(text: str, limit: int, *, omitted_before: int = 0) -> tuple[str, int]:
    """Keep the first ``limit`` characters (seed 000: keep the head).

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
