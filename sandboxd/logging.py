"""structlog configuration: JSON off a terminal, a console renderer on one, stdlib bridged."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, TextIO

import structlog

__all__ = ["MAX_LOG_FIELD_CHARS", "configure_logging", "cut_text"]

MAX_LOG_FIELD_CHARS = 2000
"""Longest string field of a log line; longer ones (a refused command, a huge id) are cut."""


def cut_text(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and tail in ``limit`` characters.

    The tail is kept as well as the head because that is where a message says what went
    wrong (``…/a/very/long/path: No such file or directory``); the middle gives way to a
    marker saying how much was cut.

    >>> cut_text("abcdefghijklmnopqrstuvwxyz" * 4, 60)
    'abcdefghijklmnopqr… [68 characters cut] …ijklmnopqrstuvwxyz'
    """
    if len(text) <= limit:
        return text
    # Sized with the whole length, which has at least as many digits as the count that is cut.
    keep = max(0, limit - len(f"… [{len(text)} characters cut] …"))
    head, tail = keep - keep // 2, keep // 2
    return f"{text[:head]}… [{len(text) - keep} characters cut] …{text[len(text) - tail :] if tail else ''}"


def configure_logging(
    *,
    level: str = "info",
    fmt: str = "auto",
    stream: TextIO | None = None,
    cache: bool = True,
    mask: Callable[[str], str] | None = None,
) -> None:
    """Configure structlog and the stdlib root logger once, in ``__main__``.

    Args:
        level: lowest level written (``debug``, ``info``, ``warning``, ``error``).
        fmt: ``json``, ``console``, or ``auto`` (console on a TTY, JSON otherwise).
        stream: where log lines go; standard error by default.
        cache: cache loggers on first use (tests turn it off so they can capture logs).
        mask: applied to every string field (hides secret values).
    """
    out = stream or sys.stderr
    use_console = fmt == "console" or (fmt == "auto" and out.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if use_console:
        console = structlog.dev.ConsoleRenderer()
        # The console renderer formats tracebacks itself: mask the finished line as well.
        renderer = console if mask is None else _masked_output(console, mask)
    else:
        # Tracebacks as data, without local variables: those can hold commands, env and output.
        shared.append(
            structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False))
        )
        renderer = structlog.processors.JSONRenderer()
    if mask is not None:
        # Last, so that exception text rendered above is masked too.
        shared.append(_each_string(mask))
    # After masking (a cut must not leave half a secret unmasked): a line never grows with what
    # a caller sent.
    shared.append(_each_string(lambda text: cut_text(text, MAX_LOG_FIELD_CHARS)))
    structlog.configure(
        # A line below the level is dropped before any processor runs: each RPC's access line
        # would otherwise be stamped, masked and cut only for the handler to drop it.
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=cache,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _each_string(transform: Callable[[str], str]) -> structlog.types.Processor:
    """A processor applying ``transform`` to every string of a log line, nested ones too."""

    def applied(value: Any) -> Any:
        if isinstance(value, str):
            return transform(value)
        if isinstance(value, Mapping):
            return {key: applied(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [applied(item) for item in value]
        return value

    def processor(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for key, value in event_dict.items():
            event_dict[key] = applied(value)
        return event_dict

    return processor


def _masked_output(renderer: structlog.types.Processor, mask: Callable[[str], str]) -> structlog.types.Processor:
    def processor(logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> Any:
        rendered = renderer(logger, name, event_dict)
        return mask(rendered) if isinstance(rendered, str) else rendered

    return processor
