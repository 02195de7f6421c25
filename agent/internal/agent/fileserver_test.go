//go:build linux

package agent

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// stoppedServer is a file server as the agent holds it, whose process (a sleep) a process of
// its user has stopped; took says it wrote its 'T' first.
func stoppedServer(t *testing.T, took bool) *fileServer {
	t.Helper()
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = syscall.SetNonblock(pair[0], true)
	ours, theirs := os.NewFile(uintptr(pair[0]), "ctl"), os.NewFile(uintptr(pair[1]), "server")
	t.Cleanup(func() {
		ours.Close()
		theirs.Close() // a server's end stays open while it lives: a sleep stands in for it
	})
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	dead := make(chan struct{})
	go func() {
		_ = cmd.Wait() // or the test agent, a subreaper, collects it: either way it is gone
		close(dead)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	if took {
		if _, err := theirs.Write([]byte{'T'}); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, cmd.Process.Pid, "T")
	return &fileServer{pid: cmd.Process.Pid, ctl: ours, dead: dead}
}

func TestAStoppedFileServerIsKilledAndTheOperationGoesElsewhere(t *testing.T) {
	s := stoppedServer(t, false)
	start := time.Now()
	err := s.taken()
	if err == nil || errors.Is(err, errTookAndDied) {
		t.Fatalf("taken() = %v, want the server given up", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("the stopped server was given up after %v", waited)
	}
	if !s.exited() {
		t.Fatal("the stopped server was not killed")
	}
}

// A process of its user continued the server just after it was seen stopped, and it took the
// operation: a helper must not do it again (a remove, a move).
func TestAServerThatTookItsOperationBeforeItWasKilledIsNotReplacedByAHelper(t *testing.T) {
	s := stoppedServer(t, true)
	if err := s.giveUp(); !errors.Is(err, errTookAndDied) {
		t.Fatalf("giveUp() = %v, want errTookAndDied", err)
	}
	if !s.exited() {
		t.Fatal("the server was not killed")
	}
}
