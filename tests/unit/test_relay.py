"""The output relay: in order, masked, each byte once; and a walked-away stream cut to its head."""

from __future__ import annotations

import pytest

from sandboxd.agent import ProtocolError
from sandboxd.models import OutputChunk, OutputDropped
from sandboxd.relay import OutputRelay, partial_character
from sandboxd.secrets import BytesRedactor

SECRET = "hunter2-very-secret"


def relay(secrets: dict[str, str] | None = None) -> OutputRelay:
    return OutputRelay({stream: BytesRedactor(secrets or {}) for stream in ("stdout", "stderr")})


def deliver(output: OutputRelay) -> list[OutputChunk | OutputDropped]:
    """What a caller takes now, acknowledged as it goes."""
    events = []
    for event, through in output.take():
        events.append(event)
        output.delivered_through(through)
    return events


def text(events: list[OutputChunk | OutputDropped]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, OutputChunk))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0),
        (b"abc", 0),
        ("é".encode(), 0),
        ("é".encode()[:1], 1),
        (b"x" + "€".encode()[:2], 2),
        (b"x" + "𝄞".encode()[:3], 3),
        (b"x" + "𝄞".encode(), 0),
        (b"\x80\x80\x80\x80", 0),  # not UTF-8: nothing to keep whole
        (b"\xff", 0),
    ],
)
def test_partial_character(data: bytes, expected: int) -> None:
    assert partial_character(data) == expected


