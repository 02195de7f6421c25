//go:build linux

package agent

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"sandboxd/agent/internal/proto"
)

// A checkpoint's Freeze: the agent answers, closes the connection, takes its socket's name
// away and listens again only on SIGUSR1 (a runtime cannot save a socket bound on the host).
func TestACheckpointLetsGoOfTheHostUntilSIGUSR1(t *testing.T) {
	syscall.Kill(os.Getpid(), syscall.SIGUSR1) // old news: must not cut the wait short
	d, _ := connect(t)
	r := start(d, "sleep 30", nil)
	for r.pid == 0 {
		r.step(d)
	}
	d.send(proto.Freeze, 0, proto.FreezeMsg{Frozen: true, Checkpoint: true})
	var answer proto.FreezeMsg
	for frame := d.next(); ; frame = d.next() {
		if frame.Kind == proto.Frozen {
			if err := json.Unmarshal(frame.Payload, &answer); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if !answer.Frozen || !answer.Checkpoint {
		t.Fatalf("answer %+v, want frozen for a checkpoint", answer)
	}
	_ = d.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := d.reader.Read(); !errors.Is(err, io.EOF) {
		t.Fatalf("after its answer the connection reads %v, want its end", err)
	}
	if _, err := os.Lstat(SocketPath); !os.IsNotExist(err) {
		t.Fatalf("the socket's name is still there: %v", err)
	}
	if _, err := os.Lstat(awayPath()); err != nil {
		t.Fatalf("no mark says the agent let go: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // a listen that came back on its own would be there by now
	if conn, err := net.Dial("unix", SocketPath); err == nil {
		conn.Close()
		t.Fatal("the agent listens before it is told to")
	}

	syscall.Kill(os.Getpid(), syscall.SIGUSR1)
	d, welcome := connect(t)
	if _, err := os.Lstat(awayPath()); !os.IsNotExist(err) {
		t.Fatalf("the mark is still there once the agent listens: %v", err)
	}
	if !welcome.Frozen {
		t.Fatal("the welcome after a checkpoint does not say the agent is frozen")
	}
	d.send(proto.Freeze, 0, proto.FreezeMsg{Frozen: false})
	for frame := d.next(); frame.Kind != proto.Frozen; frame = d.next() {
	}

	// A restored copy's daemon names the session anew; the agent says so from then on.
	d.send(proto.Rename, r.channel, proto.RenameMsg{ProcessID: "p-0123456789ab", DaemonState: json.RawMessage(`{"workspace_id":"ws-copy"}`)})
	d, welcome = connect(t)
	defer func() {
		d.send(proto.Kill, r.channel, proto.KillMsg{GraceS: 0})
		r.wait(d)
	}()
	for _, s := range welcome.Sessions {
		if s.Channel == r.channel {
			if s.ProcessID != "p-0123456789ab" || string(s.DaemonState) != `{"workspace_id":"ws-copy"}` {
				t.Fatalf("renamed session is %q %s", s.ProcessID, s.DaemonState)
			}
			return
		}
	}
	t.Fatalf("session %d is not in the welcome", r.channel)
}
