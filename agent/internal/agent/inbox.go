package agent

// inbox holds the daemon's data for a channel until it is written where it goes (a file
// operation helper's stdin, a forwarded connection), within a window, and says when what
// was written is worth a FileTook report. Its owner's mutex guards it.
type inbox struct {
	chunks [][]byte
	held   int
	ended  bool // the daemon's side is done (FileEnd)
	took   uint64
	told   uint64
}

// push queues a copy of data; false when it would pass window (the daemon broke the protocol).
// Nothing is queued once the daemon's side ended.
func (q *inbox) push(data []byte, window int) bool {
	if q.held+len(data) > window {
		return false
	}
	if !q.ended {
		q.chunks = append(q.chunks, append([]byte(nil), data...))
		q.held += len(data)
	}
	return true
}

// ready says whether a pop has something to say: a chunk, or the end.
func (q *inbox) ready() bool { return len(q.chunks) > 0 || q.ended }

// pop takes the next chunk; nil once only the end is left.
func (q *inbox) pop() []byte {
	if len(q.chunks) == 0 {
		return nil
	}
	chunk := q.chunks[0]
	q.chunks = q.chunks[1:]
	return chunk
}

// written counts n bytes of a popped chunk as written, and returns the total written and
// whether the daemon should hear of it now (every step, and whenever the queue ran dry).
func (q *inbox) written(n int, step uint64) (uint64, bool) {
	q.held -= n
	q.took += uint64(n)
	report := q.took-q.told >= step || len(q.chunks) == 0
	if report {
		q.told = q.took
	}
	return q.took, report
}

// drop forgets what is queued (the channel is gone).
func (q *inbox) drop() { q.chunks, q.held = nil, 0 }