class TestRelay:
    async def test_in_order_each_byte_once(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"hello ")
        output.add_output("stdout", 0, b"hello ")  # sent again after a reconnect
        output.add_output("stdout", 3, b"lo world")  # overlapping: only the new part counts
        assert text(deliver(output)) == b"hello world"
        assert (output.delivered, output.ack_position()) == (11, (11, 0))
        with pytest.raises(ProtocolError, match="offset 20, expected 11"):
            output.add_output("stdout", 20, b"x")

    async def test_a_secret_split_across_frames_is_masked_and_not_acknowledged_early(self) -> None:
        output = relay({"TOKEN": SECRET})
        output.add_output("stdout", 0, b"key=" + SECRET[:5].encode())
        assert text(deliver(output)) == b"key="
        assert output.ack_position() == (4, 0)  # the masking holds the rest: the agent keeps it
        output.add_output("stdout", 9, SECRET[5:].encode() + b"\n")
        assert text(deliver(output)) == b"[REDACTED:TOKEN]\n"

    async def test_trim_keeps_the_head_and_counts_the_rest(self) -> None:
        """A caller left 3 MiB in flight; the session keeps 1 MiB: the head stays, the rest is one gap."""
        output = relay()
        for offset in range(0, 3 << 20, 256 << 10):
            output.add_output("stdout", offset, b"x" * (256 << 10))
        output.hold(1 << 20)
        output.add_output("stdout", 3 << 20, b"y" * 1024)  # arrives while the agent is asked
        assert text(deliver(output)) == b"x" * (1 << 20)  # a caller back already gets the head, no more
        assert output.pending  # and waits for the answer
        # The agent holds 1 MiB more than arrived: that is dropped too, and its frames are ignored.
        assert output.trim(4 << 20) == 3 << 20
        output.add_output("stdout", (3 << 20) + 1024, b"y" * 1024)  # on its way before the trim
        assert (output.dropped_bytes, output.trimmed_bytes, output.received) == (3 << 20, 3 << 20, 4 << 20)
        assert deliver(output) == [OutputDropped(dropped_bytes=3 << 20)]
        assert output.ack_position() == (4 << 20, 0)  # the agent forgets the gap's bytes
        output.add_gap(4 << 20, 500)  # the agent's own gap follows, told as usual
        output.add_output("stdout", 4 << 20, b"after")
        assert deliver(output) == [OutputDropped(dropped_bytes=500), OutputChunk(stream="stdout", data=b"after")]

    async def test_trim_splits_a_frame_and_never_a_character(self) -> None:
        output = relay()
        output.add_output("stdout", 0, ("é" * 100).encode())  # 200 bytes in one frame
        output.hold(51)  # 51 bytes would end inside the 26th character: 50 stay
        assert output.trim(200) == 150
        assert deliver(output) == [
            OutputChunk(stream="stdout", data=("é" * 25).encode()),
            OutputDropped(dropped_bytes=150),
        ]

    async def test_a_frame_ending_inside_a_character_leaves_it_to_the_gap(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"ab" + "€".encode()[:1])
        output.add_output("stdout", 3, "€".encode()[1:] + b"cd")
        output.hold(4)  # the head would end inside the euro sign, which began in the first frame
        assert output.trim(7) == 5
        assert deliver(output) == [OutputChunk(stream="stdout", data=b"ab"), OutputDropped(dropped_bytes=5)]

    async def test_with_nothing_beyond_the_head_nothing_is_dropped(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"abc")
        output.hold(1024)
        output.add_output("stdout", 3, b"def")  # within the head: not held back
        assert output.trim(6) == 0
        assert text(deliver(output)) == b"abcdef"
        output.hold(2)
        output.add_output("stdout", 6, b"ghij")
        assert text(deliver(output)) == b""  # what arrives while the agent is asked waits for its answer
        output.release()  # the question could not be sent: what was held back goes
        assert text(deliver(output)) == b"ghij"
        assert output.dropped_bytes == 0

    async def test_a_masked_frame_is_not_split(self) -> None:
        """A frame whose bytes masking changed cannot be cut byte for byte: it goes into the gap whole."""
        output = relay({"TOKEN": SECRET})
        output.add_output("stdout", 0, b"a" * 10)
        output.add_output("stdout", 10, SECRET.encode() + b"b" * 100)
        output.hold(20)
        assert output.trim(10 + len(SECRET) + 100) == len(SECRET) + 100
        assert deliver(output) == [
            OutputChunk(stream="stdout", data=b"a" * 10),
            OutputDropped(dropped_bytes=len(SECRET) + 100),
        ]

    async def test_a_reconnect_before_the_trim_is_told_undoes_it(self) -> None:
        """The agent sends again from its acknowledgement: what the trim dropped comes after all."""
        output = relay()
        output.add_output("stdout", 0, b"x" * 100)
        output.hold(10)
        assert output.trim(100) == 90
        output.rewind(0)
        assert (output.dropped_bytes, output.trimmed_bytes, output.received) == (0, 0, 0)
        output.add_output("stdout", 0, b"x" * 100)
        assert text(deliver(output)) == b"x" * 100

    async def test_a_told_trim_stays(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"x" * 100)
        output.hold(10)
        output.trim(100)
        deliver(output)
        output.rewind(100)
        assert (output.dropped_bytes, output.delivered) == (90, 100)

    async def test_a_session_that_fails_while_holding_gives_what_it_held(self) -> None:
        """No answer will come: nothing stays held back, and the end is not kept waiting."""
        output = relay()
        output.add_output("stdout", 0, b"x" * 100)
        output.hold(10)
        output.close()
        assert text(deliver(output)) == b"x" * 100
        assert (output.pending, output.complete) == (False, True)

    async def test_the_agents_own_gap_at_the_end_is_told_after_the_trim_once(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"x" * 100)
        output.hold(10)
        output.add_gap(100, 40)  # the agent started dropping before it answered
        assert output.trim(100) == 90
        assert deliver(output) == [
            OutputChunk(stream="stdout", data=b"x" * 10),
            OutputDropped(dropped_bytes=90),
            OutputDropped(dropped_bytes=40),
        ]
        assert output.ack_position() == (100, 40)
        output.add_gap(100, 40)  # told again: nothing new
        output.add_gap(100, 55)  # grown: only the growth
        assert deliver(output) == [OutputDropped(dropped_bytes=15)]
        assert output.dropped_bytes == 90 + 55

    async def test_a_caller_that_leaves_again_before_the_answer_gets_its_own_hold(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"a" * 100)
        output.hold(10)
        assert text(deliver(output)) == b"a" * 10  # a second caller, back at once
        output.hold(10)  # ... and gone again
        assert output.trim(100) == 90
        deliver(output)
        output.add_output("stdout", 100, b"b" * 100)  # what it left after the first answer
        assert output.trim(200) == 90  # the second answer
        assert deliver(output) == [OutputChunk(stream="stdout", data=b"b" * 10), OutputDropped(dropped_bytes=90)]

    async def test_what_the_masking_holds_before_the_cut_is_kept(self) -> None:
        """stderr's held-back start of a would-be secret lies in the head: it is delivered, not lost."""
        output = relay({"TOKEN": SECRET})
        output.add_output("stderr", 0, b"e" + SECRET[:4].encode())  # "hunt" held: it may be the secret
        output.add_output("stdout", 5, b"o" * 100)
        output.hold(20)
        assert output.trim(105) == 85
        events = deliver(output)
        assert events[-1] == OutputDropped(dropped_bytes=85)
        assert [(e.stream, e.data) for e in events[:-1] if isinstance(e, OutputChunk)] == [
            ("stderr", b"e"),
            ("stdout", b"o" * 15),
            ("stderr", SECRET[:4].encode()),
        ]


