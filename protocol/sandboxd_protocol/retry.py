"""The one retry policy of sandboxd: the daemon's engine calls and the client's RPCs both use it.

Exponential backoff with jitter, bounded by attempts *and* by total time, reraising the
last error. The wait before retry ``n`` (1, 2, ...) is
``min(first_wait_s * growth ** (n - 1) + uniform(0, jitter_s), max_wait_s)`` seconds. Each
side says what is worth a retry (only idempotent calls are ever retried: that is the
caller's to decide) and what a scheduled retry reports.

The defaults are the client's: 0.1 s first, x2, at most 5 s, up to 1 s of jitter, at most
4 attempts within 10 s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

import tenacity

__all__ = ["RetryPolicy"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Bounded, jittered exponential backoff (see the module docstring for the waits)."""

    first_wait_s: float = 0.1
    """Wait before the first retry, in seconds, before jitter."""
    growth: float = 2.0
    """Factor each further wait grows by."""
    max_wait_s: float = 5.0
    """Longest single wait, in seconds, jitter included."""
    jitter_s: float = 1.0
    """Most random seconds added to a wait, so that many callers do not retry in step."""
    max_attempts: int = 4
    """Most attempts in all, the first one included."""
    max_total_s: float = 10.0
    """No attempt starts once this many seconds have passed since the first one began."""

    def retrying(
        self,
        retry_on: Callable[[BaseException], bool],
        *,
        before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
    ) -> tenacity.AsyncRetrying:
        """A tenacity controller of this policy.

        Args:
            retry_on: whether an error is worth another attempt; any other is raised at once.
            before_sleep: called before each wait (a log line, a count), if given.

        Returns:
            An ``AsyncRetrying`` that reraises the last error once the attempts or the time run out.
        """
        return tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(retry_on),
            wait=tenacity.wait_exponential_jitter(
                multiplier=self.first_wait_s, exp_base=self.growth, max=self.max_wait_s, jitter=self.jitter_s
            ),
            stop=tenacity.stop_after_attempt(self.max_attempts) | tenacity.stop_after_delay(self.max_total_s),
            before_sleep=before_sleep,
            reraise=True,
        )

    async def call(
        self,
        attempt: Callable[[], Awaitable[T]],
        retry_on: Callable[[BaseException], bool],
        *,
        before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
    ) -> T:
        """Run ``attempt`` until it returns, retrying the errors ``retry_on`` accepts.

        Args:
            attempt: one try of the call (only an idempotent one may be given).
            retry_on: whether an error is worth another attempt.
            before_sleep: called before each wait, if given.

        Returns:
            What the first successful attempt returned.

        Raises:
            Exception: the last attempt's error, once attempts or time have run out, or at once
                when ``retry_on`` refuses it.
        """
        result: T = await self.retrying(retry_on, before_sleep=before_sleep)(attempt)
        return result
