package agent

import (
	"bytes"
	"testing"
	"time"
)

// settle is how long a test gives a goroutine to get past a wait that must not end: the
// assertion is that it is still blocked, so no readiness signal can stand in for it.
const settle = 50 * time.Millisecond

func TestAWindowRefusesDataBeyondWhatItHolds(t *testing.T) {
	w := newWindow(10, 8, 4)
	if !w.push([]byte("12345")) {
		t.Fatal("5 bytes of an 8-byte window were refused")
	}
	if w.push([]byte("6789")) {
		t.Fatal("9 bytes held in an 8-byte window")
	}
	if !w.push([]byte("678")) {
		t.Fatal("8 bytes of an 8-byte window were refused")
	}
	chunk, ok := w.next()
	if !ok || string(chunk) != "12345" {
		t.Fatalf("next = %q, %v; want the first chunk", chunk, ok)
	}
	// Taken from the queue is not written yet: the room comes back with took.
	if w.push([]byte("a")) {
		t.Fatal("a byte beyond the window was held before the chunk was written")
	}
	w.took(len(chunk))
	if !w.push([]byte("abcde")) {
		t.Fatal("the room of a written chunk did not come back")
	}
}

func TestAWindowHandsOutDataInOrderThenItsEnd(t *testing.T) {
	w := newWindow(10, 100, 4)
	w.push([]byte("ab"))
	w.push([]byte("cd"))
	w.end()
	w.push([]byte("late")) // after the end: taken and forgotten
	var got []byte
	for {
		chunk, ok := w.next()
		if !ok {
			t.Fatal("next said the channel was gone")
		}
		if chunk == nil {
			break
		}
		got = append(got, chunk...)
	}
	if string(got) != "abcd" {
		t.Fatalf("got %q, want %q", got, "abcd")
	}
}

func TestAWindowReportsWrittenBytesEveryStepAndWhenItRunsDry(t *testing.T) {
	w := newWindow(10, 100, 4)
	for _, data := range []string{"ab", "cd", "ef", "g"} {
		w.push([]byte(data))
	}
	var reports []uint64
	for i := 0; i < 4; i++ {
		chunk, _ := w.next()
		if took, report := w.took(len(chunk)); report {
			reports = append(reports, took)
		}
	}
	// 2 is short of a step; 4 makes one; 6 is 2 past it; 7 empties the queue.
	if want := []uint64{4, 7}; !equalUint64s(reports, want) {
		t.Fatalf("reports %v, want %v", reports, want)
	}
}

func TestAWindowWaitsForAnAcknowledgementOnceFull(t *testing.T) {
	w := newWindow(10, 100, 4)
	if room, ok := w.waitRoom(); !ok || room != 10 {
		t.Fatalf("an empty window has room %d, %v; want 10", room, ok)
	}
	w.count(10)
	rooms := make(chan int, 1)
	go func() {
		room, _ := w.waitRoom()
		rooms <- room
	}()
	select {
	case room := <-rooms:
		t.Fatalf("a full window gave room %d", room)
	case <-time.After(settle):
	}
	w.ack(3)
	select {
	case room := <-rooms:
		if room != 3 {
			t.Fatalf("room after an ack of 3 is %d, want 3", room)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an acknowledgement did not end the wait")
	}
}

func TestAWindowIgnoresAnAckBackwardsOrBeyondWhatWasSent(t *testing.T) {
	w := newWindow(10, 100, 4)
	w.count(6)
	w.ack(4)
	w.ack(2)  // backwards
	w.ack(99) // beyond what was sent
	if room, _ := w.waitRoom(); room != 8 {
		t.Fatalf("room %d, want 8 (6 sent, 4 acknowledged)", room)
	}
}

func TestClosingAWindowEndsEveryWaitAndDropsWhatItHeld(t *testing.T) {
	w := newWindow(1, 100, 4)
	w.count(1)
	ended := make(chan string, 2)
	go func() {
		if _, ok := w.waitRoom(); !ok {
			ended <- "waitRoom"
		}
	}()
	go func() {
		if _, ok := w.next(); !ok {
			ended <- "next"
		}
	}()
	w.mu.Lock()
	already := w.closeLocked()
	w.mu.Unlock()
	if already {
		t.Fatal("a first close said the window was closed already")
	}
	for i := 0; i < 2; i++ {
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			t.Fatal("a wait outlived the window's close")
		}
	}
	if !w.push(bytes.Repeat([]byte("x"), 1000)) {
		t.Fatal("data for a closed channel was called a protocol error")
	}
	if chunk, ok := w.next(); ok || chunk != nil {
		t.Fatal("next handed out data after the close")
	}
	w.mu.Lock()
	again := w.closeLocked()
	w.mu.Unlock()
	if !again || !w.isDone() {
		t.Fatalf("a second close: already %v, done %v; want both true", again, w.isDone())
	}
}

func equalUint64s(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
