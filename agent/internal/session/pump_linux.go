//go:build linux

package session

import (
	"encoding/binary"
	"encoding/json"
	"time"

	"sandboxd/agent/internal/output"
	"sandboxd/agent/internal/proto"
)

// sendChunk is the most output one frame carries.
const sendChunk = 256 << 10

// Pull acknowledges output and allows more to be sent.
func (s *Session) Pull(msg proto.PullMsg) {
	s.buf.Ack(msg.Ack, msg.AckGap)
	s.mu.Lock()
	s.readerAway++ // a daemon says who reads: a pending ReaderAway no longer decides
	if msg.Resend {
		ack, ackGap, _, _ := s.buf.State()
		s.cursor, s.cursorGap = ack, ackGap
		s.rewound++
	}
	if msg.Until > s.until {
		s.until = msg.Until
	}
	window := 0
	if s.until > msg.Ack {
		window = int(s.until - msg.Ack)
	}
	s.buf.SetReader(msg.Reader, window)
	if msg.Ack > s.cursor || (msg.Ack == s.cursor && msg.AckGap > s.cursorGap) {
		s.cursor, s.cursorGap = msg.Ack, msg.AckGap
	}
	s.mu.Unlock()
	if msg.Tail {
		// With no reader and more held than Cap, nothing more is kept until an
		// acknowledgement: the end told here stays the end of what is held.
		_, _, end, _ := s.buf.State()
		s.send(proto.Tail, proto.TailMsg{End: end})
	}
	s.poke()
}

// ReaderGone says no daemon is connected: the output is kept up to the buffer's size, and
// what does not fit is dropped (counted) rather than blocking the command.
func (s *Session) ReaderGone() { s.buf.SetReader(false, 0) }

// ReaderGrace is how long a session whose output a caller was reading when the daemon's
// connection broke keeps its back-pressure: a restarting daemon and the caller's client come
// back within it for the very next byte (nothing dropped meanwhile; the command waits on its
// pipe, as under a slow reader). Then the output is kept up to the buffer's size, as with no reader.
const ReaderGrace = 30 * time.Second

// ReaderAway says the daemon's connection broke: a session being read keeps its
// back-pressure for grace, unless a daemon's pull says otherwise first (ReaderGone at once
// for one nobody read).
func (s *Session) ReaderAway(grace time.Duration) {
	if !s.buf.Reading() {
		return
	}
	s.mu.Lock()
	s.readerAway++
	generation := s.readerAway
	s.mu.Unlock()
	time.AfterFunc(grace, func() {
		s.mu.Lock()
		still := s.readerAway == generation
		s.mu.Unlock()
		if still {
			s.ReaderGone()
		}
	})
}

// Reconnected restarts sending from what the daemon acknowledged (it lost the rest).
func (s *Session) Reconnected() {
	ack, ackGap, _, _ := s.buf.State()
	s.mu.Lock()
	s.cursor, s.cursorGap, s.until = ack, ackGap, ack
	s.rewound++
	s.mu.Unlock()
	s.poke()
}

// Wake makes the session look again for frames it may send.
func (s *Session) Wake() { s.poke() }

// pump sends output between the cursor and the daemon's limit.
//
// Output read in small pieces while the previous frame left less than coalesceWindow ago
// waits out the rest of that window, so a flood goes in frames of up to sendChunk (each
// frame costs the daemon the same, whatever its size) and a lone prompt goes at once.
func (s *Session) pump() {
	var lastSent time.Time
	for {
		changed := s.buf.Changed()
		connection := s.host.Connected()
		s.mu.Lock()
		cursor, cursorGap, until, discarded, rewound := s.cursor, s.cursorGap, s.until, s.discarded, s.rewound
		s.mu.Unlock()
		if discarded {
			return
		}
		pieces := s.buf.Since(cursor, cursorGap, until, sendChunk)
		size := pieceBytes(pieces)
		if wait := coalesceWindow - time.Since(lastSent); wait > 0 && size < sendChunk {
			select {
			case <-time.After(wait):
			case <-s.exiting:
				lastSent = time.Time{}
			}
			continue
		}
		sent := false
		for _, f := range frames(pieces, size) {
			var ok bool
			if f.Gap > 0 {
				body, _ := json.Marshal(proto.DroppedMsg{Offset: f.Offset, Bytes: f.Gap})
				ok = s.host.Send(proto.Dropped, s.Channel, body)
				cursor, cursorGap = f.Offset, f.Gap
			} else {
				ok = s.host.SendFrame(proto.InPlace(f.Data, proto.Output, s.Channel))
				cursor, cursorGap = f.Offset+uint64(len(f.Data)-outputHeader), 0
			}
			if !ok {
				break
			}
			sent = true
		}
		s.mu.Lock()
		// A resend or a reconnect while these frames went moved the cursor back on purpose:
		// what was just sent must not move it on again (the daemon asked for those bytes anew).
		if sent && s.rewound == rewound && (cursor > s.cursor || (cursor == s.cursor && cursorGap > s.cursorGap)) {
			s.cursor, s.cursorGap = cursor, cursorGap
		}
		s.mu.Unlock()
		if sent {
			lastSent = time.Now()
			continue
		}
		select {
		case <-changed:
		case <-s.wake:
		case <-connection:
		}
	}
}

// coalesceWindow is the shortest time between two frames of small output.
const coalesceWindow = 2 * time.Millisecond

// waitSent waits (briefly: a daemon may be away) until the pump has sent every byte up
// to end that the daemon allows, so that the exit comes after the output it accounts for.
func (s *Session) waitSent(end uint64) {
	s.poke()
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); {
		s.mu.Lock()
		limit := end
		if s.until < limit {
			limit = s.until
		}
		sent := s.cursor >= limit
		s.mu.Unlock()
		if sent {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func pieceBytes(pieces []output.Piece) int {
	n := 0
	for _, p := range pieces {
		n += len(p.Data)
	}
	return n
}

// outputHeader is what precedes the bytes in an output frame as built by frames: the
// frame header, then the stream byte and the offset.
const outputHeader = proto.HeaderSize + 9

// frames turns pieces (size bytes of data in all) into frames: a gap as it is, adjacent data
// of one stream merged into one output frame, built whole in Data (header room, stream
// byte, offset, bytes).
func frames(pieces []output.Piece, size int) []output.Piece {
	var out []output.Piece
	for _, p := range pieces {
		if p.Gap > 0 {
			out = append(out, p)
			continue
		}
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.Gap == 0 && last.Stream == p.Stream && last.Offset+uint64(len(last.Data)-outputHeader) == p.Offset {
				last.Data = append(last.Data, p.Data...)
				continue
			}
		}
		frame := make([]byte, outputHeader, outputHeader+size)
		frame[proto.HeaderSize] = p.Stream
		binary.BigEndian.PutUint64(frame[proto.HeaderSize+1:outputHeader], p.Offset)
		out = append(out, output.Piece{Stream: p.Stream, Offset: p.Offset, Data: append(frame, p.Data...)})
	}
	return out
}
