package agent

import "sync"

// window is the flow control of a channel that carries bytes both ways, a file operation's
// or a forwarded connection's. What the agent sends the daemon is counted against the
// daemon's acknowledgements (FileAck): at most out bytes are unacknowledged. What the
// daemon sends is held in an inbox until written where it goes, at most in bytes, and what
// was written is reported back (FileTook) every step bytes.
//
// Its mutex also guards the owner's fields that are decided together with done (the
// helper's pid, whether it exited...): an owner that starts and an end that comes
// meanwhile then agree which of them stops what was started.
type window struct {
	mu   sync.Mutex
	room *sync.Cond // broadcast on every change of what the waits below wait for

	out  uint64
	in   int
	step uint64

	sent  uint64 // bytes sent to the daemon
	acked uint64 // of which the daemon holds (never more than sent)
	input inbox  // the daemon's bytes not yet written
	done  bool   // the channel is gone: every wait ends
}

// newWindow returns the window of a channel that sends at most out bytes beyond the
// daemon's acknowledgement, holds at most in bytes of the daemon's, and reports written
// bytes every step.
func newWindow(out uint64, in int, step uint64) *window {
	w := &window{out: out, in: in, step: step}
	w.room = sync.NewCond(&w.mu)
	return w
}

// push queues the daemon's data (FileData); false when it would pass the window (the
// daemon broke the protocol). Data for a channel that is gone is taken and forgotten.
func (w *window) push(data []byte) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	fits := w.done || w.input.push(data, w.in)
	w.room.Broadcast()
	return fits
}

// end records that the daemon's side ended (FileEnd): next returns the end once the data
// before it is written.
func (w *window) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.input.ended = true
	w.room.Broadcast()
}

// ack records the daemon's acknowledgement of the first n bytes sent (FileAck). One that
// goes back, or beyond what was sent, changes nothing.
func (w *window) ack(n uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n > w.acked && n <= w.sent {
		w.acked = n
	}
	w.room.Broadcast()
}

// waitRoom waits while out bytes or more are unacknowledged, and returns how many more may
// be sent now; false once the channel is gone.
func (w *window) waitRoom() (int, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.sent-w.acked >= w.out && !w.done {
		w.room.Wait()
	}
	if w.done {
		return 0, false
	}
	return int(w.out - (w.sent - w.acked)), true
}

// count counts n more bytes as sent.
func (w *window) count(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sent += uint64(n)
}

// next waits for the daemon's next chunk and returns it: nil once only the end is left, and
// false once the channel is gone.
func (w *window) next() ([]byte, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for !w.input.ready() && !w.done {
		w.room.Wait()
	}
	if w.done {
		return nil, false
	}
	return w.input.pop(), true
}

// took counts n bytes of a chunk from next as written, and returns the total written and
// whether the daemon should hear of it now (FileTook).
func (w *window) took(n int) (uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.input.written(n, w.step)
}

// isDone says whether the channel is gone.
func (w *window) isDone() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done
}

// closeLocked ends the channel: what the daemon sent and nobody wrote is dropped, and every
// wait ends. It returns whether the channel had ended already. w.mu must be held.
func (w *window) closeLocked() bool {
	already := w.done
	w.done = true
	w.input.drop()
	w.room.Broadcast()
	return already
}
