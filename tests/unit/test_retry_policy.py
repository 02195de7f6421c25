"""The retry policy the daemon and the client share (sandboxd_protocol.retry)."""

from __future__ import annotations

import pytest
import tenacity
from sandboxd_client import _client
from sandboxd_protocol.retry import RetryPolicy

from sandboxd.backend.docker import client as docker_client

INSTANT = RetryPolicy(first_wait_s=0.0, jitter_s=0.0, max_wait_s=0.0)
"""The default bounds with no waits, so that tests do not sleep."""


class Flaky(Exception):
    """An error worth a retry."""


class Fatal(Exception):
    """An error no retry helps."""


def _waits(policy: RetryPolicy, attempts: int) -> list[float]:
    retrying = policy.retrying(lambda error: True)
    state = tenacity.RetryCallState(retrying, fn=None, args=(), kwargs={})
    waits = []
    for number in range(1, attempts + 1):
        state.attempt_number = number
        waits.append(retrying.wait(state))
    return waits


class TestRetryPolicy:
    def test_defaults_are_the_house_backoff(self) -> None:
        """0.1 s first, x2, at most 5 s, up to 1 s of jitter, 4 attempts within 10 s."""
        assert RetryPolicy() == RetryPolicy(
            first_wait_s=0.1, growth=2.0, max_wait_s=5.0, jitter_s=1.0, max_attempts=4, max_total_s=10.0
        )

    def test_waits_grow_exponentially_up_to_the_cap(self) -> None:
        """Without jitter the waits double from the first and stop growing at the cap."""
        policy = RetryPolicy(jitter_s=0.0, max_wait_s=1.0)
        assert _waits(policy, 6) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])

    def test_jitter_adds_at_most_its_bound(self) -> None:
        """Each wait is its exponential step plus up to ``jitter_s``, never over the cap."""
        policy = RetryPolicy(jitter_s=0.3, max_wait_s=1.0)
        for _ in range(50):
            for step, wait in zip([0.1, 0.2, 0.4, 0.8, 1.0], _waits(policy, 5), strict=True):
                assert step <= wait <= min(step + 0.3, 1.0)

    async def test_a_retryable_error_is_retried_until_the_attempts_run_out(self) -> None:
        """Four attempts, three waits announced, and the last error reraised as it is."""
        calls: list[int] = []
        announced: list[int] = []

        async def attempt() -> None:
            calls.append(1)
            raise Flaky(len(calls))

        with pytest.raises(Flaky) as raised:
            await INSTANT.call(attempt, lambda e: isinstance(e, Flaky), before_sleep=lambda s: announced.append(1))
        assert len(calls) == 4
        assert len(announced) == 3
        assert raised.value.args == (4,)

    async def test_another_error_is_raised_at_once(self) -> None:
        """An error ``retry_on`` refuses ends the call on its first attempt."""
        calls: list[int] = []

        async def attempt() -> None:
            calls.append(1)
            raise Fatal

        with pytest.raises(Fatal):
            await INSTANT.call(attempt, lambda e: isinstance(e, Flaky))
        assert len(calls) == 1

    async def test_a_later_success_is_returned(self) -> None:
        """A call that succeeds on a retry returns what that attempt returned."""
        calls: list[int] = []

        async def attempt() -> str:
            calls.append(1)
            if len(calls) < 3:
                raise Flaky
            return "done"

        assert await INSTANT.call(attempt, lambda e: isinstance(e, Flaky)) == "done"
        assert len(calls) == 3

    async def test_the_total_time_bounds_the_attempts_too(self) -> None:
        """Once ``max_total_s`` has passed, no further attempt starts, however many are left."""
        calls: list[int] = []

        async def attempt() -> None:
            calls.append(1)
            raise Flaky

        with pytest.raises(Flaky):
            await RetryPolicy(first_wait_s=0.0, jitter_s=0.0, max_total_s=0.0).call(attempt, lambda e: True)
        assert len(calls) == 1


class TestBothSidesUseIt:
    def test_the_client_retries_unavailable_with_the_defaults(self) -> None:
        """The client's policy: the defaults, on UNAVAILABLE only."""
        from sandboxd_client.errors import InvalidArgumentError, UnavailableError

        assert RetryPolicy() == _client._RETRY
        assert _client._unavailable(UnavailableError("down"))
        assert not _client._unavailable(InvalidArgumentError("bad"))

    def test_the_backend_retries_engine_calls_faster_and_shorter(self) -> None:
        """The backend's policy: waits of at most 1 s with 0.3 s of jitter, 4 attempts within 2.5 s."""
        assert RetryPolicy(max_wait_s=1.0, jitter_s=0.3, max_total_s=2.5) == docker_client.ENGINE_RETRY
