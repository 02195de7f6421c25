"""structlog configuration: JSON off a terminal, a console renderer on one, stdlib bridged."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import structlog

__all__ = ["configure_logging"]


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
        mask: applied to every string field (hides secret values, seed 002).
    """
    out = stream or sys.stderr
    use_console = fmt == "console" or (fmt == "auto" and out.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if mask is not None:
        shared.append(_masking(mask))
    renderer: structlog.types.Processor
    if use_console:
        renderer = structlog.dev.ConsoleRenderer()
    else:
        # Tracebacks as data, without local variables: those can hold commands, env and output.
        shared.append(
            structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False))
        )
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
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


def _masking(mask: Callable[[str], str]) -> structlog.types.Processor:
    def processor(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for key, value in event_dict.items():
            if isinstance(value, str):
                event_dict[key] = mask(value)
            elif isinstance(value, (list, tuple)):
                event_dict[key] = [mask(item) if isinstance(item, str) else item for item in value]
        return event_dict

    return processor
