//go:build linux

package session

import (
	"os"
	"strings"
	"syscall"
	"time"

	"sandboxd/agent/internal/proctree"
	"sandboxd/agent/internal/proto"
)

// finish waits for the output the command wrote before it exited, ends what an
// interrupted or killed command left, and reports the exit.
func (s *Session) finish(ws syscall.WaitStatus, readers []*reader) {
	now := time.Now()
	close(s.exiting)
	for _, r := range readers {
		_ = r.file.SetReadDeadline(now.Add(drainWindow))
	}
	for _, r := range readers {
		<-r.drained
	}
	s.mu.Lock()
	killing, interrupted := s.killing, s.interrupted
	s.mu.Unlock()
	if killing {
		// The rest of the tree gets what is left of its grace to go on SIGTERM.
		for time.Now().Before(s.killDeadline()) && len(proctree.Tree(s.pid, s.marker, s.cred)) > 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if interrupted || killing {
		// The command as a whole was stopped: nothing it started may outlive it.
		proctree.HardKill(s.pid, s.marker, s.cred)
	}
	code, sig := 0, 0
	if ws.Signaled() {
		sig = int(ws.Signal())
		code = 128 + sig
	} else {
		code = ws.ExitStatus()
	}
	s.buf.Close() // later output is a leftover's, not the command's
	_, _, end, dropped := s.buf.State()
	exit := &proto.ExitedMsg{
		Dropped:   dropped,
		ExitCode:  code,
		Signal:    sig,
		OOMKills:  max(0, oomKills()-s.oomBefore),
		Leftovers: len(proctree.TreeSince(s.pid, s.marker, s.cred, s.pidStart)),
		SpillPath: s.spill.close(),
		End:       end,
	}
	s.mu.Lock()
	exit.TimedOut = s.timedOut
	exit.Killed = s.killed
	s.exit = exit
	s.mu.Unlock()
	s.waitSent(end)
	s.send(proto.Exited, exit)
	close(s.done)
	s.poke()
}

func max(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// oomKills is the container's cgroup OOM-kill counter (v1 or v2), or 0.
func oomKills() int {
	for _, path := range []string{"/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"} {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if name, value, ok := strings.Cut(line, " "); ok && name == "oom_kill" {
				var n int
				for _, c := range value {
					if c < '0' || c > '9' {
						break
					}
					n = n*10 + int(c-'0')
				}
				return n
			}
		}
	}
	return 0
}
