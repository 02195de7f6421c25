//go:build linux

package agent

import (
	"encoding/json"
	"fmt"
	"syscall"

	"sandboxd/agent/internal/clock"
	"sandboxd/agent/internal/proto"
	"sandboxd/agent/internal/session"
)

func (a *Agent) protocolError(c *conn, channel uint32, format string, args ...any) {
	body, _ := json.Marshal(proto.ErrorReply{Code: "protocol", Message: fmt.Sprintf(format, args...)})
	c.enqueue(proto.Encode(proto.ErrorMsg, channel, body))
}

func decode(payload []byte, v any) error {
	if err := json.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("payload is not the expected JSON: %w", err)
	}
	return nil
}

// dispatch routes a frame from the daemon: the connection's own, a forward's, a file
// operation's, or a session's.
func (a *Agent) dispatch(c *conn, f proto.Frame) {
	if f.Kind == proto.Hello || (f.Kind == proto.Freeze && f.Channel == 0) {
		a.dispatchControl(c, f)
		return
	}
	if f.Channel == 0 {
		a.protocolError(c, 0, "frame %q on channel 0", f.Kind)
		return
	}
	if fw := a.forwardOn(f.Channel); fw != nil || f.Kind == proto.Connect {
		a.dispatchForward(c, f, fw)
		return
	}
	switch f.Kind {
	case proto.Start:
		a.startSession(c, f)
		return
	case proto.FileOp, proto.FileData, proto.FileEnd, proto.FileAck:
		a.dispatchFile(c, f)
		return
	case proto.Discard:
		a.mu.Lock()
		op := a.files[f.Channel]
		a.mu.Unlock()
		if op != nil {
			a.forgetFile(op) // the daemon gave up on it (its call was cancelled or timed out)
			return
		}
	}
	a.dispatchSession(c, f)
}

// dispatchControl answers the frames of the connection itself: Hello, and Freeze on channel 0.
func (a *Agent) dispatchControl(c *conn, f proto.Frame) {
	if f.Kind == proto.Hello {
		var hello proto.HelloMsg
		if err := decode(f.Payload, &hello); err != nil || hello.Protocol != proto.Version {
			a.protocolError(c, 0, "this agent speaks protocol %d", proto.Version)
			return
		}
		a.greet(c)
		return
	}
	var msg proto.FreezeMsg
	if err := decode(f.Payload, &msg); err != nil {
		a.protocolError(c, 0, "freeze: %v", err)
		return
	}
	if msg.Frozen {
		clock.Freeze()
		// What the workspace wrote reaches the host's files before it is frozen: gVisor keeps a
		// file's written pages in the sandbox until a sync, and a snapshot reads them from the host.
		syscall.Sync()
	} else {
		clock.Thaw()
	}
	// A paused workspace keeps no spare: made again once it runs.
	a.spares.Freeze(msg.Frozen)
	if msg.Frozen && msg.Checkpoint {
		a.letGo(c) // before the answer: once the daemon has it, nothing listens
	}
	body, _ := json.Marshal(proto.FreezeMsg{Frozen: clock.Frozen(), Checkpoint: msg.Frozen && msg.Checkpoint})
	c.enqueue(proto.Encode(proto.Frozen, 0, body))
	if msg.Frozen && msg.Checkpoint {
		c.closeWhenSent()
	}
}

// startSession opens a session on a Start frame's channel and runs its command.
func (a *Agent) startSession(c *conn, f proto.Frame) {
	var msg proto.StartMsg
	if err := decode(f.Payload, &msg); err != nil {
		a.protocolError(c, f.Channel, "start: %v", err)
		return
	}
	a.mu.Lock()
	var s *session.Session
	if !a.channelInUse(f.Channel) {
		s = session.New(a, f.Channel, msg)
		a.sessions[f.Channel] = s
	}
	a.mu.Unlock()
	if s == nil {
		a.protocolError(c, f.Channel, "channel %d is in use", f.Channel)
		return
	}
	go s.Run()
}

// dispatchSession hands a frame to the session on its channel.
func (a *Agent) dispatchSession(c *conn, f proto.Frame) {
	a.mu.Lock()
	s := a.sessions[f.Channel]
	a.mu.Unlock()
	if s == nil {
		a.protocolError(c, f.Channel, "no session on channel %d", f.Channel)
		return
	}
	var err error
	switch f.Kind {
	case proto.Input:
		s.Input(f.Payload)
	case proto.CloseInput:
		s.CloseInput()
	case proto.Signal:
		var msg proto.SignalMsg
		if err = decode(f.Payload, &msg); err == nil {
			s.Signal(msg)
		}
	case proto.Kill:
		var msg proto.KillMsg
		if err = decode(f.Payload, &msg); err == nil {
			go s.Kill(msg)
		}
	case proto.Rename:
		var msg proto.RenameMsg
		if err = decode(f.Payload, &msg); err == nil {
			s.Rename(msg)
		}
	case proto.Window:
		var msg proto.WindowMsg
		if err = decode(f.Payload, &msg); err == nil {
			s.Resize(msg)
		}
	case proto.Pull:
		var msg proto.PullMsg
		if err = decode(f.Payload, &msg); err == nil {
			s.Pull(msg)
		}
	case proto.Discard:
		a.mu.Lock()
		delete(a.sessions, f.Channel)
		a.mu.Unlock()
		go s.Discard()
	default:
		err = fmt.Errorf("unknown frame kind %q", f.Kind)
	}
	if err != nil {
		a.protocolError(c, f.Channel, "%v", err)
	}
}
