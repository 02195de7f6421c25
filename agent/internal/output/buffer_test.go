package output

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

func data(pieces []Piece) []byte {
	var out []byte
	for _, p := range pieces {
		out = append(out, p.Data...)
	}
	return out
}

func TestKeepsOrderAcrossStreams(t *testing.T) {
	b := New(1024)
	b.Append('1', []byte("out1 "))
	b.Append('2', []byte("err "))
	b.Append('1', []byte("out2"))
	pieces := b.Since(0, 0, 1<<62, 1<<20)
	var streams []byte
	for _, p := range pieces {
		streams = append(streams, p.Stream)
	}
	if got := string(data(pieces)); got != "out1 err out2" {
		t.Fatalf("data %q", got)
	}
	if string(streams) != "121" {
		t.Fatalf("streams %q", streams)
	}
}

func TestWithoutReaderKeepsTheHeadAndMarksTheGap(t *testing.T) {
	b := New(10)
	b.Append('1', []byte("0123456789abcdef"))
	b.Append('1', []byte("ghij"))
	pieces := b.Since(0, 0, 1<<62, 1<<20)
	if got := string(data(pieces)); got != "0123456789" {
		t.Fatalf("kept %q", got)
	}
	last := pieces[len(pieces)-1]
	if last.Gap != 10 || last.Offset != 10 {
		t.Fatalf("gap %+v", last)
	}
	_, _, end, dropped := b.State()
	if end != 10 || dropped != 10 {
		t.Fatalf("end %d dropped %d", end, dropped)
	}
}

func TestAckMakesRoomAndGapsAreReportedOnce(t *testing.T) {
	b := New(4)
	b.Append('1', []byte("abcdef")) // keeps abcd, drops 2 at offset 4
	pieces := b.Since(0, 0, 1<<62, 1<<20)
	if len(pieces) != 2 || pieces[1].Gap != 2 {
		t.Fatalf("pieces %+v", pieces)
	}
	// Reported up to the gap: asking from there again gives nothing new...
	if again := b.Since(4, 2, 1<<62, 1<<20); len(again) != 0 {
		t.Fatalf("again %+v", again)
	}
	// ...until the gap grows.
	b.Append('1', []byte("g"))
	if grown := b.Since(4, 2, 1<<62, 1<<20); len(grown) != 1 || grown[0].Gap != 3 {
		t.Fatalf("grown %+v", grown)
	}
	b.Ack(4, 3)
	b.Append('1', []byte("hi"))
	rest := b.Since(4, 3, 1<<62, 1<<20)
	if got := string(data(rest)); got != "hi" || rest[0].Offset != 4 {
		t.Fatalf("after ack %+v", rest)
	}
	ack, ackGap, end, _ := b.State()
	if ack != 4 || ackGap != 3 || end != 6 {
		t.Fatalf("state %d %d %d", ack, ackGap, end)
	}
}

func TestReaderGetsBackPressureNotDrops(t *testing.T) {
	b := New(4)
	b.SetReader(true, 0)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		b.Append('1', []byte("abcdefgh")) // blocks after abcd until acked
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, end, _ := b.State()
		if end == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("first half never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	b.Ack(4, 0)
	wg.Wait()
	_, _, end, dropped := b.State()
	if end != 8 || dropped != 0 {
		t.Fatalf("end %d dropped %d", end, dropped)
	}
	if got := data(b.Since(4, 0, 1<<62, 1<<20)); !bytes.Equal(got, []byte("efgh")) {
		t.Fatalf("rest %q", got)
	}
}

func TestSinceRespectsLimitAndMax(t *testing.T) {
	b := New(1 << 20)
	b.Append('1', bytes.Repeat([]byte("x"), 100))
	if got := data(b.Since(10, 0, 30, 1<<20)); len(got) != 20 {
		t.Fatalf("until: %d", len(got))
	}
	if got := data(b.Since(0, 0, 100, 7)); len(got) != 7 {
		t.Fatalf("max: %d", len(got))
	}
}

func TestCloseWakesAWaitingAppender(t *testing.T) {
	b := New(1)
	b.SetReader(true, 0)
	done := make(chan bool)
	go func() { done <- b.Append('1', []byte("ab")) }()
	time.Sleep(10 * time.Millisecond)
	b.Close()
	select {
	case ok := <-done:
		if ok {
			t.Fatal("append on a closed buffer reported success")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("appender still waiting")
	}
}

func TestDropsNeverSplitACharacter(t *testing.T) {
	b := New(4)
	b.Append('1', []byte("abcé")) // "é" is 2 bytes: 5 in all, 4 of room
	if got := string(data(b.Since(0, 0, 1<<62, 1<<20))); got != "abc" {
		t.Fatalf("kept %q", got)
	}
	if _, _, end, dropped := b.State(); end != 3 || dropped != 2 {
		t.Fatalf("end %d dropped %d", end, dropped)
	}
}

func TestAReadersWindowLetsMoreBeHeldThanCap(t *testing.T) {
	b := New(4)
	b.SetReader(true, 10) // the daemon takes up to 10 bytes beyond its ack
	b.Append('1', []byte("0123456789"))
	if _, _, end, dropped := b.State(); end != 10 || dropped != 0 {
		t.Fatalf("end %d dropped %d, want all 10 held", end, dropped)
	}
	b.SetReader(false, 0) // the reader went: what is held stays, more is dropped
	b.Append('1', []byte("x"))
	if _, _, end, dropped := b.State(); end != 10 || dropped != 1 {
		t.Fatalf("end %d dropped %d, want 10 kept and 1 dropped", end, dropped)
	}
}
