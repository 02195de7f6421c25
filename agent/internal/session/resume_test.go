//go:build linux

package session

import (
	"encoding/binary"
	"testing"
	"time"

	"sandboxd/agent/internal/proto"
)

// outputFrame is the next output frame of c, nothing acknowledged: its offset and bytes.
func outputFrame(t *testing.T, c *call) (uint64, string) {
	t.Helper()
	for {
		select {
		case f := <-c.frames:
			if f.Kind == proto.Output {
				return binary.BigEndian.Uint64(f.Payload[1:9]), string(f.Payload[9:])
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no output frame in 30 s")
		}
	}
}

func TestAResendSendsAgainFromTheAcknowledgement(t *testing.T) {
	c := start(t, "printf abcdef; read x", nil)
	got := ""
	for len(got) < 6 {
		_, data := outputFrame(t, c)
		got += data
	}
	if got != "abcdef" {
		t.Fatalf("output %q", got)
	}
	c.s.Pull(proto.PullMsg{Ack: 2, Until: 1 << 40, Reader: true, Resend: true}) // "cdef" was lost on the way
	offset, data := outputFrame(t, c)
	if offset != 2 || data != "cdef" {
		t.Fatalf("sent again at %d: %q, want 2: \"cdef\"", offset, data)
	}
}

func TestAReaderAwayKeepsBackPressureForItsGraceOnly(t *testing.T) {
	c := start(t, "read x", nil) // start's pull: a reader
	c.s.ReaderAway(50 * time.Millisecond)
	if !c.s.buf.Reading() || !c.s.State().Reading {
		t.Fatal("the back-pressure went with the connection")
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.s.buf.Reading() {
		if time.Now().After(deadline) {
			t.Fatal("the back-pressure outlived its grace")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.s.Pull(proto.PullMsg{Until: 1 << 40, Reader: true}) // a daemon is back, and a caller reads
	c.s.ReaderAway(50 * time.Millisecond)
	c.s.Pull(proto.PullMsg{Until: 1 << 40, Reader: true}) // back again within the grace
	time.Sleep(200 * time.Millisecond)                    // past the grace: its timer must not act
	if !c.s.buf.Reading() {
		t.Fatal("a grace a daemon's pull ended still took the reader away")
	}
}