class TestResume:
    """A caller that goes on from its position gets every byte after it once, none before (issue 27)."""

    def test_positions_are_where_a_caller_is_once_it_has_the_event(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"abc")
        output.add_output("stderr", 3, b"de")
        positions = []
        for _event, through in output.take():
            positions.append(output.position_after(through))
            output.delivered_through(through)
        assert positions == [3, 5]

    def test_a_position_stops_short_of_what_the_masking_holds(self) -> None:
        output = relay({"demo": SECRET})
        output.add_output("stdout", 0, b"ok " + SECRET.encode()[:4])  # held: maybe the secret
        output.add_output("stderr", 7, b"err")
        assert [output.position_after(through) for _event, through in output.take()] == [3, 3]

    def test_a_daemon_that_took_over_skips_what_the_caller_had(self) -> None:
        """The successor starts at the agent's acknowledgement, behind the caller: it goes on from the caller."""
        output = relay()
        output.resume(100, 0)
        output.add_output("stdout", 100, b"0123456789")
        output.resume_at(104, 100)
        assert not output.resend
        assert text(deliver(output)) == b"456789"
        output.add_output("stdout", 110, b"X")
        assert text(deliver(output)) == b"X"

    def test_a_caller_ahead_of_all_that_arrived_waits_for_the_agent_to_get_there(self) -> None:
        output = relay()
        output.resume(100, 0)
        output.resume_at(105, 100)
        output.add_output("stdout", 100, b"0123456789")  # sent again from the acknowledgement
        assert text(deliver(output)) == b"56789"

    def test_a_caller_behind_gets_the_agent_to_send_again(self) -> None:
        """Bytes lost in flight on a broken stream: the agent sends from its acknowledgement, each byte once."""
        output = relay()
        output.add_output("stdout", 0, b"0123456789")
        assert text(deliver(output)) == b"0123456789"  # the caller got only "0123"
        output.resume_at(4, 2)
        assert output.resend
        output.add_output("stdout", 2, b"23456789ab")  # the agent, from its acknowledgement
        assert text(deliver(output)) == b"456789ab"

    def test_what_the_agent_forgot_comes_as_a_gap_never_silently(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"0123456789")
        deliver(output)
        output.resume_at(4, 8)  # the agent was told it may forget up to 8
        output.add_output("stdout", 8, b"89")
        events = deliver(output)
        assert events[0] == OutputDropped(dropped_bytes=4)
        assert text(events) == b"89"
        assert output.dropped_bytes == 4

    def test_an_agent_that_cannot_send_again_makes_it_a_gap(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"0123456789")
        deliver(output)
        output.resume_at(4, 2, resendable=False)
        assert not output.resend
        assert deliver(output) == [OutputDropped(dropped_bytes=6)]
        output.add_output("stdout", 10, b"ab")
        assert text(deliver(output)) == b"ab"

    def test_no_caller_can_be_past_what_arrived_or_what_the_agent_said_it_produced(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"0123")
        assert output.reach == 4
        taken_over = relay()
        taken_over.resume(10, 0, end=25)  # the agent's output ended at 25 when it said so
        assert taken_over.reach == 25

    def test_a_position_inside_a_masked_value_never_shows_its_rest(self) -> None:
        """A forged position in the middle of a secret: the masking starts again where it held nothing."""
        output = relay({"demo": SECRET})
        output.add_output("stdout", 0, b"x" + SECRET.encode() + b"\n")
        assert text(deliver(output)) == b"x[REDACTED:demo]\n"
        output.resume_at(6, 0)  # inside the value; the agent was told nothing yet
        assert output.resend
        output.add_output("stdout", 0, b"x" + SECRET.encode() + b"\n")  # sent again from its acknowledgement
        again = text(deliver(output))
        assert SECRET[5:].encode() not in again and b"[REDACTED:demo]" in again

    def test_a_relay_that_masks_says_so(self) -> None:
        """Its acknowledgements then keep no replay (``OutputFlow.next(replay=False)``): each is where
        the masking held nothing, so a daemon that takes the session over masks from a clean start."""
        assert relay({"demo": SECRET}).masking
        assert not relay().masking


