"""A session's output flow control: the window, the acknowledgement, and which pulls are worth a frame."""

from __future__ import annotations

import asyncio

from sandboxd.processes.flow import (
    ACK_STEP_BYTES,
    MIN_SHARE_BYTES,
    REPLAY_BYTES,
    STREAM_WINDOW_BYTES,
    WINDOW_BYTES,
    OutputBudget,
    OutputFlow,
    Pull,
)

MIB = 1024 * 1024


def reading(flow: OutputFlow, *, ack: int = 0, delivered: int | None = None, force: bool = False) -> Pull | None:
    """A pull while a caller reads from an agent that answers tail pulls."""
    delivered = ack if delivered is None else delivered
    return flow.next(ack=ack, ack_gap=0, delivered=delivered, received=ack, reader=True, tails=True, force=force)


class TestWindow:
    """How far beyond callers' take the agent may send while one reads."""

    def test_an_agent_that_tails_gets_the_stream_window_or_the_buffer_if_larger(self) -> None:
        """With tail pulls a walked-away stream is cut afterwards, so the window need not fit the buffer."""
        assert OutputFlow(buffer_bytes=MIB).window(tails=True) == STREAM_WINDOW_BYTES
        assert OutputFlow(buffer_bytes=64 * MIB).window(tails=True) == 64 * MIB

    def test_an_agent_that_cannot_tail_gets_no_more_than_the_buffer(self) -> None:
        """Without tail pulls a caller that walks away must find no more unread than the session keeps."""
        assert OutputFlow(buffer_bytes=MIB).window(tails=False) == MIB
        assert OutputFlow(buffer_bytes=64 * MIB).window(tails=False) == WINDOW_BYTES

    def test_a_reader_is_allowed_a_window_beyond_what_it_took(self) -> None:
        """``until`` is the delivered offset plus the window; without a reader, nothing beyond what arrived."""
        flow = OutputFlow(buffer_bytes=MIB)
        assert reading(flow, ack=10, delivered=100) == Pull(
            ack=0, ack_gap=0, until=100 + STREAM_WINDOW_BYTES, reader=True
        )
        idle = flow.next(ack=100, ack_gap=3, delivered=100, received=500, reader=False, tails=False, force=True)
        assert idle == Pull(ack=100, ack_gap=3, until=500, reader=False)


class TestWhatIsWorthAFrame:
    """Pulls that change little are not sent; the end of a batch and a reader's coming and going are."""

    def test_the_first_pull_is_always_sent(self) -> None:
        """Nothing was said to the agent yet."""
        assert reading(OutputFlow(buffer_bytes=MIB)) is not None

    def test_progress_under_the_ack_step_waits_and_progress_over_it_goes(self) -> None:
        """Small acknowledgements are gathered into one frame every quarter buffer (at most 256 KiB)."""
        flow = OutputFlow(buffer_bytes=16 * MIB)
        assert flow.ack_step == ACK_STEP_BYTES
        reading(flow)
        assert reading(flow, ack=ACK_STEP_BYTES - 1) is None
        assert reading(flow, ack=ACK_STEP_BYTES) is not None

    def test_a_small_buffer_acknowledges_often(self) -> None:
        """A buffer of 4 KiB frees its agent every KiB; a tiny one, every byte."""
        assert OutputFlow(buffer_bytes=4096).ack_step == 1024
        assert OutputFlow(buffer_bytes=1).ack_step == 1

    def test_force_sends_even_an_unchanged_pull(self) -> None:
        """A caller arriving or leaving tells the agent at once."""
        flow = OutputFlow(buffer_bytes=MIB)
        reading(flow)
        assert reading(flow) is None
        assert reading(flow, force=True) is not None

    def test_a_reader_leaving_is_always_sent(self) -> None:
        """The agent must stop sending beyond what arrived once nobody reads."""
        flow = OutputFlow(buffer_bytes=MIB)
        reading(flow)
        assert flow.next(ack=0, ack_gap=0, delivered=0, received=0, reader=False, tails=False) is not None

    def test_after_a_lost_connection_the_next_pull_is_sent(self) -> None:
        """What was in flight is lost with the connection: the agent hears the position again."""
        flow = OutputFlow(buffer_bytes=MIB)
        reading(flow)
        flow.lost()
        assert reading(flow) is not None


class TestTailPull:
    """The last reader leaving with more in flight than the session keeps asks where the agent's output ends."""

    def test_leaving_a_fast_stream_asks_for_the_tail(self) -> None:
        """More allowed in flight than the buffer: the rest beyond the head is to be cut."""
        flow = OutputFlow(buffer_bytes=MIB)
        reading(flow)
        pull = flow.next(ack=0, ack_gap=0, delivered=0, received=2 * MIB, reader=False, tails=True)
        assert pull is not None
        assert pull.tail

    def test_an_agent_that_cannot_tail_is_never_asked(self) -> None:
        """Its window never exceeded the buffer, and it would not answer."""
        flow = OutputFlow(buffer_bytes=MIB)
        flow.next(ack=0, ack_gap=0, delivered=0, received=0, reader=True, tails=False)
        pull = flow.next(ack=0, ack_gap=0, delivered=0, received=0, reader=False, tails=False)
        assert pull is not None
        assert not pull.tail

    def test_no_tail_when_what_was_allowed_fits_the_buffer(self) -> None:
        """A window the buffer holds leaves nothing to cut."""
        flow = OutputFlow(buffer_bytes=64 * MIB)
        reading(flow)
        pull = flow.next(ack=0, ack_gap=0, delivered=0, received=0, reader=False, tails=True)
        assert pull is not None
        assert not pull.tail

    def test_no_tail_without_a_reader_before(self) -> None:
        """Only a reader's departure asks: a session nobody read has no window open."""
        flow = OutputFlow(buffer_bytes=MIB)
        pull = flow.next(ack=0, ack_gap=0, delivered=0, received=0, reader=False, tails=True, force=True)
        assert pull is not None
        assert not pull.tail


