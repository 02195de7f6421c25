//go:build linux

package session

import "sandboxd/agent/internal/proto"

// MaxPendingInput bounds input the command has not read yet; more is dropped.
const MaxPendingInput = 16 << 20

// Input queues bytes for the command's stdin (bounded; more is dropped).
func (s *Session) Input(data []byte) {
	s.mu.Lock()
	room := MaxPendingInput - len(s.input)
	if room > len(data) {
		room = len(data)
	}
	if room > 0 {
		s.input = append(s.input, data[:room]...)
		s.inputReceived += uint64(room)
	}
	if len(data) > 0 {
		s.lastInput = data[len(data)-1]
	}
	s.mu.Unlock()
	select {
	case s.inputWake <- struct{}{}:
	default:
	}
}

// CloseInput ends the command's input (in tty mode with EOF characters).
func (s *Session) CloseInput() {
	s.mu.Lock()
	if s.spec.TTY {
		// ^D ends input only at the start of a line; after a partial line it first
		// flushes that line, so a second one is needed.
		if s.lastInput == '\n' || s.lastInput == '\r' {
			s.input = append(s.input, 4)
		} else {
			s.input = append(s.input, 4, 4)
		}
	} else {
		s.closeIn = true
	}
	s.mu.Unlock()
	select {
	case s.inputWake <- struct{}{}:
	default:
	}
}

func (s *Session) writeInput() {
	// Nothing reaches the terminal before the command runs: a ^C typed there would be a
	// SIGINT the starting shell could swallow, and a profile could read what was typed.
	select {
	case <-s.shellUp:
	case <-s.done:
	}
	for {
		select {
		case <-s.inputWake:
		case <-s.done:
			if !s.spec.TTY {
				s.stdin.Close()
			}
			return
		}
		for {
			s.mu.Lock()
			pending, closing := s.input, s.closeIn
			s.input = nil
			s.mu.Unlock()
			if len(pending) > 0 {
				_, err := s.stdin.Write(pending)
				s.mu.Lock()
				if err != nil {
					// The command closed its stdin: what it did not read is gone.
					pending = append(pending, s.input...)
					s.input = nil
				}
				s.inputTaken += uint64(len(pending))
				taken := s.inputTaken
				s.mu.Unlock()
				s.send(proto.FileTook, proto.FileTookMsg{Bytes: taken}) // room for the daemon's next
				continue
			}
			if closing && !s.spec.TTY {
				s.stdin.Close()
				return
			}
			break
		}
	}
}