class Meter:
    """A budget's view of a relay: the bytes it says it holds."""

    def __init__(self) -> None:
        self.held = 0

    def held_changed(self, delta: int) -> None:
        self.held += delta


class TestNothingLostSilently:
    """A stream ends with all output and the exit, or a gap of the missing bytes and the exit."""

    def test_a_close_before_the_output_came_is_a_gap_of_what_is_missing(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"1\n2\n")
        output.set_end(588_895)  # the exit came; most of the output is still on its way
        assert not output.complete
        output.close()  # the session is let go (its workspace deleted, say)
        events = deliver(output)
        assert (text(events), events[-1]) == (b"1\n2\n", OutputDropped(dropped_bytes=588_895 - 4))
        assert (output.complete, output.dropped_bytes, output.trimmed_bytes) == (True, 588_891, 588_891)

    def test_a_close_with_nothing_come_at_all_is_a_gap_of_all_of_it(self) -> None:
        output = relay()
        output.set_end(100)
        output.close()
        assert deliver(output) == [OutputDropped(dropped_bytes=100)]

    def test_a_close_after_everything_came_adds_nothing(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"all")
        output.set_end(3)
        output.close()
        assert deliver(output) == [OutputChunk(stream="stdout", data=b"all")]
        assert output.dropped_bytes == 0

    def test_a_close_with_no_exit_known_adds_no_gap(self) -> None:
        """The session failed: its status is the error; no byte count can be known."""
        output = relay()
        output.add_output("stdout", 0, b"part")
        output.close()
        assert deliver(output) == [OutputChunk(stream="stdout", data=b"part")]


class TestHeldBytes:
    def test_the_meter_follows_what_callers_have_not_taken(self) -> None:
        meter = Meter()
        output = OutputRelay({s: BytesRedactor({}) for s in ("stdout", "stderr")}, meter=meter)
        output.add_output("stdout", 0, b"x" * 1000)
        output.add_output("stderr", 1000, b"y" * 500)
        assert (output.held_bytes, meter.held) == (1500, 1500)
        deliver(output)
        assert (output.held_bytes, meter.held) == (0, 0)
        output.add_output("stdout", 1500, b"z" * 300)
        output.forget()
        assert (output.held_bytes, meter.held) == (0, 0)

    def test_given_back_output_comes_again_from_the_agent_and_stale_frames_are_let_go(self) -> None:
        """Nobody streams: what is held goes; frames sent before the agent read the ask to send
        again are let go, and what it sends again from its acknowledgement comes once, in order."""
        meter = Meter()
        output = OutputRelay({s: BytesRedactor({}) for s in ("stdout", "stderr")}, meter=meter)
        output.add_output("stdout", 0, b"abc")
        assert text(deliver(output)) == b"abc"
        output.add_output("stdout", 3, b"defgh")
        output.set_end(12)
        assert output.give_back(3) == 5
        assert (output.held_bytes, meter.held, output.received, output.resend, output.complete) == (
            0,
            0,
            3,
            True,
            False,
        )
        output.add_output("stdout", 8, b"ijkl")  # in flight before the agent read the ask: stale
        assert output.received == 3
        output.add_output("stdout", 3, b"defghijkl")  # sent again from the acknowledgement
        assert (text(deliver(output)), output.complete) == (b"defghijkl", True)
        with pytest.raises(ProtocolError, match="offset 20, expected 12"):
            output.add_output("stdout", 20, b"x")  # once sent again, a frame out of place is an error again

    def test_nothing_is_given_back_while_a_hold_waits_or_once_closed(self) -> None:
        output = relay()
        output.add_output("stdout", 0, b"x" * 100)
        output.hold(10)
        assert output.give_back(0) == 0
        output.trim(100)
        output.close()
        assert output.give_back(0) == 0
