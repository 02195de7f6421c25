// Package clock gives the agent timers that stand still while its workspace is paused.
//
// A paused workspace is frozen by the engine's cgroup freezer, the agent with it; the
// monotonic clock goes on meanwhile, so an ordinary timer due during the pause fires the
// moment the workspace thaws: a command with 20 s of its timeout left would be killed as
// soon as it was resumed. The daemon says Freeze before it pauses the workspace and Thaw
// after it resumes it; between the two, these timers keep what they had left.
package clock

import (
	"sync"
	"time"
)

// Timer calls its function once its time has run, not counting frozen time.
type Timer struct {
	f    func()
	left time.Duration // while frozen: what remains
	due  time.Time     // while running: when it fires
	t    *time.Timer   // nil while frozen
	done bool          // fired or stopped
}

var (
	mu     sync.Mutex
	frozen bool
	live   = map[*Timer]struct{}{}
)

// AfterFunc calls f in its own goroutine after d of unfrozen time.
func AfterFunc(d time.Duration, f func()) *Timer {
	mu.Lock()
	defer mu.Unlock()
	t := &Timer{f: f, left: d}
	live[t] = struct{}{}
	if !frozen {
		t.start()
	}
	return t
}

// start arms the timer with what it has left; mu is held.
func (t *Timer) start() {
	t.due = time.Now().Add(t.left)
	t.t = time.AfterFunc(t.left, t.fire)
}

func (t *Timer) fire() {
	mu.Lock()
	if t.done || t.t == nil {
		mu.Unlock() // stopped, or frozen just as it fired: Freeze kept what was left
		return
	}
	t.done = true
	delete(live, t)
	mu.Unlock()
	t.f()
}

// Stop keeps the timer from firing; false if it already fired or was stopped.
func (t *Timer) Stop() bool {
	mu.Lock()
	defer mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	delete(live, t)
	if t.t != nil {
		t.t.Stop()
	}
	return true
}

// Freeze stops every timer, keeping what each has left.
func Freeze() {
	mu.Lock()
	defer mu.Unlock()
	if frozen {
		return
	}
	frozen = true
	now := time.Now()
	for t := range live {
		t.t.Stop()
		t.t = nil
		if t.left = t.due.Sub(now); t.left < 0 {
			t.left = 0
		}
	}
}

// Thaw starts every timer again with what it had left.
func Thaw() {
	mu.Lock()
	defer mu.Unlock()
	if !frozen {
		return
	}
	frozen = false
	for t := range live {
		t.start()
	}
}

// Frozen says whether timers stand still.
func Frozen() bool {
	mu.Lock()
	defer mu.Unlock()
	return frozen
}
