//go:build linux

package session

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"

	"sandboxd/agent/internal/clock"
	"sandboxd/agent/internal/proctree"
	"sandboxd/agent/internal/proto"
)

// shellStartBound is how long a Ctrl-C and the caller's input wait for the shell to reach
// the command (its login profile runs first); past it, a profile that never ends gets them.
// A shell that reaches the command all the same (it swallowed the Ctrl-C: a profile's child
// it was waiting for exited normally) gets it once more there.
const shellStartBound = 3 * time.Second

// awaitShell holds a Ctrl-C until the shell has read its profile. A shell that gets
// SIGINT while it waits for a child which then exits normally (the profile's `$(id -u)`)
// takes the signal as the child's and goes on: the Ctrl-C was lost. One that gets
// it as it forks can, under gVisor, spin for ever beside the child's zombie. Once it has
// written its ready byte it forks nothing more before the command (the hook, package
// shell): blocked in `read` for its command (alias mode) or for the go line, it dies of the
// signal at once; so the held Ctrl-C is delivered then, and only then is the shell let go.
// A spare wrote its byte long before: nothing is held. shellStartBound passing first lets
// what was held through: a profile that never ends is interrupted. The gate stays open
// until the byte or the command's end, even past the bound: a shell writing to a closed
// pipe would die of SIGPIPE.
func (s *Session) awaitShell(l *launched) {
	bound := clock.AfterFunc(shellStartBound, s.shellStarted)
	go func() {
		<-s.exiting
		l.readyDeadline() // a profile's child may hold the pipe open for ever
	}()
	ok := <-l.ready
	l.readyR.Close()
	bound.Stop()
	s.mu.Lock()
	s.shellReady = ok
	again, pid := ok && s.earlyCtrlC, s.pid
	s.mu.Unlock()
	s.shellStarted()
	if again {
		// A Ctrl-C sent during a slow profile (by the bound, or by the caller after it), and the
		// shell went on to its command: it took the signal as a child's. Blocked in read
		// now, it dies of this one at once.
		_ = syscall.Kill(-pid, syscall.SIGINT)
	}
	if ok {
		l.release()
	}
	if l.gateW != nil {
		l.gateW.Close()
	}
}

// shellStarted delivers the Ctrl-Cs held for the command as one SIGINT to its process
// group (once, whoever calls first). On a terminal each Ctrl-C was also a ^C written
// there, held with the rest of the input: those bytes go, the SIGINT stands for them.
func (s *Session) shellStarted() {
	s.mu.Lock()
	select {
	case <-s.shellUp:
		s.mu.Unlock()
		return
	default:
	}
	close(s.shellUp)
	held := s.heldCtrlC
	s.heldCtrlC = 0
	if held > 0 && !s.shellReady {
		s.earlyCtrlC = true
	}
	if s.spec.TTY {
		kept, drop := s.input[:0], held
		for _, c := range s.input {
			if c == 3 && drop > 0 {
				drop--
				continue
			}
			kept = append(kept, c)
		}
		s.input = kept
	}
	pid := s.pid
	s.mu.Unlock()
	select {
	case <-s.exiting:
		return // reaped: its pid may be another's by now
	default:
	}
	if held > 0 {
		_ = syscall.Kill(-pid, syscall.SIGINT)
	}
}

// applyPending delivers what arrived while the command was starting.
func (s *Session) applyPending() {
	s.mu.Lock()
	signals, kill := s.pendingSig, s.pendingKill
	s.pendingSig, s.pendingKill = nil, nil
	s.mu.Unlock()
	for _, sig := range signals {
		s.Signal(sig)
	}
	if kill != nil {
		s.Kill(proto.KillMsg{GraceS: *kill})
	}
}

