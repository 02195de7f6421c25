//go:build linux

package session

import (
	"syscall"
	"time"

	"sandboxd/agent/internal/clock"
	"sandboxd/agent/internal/proctree"
	"sandboxd/agent/internal/proto"
)

// Kill runs the kill ladder over the whole tree.
func (s *Session) Kill(msg proto.KillMsg) {
	s.mu.Lock()
	s.killed = true
	if !s.started {
		grace := msg.GraceS
		s.pendingKill = &grace
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	if msg.GraceS < 0 {
		msg.GraceS = 0
	}
	s.startKill(time.Duration(msg.GraceS * float64(time.Second)))
}

// startKill is the first rung of the ladder: SIGTERM to the whole tree, SIGKILL after grace.
func (s *Session) startKill(grace time.Duration) {
	s.mu.Lock()
	if !s.started {
		s.mu.Unlock()
		return
	}
	if s.killing {
		// A ladder runs already (a timeout's, an earlier Kill's): a shorter grace brings its
		// SIGKILL forward; a longer one never puts it off.
		at := time.Now().Add(grace)
		sooner := s.exit == nil && !s.killAt.IsZero() && at.Before(s.killAt)
		if sooner {
			s.killAt = at
		}
		s.mu.Unlock()
		if sooner {
			clock.AfterFunc(grace, func() {
				proctree.HardKill(s.pid, s.marker, s.cred)
			})
		}
		return
	}
	s.killing = true
	exited := s.exit != nil
	s.mu.Unlock()
	if exited {
		proctree.HardKill(s.pid, s.marker, s.cred) // only leftovers remain: no grace for them
		return
	}
	s.mu.Lock()
	s.killAt = time.Now().Add(grace)
	s.mu.Unlock()
	proctree.SignalAll(proctree.Tree(s.pid, s.marker, s.cred), syscall.SIGTERM)
	clock.AfterFunc(grace, func() {
		proctree.HardKill(s.pid, s.marker, s.cred)
	})
}

func (s *Session) killDeadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killAt
}

func (s *Session) onTimeout() {
	s.mu.Lock()
	if s.exit == nil {
		s.timedOut = true
	}
	s.mu.Unlock()
	s.startKill(time.Duration(s.spec.GraceS * float64(time.Second)))
}
