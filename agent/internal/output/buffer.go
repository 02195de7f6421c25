// Package output holds a command's output until the daemon acknowledges it.
//
// Output bytes of both streams are numbered from 0 in the order they were read.
// The buffer keeps the bytes from the daemon's last acknowledgement on, at most
// Cap of them. When it is full, a session with a reader waits for room (the
// command blocks on its writes: back-pressure) and one without drops what does
// not fit, keeping the head, and remembers where the gap is.
package output

import (
	"sync"
)

// Piece is a run of output bytes of one stream, or (Gap > 0) a gap where Gap
// bytes were dropped.
type Piece struct {
	Stream byte
	Offset uint64
	Data   []byte
	Gap    uint64
}

// Buffer is the bounded, acknowledged output of one command. It is safe for
// concurrent use.
type Buffer struct {
	mu      sync.Mutex
	room    *sync.Cond
	cap     int
	pieces  []Piece // in offset order; gaps sit between data pieces
	ack     uint64  // everything before this was delivered
	ackGap  uint64  // and this many bytes of a gap at ack were reported
	end     uint64  // offset of the next byte to be kept
	held    int     // data bytes held (end - ack, gaps aside)
	dropped uint64  // all bytes dropped so far
	reader  bool
	window  int // with a reader: how much the daemon lets be in flight beyond its ack
	closed  bool
	changed chan struct{} // closed and replaced whenever something is appended
}

// New returns an empty buffer holding at most capBytes unacknowledged bytes.
func New(capBytes int) *Buffer {
	if capBytes <= 0 {
		capBytes = 1 << 20
	}
	b := &Buffer{cap: capBytes, changed: make(chan struct{})}
	b.room = sync.NewCond(&b.mu)
	return b
}

// MaxWindow is the most a reader's window may make the buffer hold, whatever the daemon
// says (it asks for this much while a caller streams): the agent's memory stays bounded by this and Cap.
const MaxWindow = 16 << 20

// SetReader says whether a caller is reading the output now (back-pressure) or not (drops),
// and, with one, how many bytes the daemon lets be in flight beyond its acknowledgement
// (at most MaxWindow of them are held).
func (b *Buffer) SetReader(reader bool, window int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reader = reader
	b.window = window
	if window < 0 || window > MaxWindow {
		b.window = MaxWindow
	}
	b.room.Broadcast()
}

// Reading says whether the buffer holds output back for a reader (back-pressure) rather than dropping it.
func (b *Buffer) Reading() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reader
}

// limit is the most bytes held: Cap, or while a caller reads the daemon's window if larger
// (bytes on their way to it must be kept until it acknowledges them).
func (b *Buffer) limit() int {
	if b.reader && b.window > b.cap {
		return b.window
	}
	return b.cap
}

// Append adds data read from stream. With a reader it waits for room; without one
// it keeps what fits and counts the rest as dropped. It returns false once the
// buffer is closed.
func (b *Buffer) Append(stream byte, data []byte) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(data) > 0 {
		if b.closed {
			return false
		}
		space := b.limit() - b.held
		if space <= 0 {
			if b.reader {
				b.room.Wait()
				continue
			}
			b.drop(uint64(len(data)))
			break
		}
		take := len(data)
		if take > space {
			take = space
			if !b.reader {
				// What is kept ends on a character: the gap, not the head, takes a split one.
				take = utf8Cut(data, take)
				if take == 0 {
					b.drop(uint64(len(data)))
					break
				}
			}
		}
		b.keep(stream, data[:take])
		data = data[take:]
	}
	return !b.closed
}

func (b *Buffer) keep(stream byte, data []byte) {
	chunk := make([]byte, len(data))
	copy(chunk, data)
	if n := len(b.pieces); n > 0 {
		last := &b.pieces[n-1]
		// Merge small consecutive reads of one stream (a line at a time) into one piece.
		if last.Gap == 0 && last.Stream == stream && last.Offset+uint64(len(last.Data)) == b.end && len(last.Data) < 64*1024 {
			last.Data = append(last.Data, chunk...)
			b.end += uint64(len(chunk))
			b.held += len(chunk)
			b.notify()
			return
		}
	}
	b.pieces = append(b.pieces, Piece{Stream: stream, Offset: b.end, Data: chunk})
	b.end += uint64(len(chunk))
	b.held += len(chunk)
	b.notify()
}

