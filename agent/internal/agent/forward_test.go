//go:build linux

package agent

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"sandboxd/agent/internal/proto"
)

// listen starts a TCP server on the loopback (the agent runs in the test's network
// namespace) that hands each connection to serve; it returns the port.
func listen(t *testing.T, serve func(net.Conn)) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// forwardFrame reads the next frame of channel, skipping the agent's other channels.
func (d *daemon) forwardFrame(channel uint32) proto.Frame {
	d.t.Helper()
	for {
		if frame := d.next(); frame.Channel == channel {
			return frame
		}
	}
}

// openForward connects to port and returns the channel once the agent said Connected.
func openForward(d *daemon, port int) uint32 {
	d.t.Helper()
	channel := nextChannel()
	d.send(proto.Connect, channel, proto.ConnectMsg{Port: port})
	if frame := d.forwardFrame(channel); frame.Kind != proto.Connected {
		d.t.Fatalf("connect to %d: frame %q %s, want connected", port, frame.Kind, frame.Payload)
	}
	return channel
}

func TestAForwardCarriesBothWaysAndEachEnd(t *testing.T) {
	port := listen(t, func(c net.Conn) {
		request, _ := io.ReadAll(c) // until the daemon's side ends
		_, _ = c.Write(append([]byte("got "), bytes.ToUpper(request)...))
	})
	d, welcome := connect(t)
	if !contains(welcome.Features, proto.FeatureForward) {
		t.Fatalf("features %v lack %q", welcome.Features, proto.FeatureForward)
	}
	channel := openForward(d, port)
	d.send(proto.FileData, channel, []byte("hello, "))
	d.send(proto.FileData, channel, []byte("world"))
	d.send(proto.FileEnd, channel, nil)
	var got []byte
	took := uint64(0)
	for {
		frame := d.forwardFrame(channel)
		switch frame.Kind {
		case proto.FileOut:
			got = append(got, frame.Payload...)
			d.send(proto.FileAck, channel, proto.FileAckMsg{Ack: uint64(len(got))})
			continue
		case proto.FileTook:
			var msg proto.FileTookMsg
			if err := json.Unmarshal(frame.Payload, &msg); err != nil {
				t.Fatal(err)
			}
			took = msg.Bytes
			continue
		case proto.HungUp:
		default:
			t.Fatalf("frame %q %s", frame.Kind, frame.Payload)
		}
		break
	}
	if string(got) != "got HELLO, WORLD" || took != 12 {
		t.Errorf("the server answered %q having taken %d bytes; want %q and 12", got, took, "got HELLO, WORLD")
	}
	d.send(proto.Discard, channel, nil)
}

func TestAForwardToAPortWithoutAListenerIsRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close() // nothing listens there now
	d, _ := connect(t)
	channel := nextChannel()
	d.send(proto.Connect, channel, proto.ConnectMsg{Port: port})
	frame := d.forwardFrame(channel)
	var reply proto.ErrorReply
	if frame.Kind != proto.ErrorMsg || json.Unmarshal(frame.Payload, &reply) != nil || reply.Code != "refused" {
		t.Fatalf("connect to a closed port: frame %q %s, want an error with code refused", frame.Kind, frame.Payload)
	}
	for _, bad := range []int{0, -1, 65536} {
		channel := nextChannel()
		d.send(proto.Connect, channel, proto.ConnectMsg{Port: bad})
		frame := d.forwardFrame(channel)
		if frame.Kind != proto.ErrorMsg || json.Unmarshal(frame.Payload, &reply) != nil || reply.Code != "protocol" {
			t.Errorf("connect to port %d: frame %q %s, want a protocol error", bad, frame.Kind, frame.Payload)
		}
	}
}

func TestAForwardSendsNoMoreThanItsWindowUnacknowledged(t *testing.T) {
	const total = 4 << 20
	payload := bytes.Repeat([]byte("0123456789abcdef"), total/16)
	port := listen(t, func(c net.Conn) { _, _ = c.Write(payload) })
	d, _ := connect(t)
	channel := openForward(d, port)
	var got []byte
	for len(got) < ForwardWindow {
		frame := d.forwardFrame(channel)
		if frame.Kind != proto.FileOut {
			t.Fatalf("frame %q %s before the window was full", frame.Kind, frame.Payload)
		}
		got = append(got, frame.Payload...)
	}
	if len(got) != ForwardWindow {
		t.Fatalf("%d bytes came without an ack; the window is %d", len(got), ForwardWindow)
	}
	// Nothing more may come until an ack: wait a while for a frame that must not arrive.
	_ = d.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if frame, err := d.reader.Read(); err == nil || !strings.Contains(err.Error(), "i/o timeout") {
		t.Fatalf("past the window without an ack: frame %q (%d bytes), err %v", frame.Kind, len(frame.Payload), err)
	}
	for {
		d.send(proto.FileAck, channel, proto.FileAckMsg{Ack: uint64(len(got))})
		frame := d.forwardFrame(channel)
		if frame.Kind == proto.HungUp {
			break
		}
		if frame.Kind != proto.FileOut {
			t.Fatalf("frame %q %s", frame.Kind, frame.Payload)
		}
		got = append(got, frame.Payload...)
	}
	if !bytes.Equal(got, payload) {
		t.Errorf("got %d bytes, not the server's %d exactly", len(got), len(payload))
	}
	d.send(proto.Discard, channel, nil)
}

func TestAForwardRefusesDataBeyondItsWindow(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	port := listen(t, func(c net.Conn) { <-block }) // reads nothing
	d, _ := connect(t)
	channel := openForward(d, port)
	d.send(proto.FileData, channel, make([]byte, ForwardWindow+1)) // one frame past the window
	for {
		frame := d.forwardFrame(channel)
		if frame.Kind == proto.FileTook {
			continue // what the kernel's socket buffer took
		}
		var reply proto.ErrorReply
		if frame.Kind != proto.ErrorMsg || json.Unmarshal(frame.Payload, &reply) != nil || reply.Code != "protocol" {
			t.Fatalf("frame %q %s, want a protocol error", frame.Kind, frame.Payload)
		}
		return
	}
}

func contains(list []string, want string) bool {
	for _, item := range list {
		if item == want {
			return true
		}
	}
	return false
}

func TestATricklingServerCostsTheAgentWhatItSentNotItsReadBuffer(t *testing.T) {
	const writes = 4000
	port := listen(t, func(c net.Conn) {
		_ = c.(*net.TCPConn).SetNoDelay(true)
		for i := 0; i < writes; i++ {
			if _, err := c.Write([]byte("ab")); err != nil {
				return
			}
			time.Sleep(50 * time.Microsecond)
		}
	})
	d, _ := connect(t)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	channel := openForward(d, port)
	var got []byte
	for len(got) < 2*writes {
		frame := d.forwardFrame(channel)
		if frame.Kind != proto.FileOut {
			t.Fatalf("frame %q %s", frame.Kind, frame.Payload)
		}
		got = append(got, frame.Payload...)
		if len(got) > 2*writes-200 && after.HeapAlloc == 0 {
			runtime.ReadMemStats(&after) // the frames not yet read are still held by the agent
		}
	}
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 32<<20 {
		t.Errorf("the agent held %d MiB for %d bytes of 2-byte writes", grown>>20, len(got))
	}
	d.send(proto.Discard, channel, nil)
}