class TestReplay:
    """While a caller reads, the agent keeps what it was sent last: a broken stream resumes from its agent."""

    def test_the_last_replay_bytes_sent_are_kept_while_a_caller_reads(self) -> None:
        flow = OutputFlow(buffer_bytes=MIB)
        pull = reading(flow, ack=10 * MIB, delivered=10 * MIB)
        assert pull is not None and (pull.ack, pull.ack_gap) == (10 * MIB - REPLAY_BYTES, 0)

    def test_what_the_masking_holds_keeps_the_acknowledgement_lower_still(self) -> None:
        flow = OutputFlow(buffer_bytes=MIB)
        pull = reading(flow, ack=2 * MIB, delivered=10 * MIB)
        assert pull is not None and pull.ack == 2 * MIB

    def test_once_the_caller_leaves_all_it_was_sent_is_acknowledged(self) -> None:
        """A session nobody reads keeps its whole buffer for unread output, none of it for a replay."""
        flow = OutputFlow(buffer_bytes=MIB)
        reading(flow, ack=10 * MIB, delivered=10 * MIB)
        idle = flow.next(ack=10 * MIB, ack_gap=2, delivered=10 * MIB, received=11 * MIB, reader=False, tails=True)
        assert idle is not None and (idle.ack, idle.ack_gap, idle.reader) == (10 * MIB, 2, False)
        assert flow.acked == 10 * MIB

    def test_the_acknowledgement_never_goes_back(self) -> None:
        """A caller that comes back reads again: the agent already forgot what it was told it may."""
        flow = OutputFlow(buffer_bytes=MIB)
        flow.next(ack=10 * MIB, ack_gap=0, delivered=10 * MIB, received=10 * MIB, reader=False, tails=True)
        pull = reading(flow, ack=11 * MIB, delivered=11 * MIB, force=True)
        assert pull is not None and pull.ack == 10 * MIB

    def test_a_resend_is_always_sent(self) -> None:
        flow = OutputFlow(buffer_bytes=MIB)
        reading(flow, ack=MIB, delivered=MIB)
        pull = flow.next(ack=MIB, ack_gap=0, delivered=MIB, received=MIB, reader=True, tails=True, resend=True)
        assert pull is not None and pull.resend

    def test_no_replay_where_secrets_are_masked(self) -> None:
        """An acknowledgement a fixed distance back could fall inside a masked value."""
        flow = OutputFlow(buffer_bytes=MIB)
        pull = flow.next(
            ack=10 * MIB, ack_gap=0, delivered=10 * MIB, received=10 * MIB, reader=True, tails=True, replay=False
        )
        assert pull is not None and pull.ack == 10 * MIB


class Reader:
    """A session's stream, as the budget counts its readers."""


class Holder:
    """A session holding output for callers, as the budget sees it."""

    def __init__(self, budget: OutputBudget, held: int, *, reading: bool = False) -> None:
        self.budget, self.held_bytes, self.reading = budget, 0, reading
        budget.track(self)
        self.hold(held)

    def hold(self, more: int) -> None:
        self.held_bytes += more
        self.budget.held_changed(more)

    def give_back_output(self) -> int:
        if self.reading:
            return 0
        freed, self.held_bytes = self.held_bytes, 0
        self.budget.held_changed(-freed)
        return freed


class TestBudget:
    """The daemon's budget for held output: shared by readers, relieved by giving idle output back."""

    def test_readers_share_it_and_each_gets_at_least_the_least_share(self) -> None:
        budget = OutputBudget(64 * MIB)
        readers = [Reader() for _ in range(1000)]
        assert budget.share() == 64 * MIB
        flow = OutputFlow(buffer_bytes=MIB, budget=budget)
        assert flow.window(tails=True) == STREAM_WINDOW_BYTES  # alone: the stream window, within the budget
        for reader in readers[:16]:
            budget.reading(reader, True)
        assert (budget.share(), flow.window(tails=True)) == (4 * MIB, 4 * MIB)
        for reader in readers:
            budget.reading(reader, True)
        assert budget.share() == MIN_SHARE_BYTES
        for reader in readers:
            budget.reading(reader, False)
        assert budget.share() == 64 * MIB

    async def test_past_it_idle_output_goes_back_largest_first_to_three_quarters(self) -> None:
        budget = OutputBudget(100)
        small, large, streamed = Holder(budget, 10), Holder(budget, 50), Holder(budget, 30, reading=True)
        assert budget.held == 90
        small.hold(20)  # 110: past the budget
        await asyncio.sleep(0)  # relief runs soon after, once
        assert (large.held_bytes, small.held_bytes, streamed.held_bytes, budget.held) == (0, 30, 30, 60)

    async def test_streamed_output_is_never_given_back(self) -> None:
        budget = OutputBudget(100)
        streamed = Holder(budget, 150, reading=True)
        await asyncio.sleep(0)
        assert (streamed.held_bytes, budget.held) == (150, 150)
