//go:build linux

package agent

import (
	"os"
	"syscall"
	"time"
)

// Expect registers a child; its wait status is delivered on the returned channel.
func (a *Agent) Expect(pid int) <-chan syscall.WaitStatus {
	ch := make(chan syscall.WaitStatus, 1)
	a.reapMu.Lock()
	defer a.reapMu.Unlock()
	if r, ok := a.unowned[pid]; ok {
		delete(a.unowned, pid)
		ch <- r.status
		return ch
	}
	a.expected[pid] = ch
	return ch
}

// reap collects every exited child (the agent is the subreaper of all commands) and hands
// each status to whoever expects it.
func (a *Agent) reap(signals <-chan os.Signal) {
	for range signals {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			a.reapMu.Lock()
			if ch, ok := a.expected[pid]; ok {
				delete(a.expected, pid)
				ch <- ws
			} else {
				a.unowned[pid] = reaped{status: ws, at: time.Now()}
				for other, r := range a.unowned {
					if time.Since(r.at) > time.Minute { // an orphan's: nobody will ask
						delete(a.unowned, other)
					}
				}
			}
			a.reapMu.Unlock()
		}
	}
}
