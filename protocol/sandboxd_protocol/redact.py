"""Masking of secret values in a stream of chunks, shared by the daemon (bytes) and the client (text).

A secret split across two chunks is masked all the same: a chunk's tail that may
begin one is held back until the next chunk (or the end) tells.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, AnyStr, Generic

__all__ = ["Redactor", "StreamRedactor"]


class StreamRedactor(Generic[AnyStr]):
    """Masks secret values in a stream of chunks (text or bytes), even when one is split across chunks.

    Args:
        masks: each secret value and what replaces it.
        empty: ``""`` for text, ``b""`` for bytes.

    A chunk's tail that begins some secret (at most :attr:`holdback` long) is
    held back until the next chunk, or the end, shows whether the secret
    follows; anything else passes at once, so a prompt is never delayed.
    Occurrences that overlap (``abcd`` and ``bcdefgh`` in ``abcdefgh``) are
    masked as one region, named after its longest secret: no part of either
    goes out. Masks are never scanned again, so a value inside a mask cannot
    make output grow.
    """

    def __init__(self, masks: Mapping[AnyStr, AnyStr], empty: AnyStr) -> None:
        """Compile the values, longest first."""
        self._masks: dict[AnyStr, AnyStr] = {value: mask for value, mask in masks.items() if value}
        values = sorted(self._masks, key=len, reverse=True)
        bar, ahead, close = (b"|", b"(?=(", b"))") if isinstance(empty, bytes) else ("|", "(?=(", "))")
        # A lookahead finds, at every position, the longest secret starting there: overlapping
        # occurrences are all seen (a plain alternation would skip those inside an earlier match).
        self._pattern: re.Pattern[AnyStr] | None = (
            re.compile(ahead + bar.join(re.escape(v) for v in values) + close) if values else None
        )
        self._empty: AnyStr = empty
        self._longest = max((len(v) for v in values), default=1)
        self.holdback = self._longest - 1
        """Most characters (or bytes) kept back at the end of a chunk for a possible secret start."""
        self._pending: AnyStr = empty

    @property
    def active(self) -> bool:
        """Whether there is any secret to mask."""
        return self._pattern is not None

    def redact(self, text: AnyStr) -> AnyStr:
        """Mask every secret in a complete text (the stream's state is untouched)."""
        if self._pattern is None:
            return text
        return self._scan(text, final=True)[0]

    def _partial(self, text: AnyStr) -> int:
        """Length of the longest tail of ``text`` that some secret continues: only it must wait for more."""
        for size in range(min(self.holdback, len(text)), 0, -1):
            tail = text[-size:]
            if any(len(value) > size and value.startswith(tail) for value in self._masks):
                return size
        return 0

    def _regions(self, text: AnyStr) -> list[tuple[int, int, AnyStr]]:
        """Every occurrence, overlapping ones merged: ``(start, end, mask of the longest)``."""
        assert self._pattern is not None
        regions: list[list[Any]] = []
        for match in self._pattern.finditer(text):
            start, end = match.span(1)
            value = match.group(1)
            if regions and start < regions[-1][1]:
                region = regions[-1]
                region[1] = max(region[1], end)
                if len(value) > region[3]:
                    region[2], region[3] = self._masks[value], len(value)
            else:
                regions.append([start, end, self._masks[value], len(value)])
        return [(start, end, mask) for start, end, mask, _ in regions]

    def _scan(self, text: AnyStr, *, final: bool) -> tuple[AnyStr, AnyStr]:
        """``(masked text safe to show, text to hold back)``."""
        cut = len(text) if final else len(text) - self._partial(text)
        out: list[AnyStr] = []
        position = 0
        for start, end, mask in self._regions(text):
            if end > cut:
                if len(text) - start <= 2 * self._longest:
                    # A secret inside what may yet become a longer one (a password inside a URL
                    # that holds it): wait, or the longer one's other parts would go out unmasked.
                    cut = min(cut, start)
                    break
                # A chain of overlapping secrets this long: masked now, so the hold stays bounded.
                cut = max(cut, end)
            out += [text[position:start], mask]
            position = end
        out.append(text[position:cut])
        return self._empty.join(out), text[cut:]

    @property
    def held(self) -> int:
        """Characters (or bytes) of input kept back now, not yet in any output."""
        return len(self._pending)

    def feed(self, text: AnyStr) -> AnyStr:
        """Masked text safe to show now (a possible start of a secret is kept for later)."""
        if self._pattern is None:
            return text
        shown, self._pending = self._scan(self._pending + text, final=False)
        return shown

    def flush(self) -> AnyStr:
        """The rest, masked."""
        if self._pattern is None:
            return self._empty
        shown, self._pending = self._scan(self._pending, final=True)
        return shown


class Redactor(StreamRedactor[str]):
    """Masks ``secrets`` in text chunks with one ``mask`` (see :class:`StreamRedactor`)."""

    def __init__(self, secrets: list[str], mask: str = "[REDACTED]") -> None:
        """Mask every value of ``secrets``."""
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        super().__init__(dict.fromkeys(self.secrets, mask), "")
