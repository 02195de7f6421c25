//go:build linux

package session

import (
	"syscall"

	"sandboxd/agent/internal/proto"
	"sandboxd/agent/internal/pty"
)

// Resize sets the terminal's size; the foreground group gets SIGWINCH.
func (s *Session) Resize(msg proto.WindowMsg) {
	s.mu.Lock()
	master, pid := s.master, s.pid
	s.mu.Unlock()
	if master != nil && pid > 0 && pty.Resize(master, msg.Columns, msg.Rows) == nil {
		_ = syscall.Kill(-pid, syscall.SIGWINCH)
	}
}