// Signal delivers a signal to the command's process group.
func (s *Session) Signal(msg proto.SignalMsg) {
	s.mu.Lock()
	if !s.started {
		s.pendingSig = append(s.pendingSig, msg)
		s.mu.Unlock()
		return
	}
	if msg.Interrupt {
		s.interrupted = true
		select {
		case <-s.shellUp:
			if !s.shellReady {
				s.earlyCtrlC = true // past the bound, still in the profile: awaitShell sends it again
			}
		default:
			s.heldCtrlC++ // awaitShell: the starting shell could swallow it now
			s.mu.Unlock()
			return
		}
	}
	pid, exited := s.pid, s.exit != nil
	s.mu.Unlock()
	if msg.Signal > 0 && msg.Signal < 65 && !exited {
		shell := msg.Interrupt && s.isTheShell(pid)
		_ = syscall.Kill(-pid, syscall.Signal(msg.Signal))
		if shell {
			go s.interruptAgainIfSwallowed(pid)
		}
	}
}

// isTheShell says whether pid is still the shell the agent started (not yet the command it
// executes in its place).
func (s *Session) isTheShell(pid int) bool {
	if s.shellCmdline == nil {
		return false
	}
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return bytes.Equal(cmdline, s.shellCmdline)
}

// interruptAgainIfSwallowed sends SIGINT once more if the shell that got a Ctrl-C then
// executed the command in its place: bash catches SIGINT and acts on it at its next check,
// and one that came after its last check before the execve of a last simple command was
// taken from the command (which starts with the default disposition and never saw it).
// A shell that acted on it is gone; one that trapped it is still the shell.
//
// The shell is watched for swallowWatch, and longer while it has not had the CPU to get
// anywhere: on a loaded machine a shell may wait seconds between the signal and its execve,
// runnable all along, and a watch that ended first lost the Ctrl-C. One that sleeps
// (it waits for a child: it did not take the execve path) or has run for swallowCPU since
// is done with the signal.
func (s *Session) interruptAgainIfSwallowed(pid int) {
	_, cpu0, _ := proctree.Progress(pid)
	began := time.Now()
	for pause := 2 * time.Millisecond; ; {
		select {
		case <-s.exiting:
			return
		default:
		}
		cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil || len(cmdline) == 0 {
			return // gone (or a zombie)
		}
		if !bytes.Equal(cmdline, s.shellCmdline) {
			_ = syscall.Kill(-pid, syscall.SIGINT)
			return
		}
		waited := time.Since(began)
		if waited > swallowWatch {
			state, cpu, ok := proctree.Progress(pid)
			if !ok || !stillWatched(waited, state, time.Duration(cpu-cpu0)*tickDuration) {
				return
			}
		}
		time.Sleep(pause)
		if waited > 200*time.Millisecond && pause < 50*time.Millisecond {
			pause *= 2 // promptly at first (an execve comes within moments), then gently
		}
	}
}

// stillWatched says whether a Ctrl-C'd shell that is still the shell after waited is watched
// on: only while it has been runnable without the CPU to get anywhere (state R or D, less
// than swallowCPU used since the signal), and not past swallowWatchMax.
func stillWatched(waited time.Duration, state byte, used time.Duration) bool {
	if waited <= swallowWatch {
		return true
	}
	return waited <= swallowWatchMax && (state == 'R' || state == 'D') && used < swallowCPU
}

// swallowWatch is how long a Ctrl-C'd shell is watched for executing its command anyway,
// unless it has not had the CPU to (swallowCPU), up to swallowWatchMax.
const swallowWatch = 2 * time.Second

// swallowCPU is the CPU a shell uses without executing its command that shows it went on
// past the signal (the execve path takes a millisecond or so).
const swallowCPU = 50 * time.Millisecond

// swallowWatchMax bounds the watch of a shell that stays runnable without the CPU.
const swallowWatchMax = 30 * time.Second

// tickDuration is one clock tick of /proc's CPU times (USER_HZ, 100 on Linux).
const tickDuration = 10 * time.Millisecond