func (b *Buffer) drop(n uint64) {
	b.dropped += n
	if k := len(b.pieces); k > 0 && b.pieces[k-1].Gap > 0 && b.pieces[k-1].Offset == b.end {
		b.pieces[k-1].Gap += n
	} else {
		b.pieces = append(b.pieces, Piece{Offset: b.end, Gap: n})
	}
	b.notify()
}

func (b *Buffer) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// Changed returns a channel closed at the next append (or drop).
func (b *Buffer) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

// Ack forgets everything before offset (the daemon has delivered it), and gapAcked
// bytes of a gap at offset (reported as well).
func (b *Buffer) Ack(offset, gapAcked uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if offset > b.end {
		offset = b.end
	}
	if offset < b.ack || (offset == b.ack && gapAcked <= b.ackGap) {
		return
	}
	if offset > b.ack {
		b.ackGap = 0
	}
	b.ack = offset
	if gapAcked > b.ackGap {
		b.ackGap = gapAcked
	}
	kept := b.pieces[:0]
	for _, p := range b.pieces {
		switch {
		case p.Gap > 0:
			if p.Offset >= offset {
				kept = append(kept, p)
			}
		case p.Offset+uint64(len(p.Data)) <= offset:
			b.held -= len(p.Data)
		case p.Offset < offset:
			cut := offset - p.Offset
			b.held -= int(cut)
			p.Data = p.Data[cut:]
			p.Offset = offset
			kept = append(kept, p)
		default:
			kept = append(kept, p)
		}
	}
	// Let the pieces' memory go: the slice is reused from the front.
	for i := len(kept); i < len(b.pieces); i++ {
		b.pieces[i] = Piece{}
	}
	b.pieces = kept
	b.room.Broadcast()
}

// Since returns the pieces from offset on, up to until, at most maxBytes of data in
// all. A gap at offset is included when it has grown past gapSent, the bytes of it
// already reported (a gap grows while output keeps being dropped there). A gap's Gap
// is its whole size so far. The returned data is shared: do not modify it.
func (b *Buffer) Since(offset, gapSent, until uint64, maxBytes int) []Piece {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Piece
	for _, p := range b.pieces {
		if p.Gap > 0 {
			if (p.Offset == offset && p.Gap > gapSent) || (p.Offset > offset && p.Offset <= until) {
				out = append(out, p)
			}
			continue
		}
		start, stop := p.Offset, p.Offset+uint64(len(p.Data))
		if stop <= offset || start >= until {
			continue
		}
		if start < offset {
			start = offset
		}
		if stop > until {
			stop = until
		}
		data := p.Data[start-p.Offset : stop-p.Offset]
		if len(data) > maxBytes {
			data = data[:maxBytes]
		}
		out = append(out, Piece{Stream: p.Stream, Offset: start, Data: data})
		maxBytes -= len(data)
		if maxBytes <= 0 {
			break
		}
	}
	return out
}

// State returns the acknowledged position (offset and gap bytes reported there), the
// end, and all bytes dropped so far.
func (b *Buffer) State() (ack, ackGap, end, dropped uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ack, b.ackGap, b.end, b.dropped
}

// Close wakes and refuses every appender; what is held stays readable.
func (b *Buffer) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.room.Broadcast()
}

// utf8Cut is the largest cut point at most limit that splits no UTF-8 sequence; bytes that
// are not UTF-8 are cut at limit exactly (it backs up at most three bytes).
func utf8Cut(data []byte, limit int) int {
	if limit >= len(data) {
		return len(data)
	}
	cut := limit
	for back := 0; cut > 0 && back < 3 && data[cut]&0xC0 == 0x80; back++ {
		cut--
	}
	if data[cut]&0xC0 == 0x80 {
		return limit
	}
	return cut
}
