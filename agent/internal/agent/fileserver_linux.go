//go:build linux

package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"sandboxd/agent/internal/session"
	"sandboxd/agent/internal/spawn"
	"sandboxd/agent/internal/users"
)

// fileServer is a workspace user's file server (fileops.Server): one process per user,
// started on that user's first file operation and kept, which performs the short
// operations one at a time. An operation that finds it busy (or not there yet, or dead)
// takes a helper of its own, as every operation once did.
type fileServer struct {
	uid  uint32
	key  string // the user's ids: a server is that user's only while they stay the same
	pid  int
	ctl  *os.File      // the agent's end of the server's socket
	dead chan struct{} // closed once the server has exited
	busy bool          // an operation is in it (Agent.mu)
	// next holds the pipes of its next operation, made ahead of it (Agent.mu): four
	// descriptors made and registered with the poller cost an operation half a millisecond
	// under gVisor.
	next []*os.File
}

// userKey names a user's ids and groups, all that decides what a process of theirs may do.
func userKey(u users.User) string {
	return fmt.Sprintf("%d:%d:%v", u.UID, u.GID, u.Groups)
}

// fileServerFor returns u's file server, marked busy, or nil when it has none idle; then
// it starts one in the background if there is none, for the operations that follow.
func (a *Agent) fileServerFor(u users.User) *fileServer {
	key := userKey(u)
	a.mu.Lock()
	s := a.servers[u.UID]
	if s != nil && !s.busy && (s.key != key || s.exited()) {
		// Another user under the same uid, or a server that a process of the user killed
		// (it is theirs): it goes, and a new one is started. One they stopped is found
		// when it does not take its operation (taken).
		a.dropFileServerLocked(s)
		s = nil
	}
	if s != nil && !s.busy {
		s.busy = true
		a.mu.Unlock()
		return s
	}
	start := s == nil && !a.serverStarting[u.UID]
	if start {
		a.serverStarting[u.UID] = true
	}
	a.mu.Unlock()
	if start {
		go a.startFileServer(u, key)
	}
	return nil
}

// startFileServer starts u's file server and makes it theirs.
func (a *Agent) startFileServer(u users.User, key string) {
	s, err := a.launchFileServer(u, key)
	a.mu.Lock()
	delete(a.serverStarting, u.UID)
	if err == nil {
		if old := a.servers[u.UID]; old != nil && !old.busy {
			a.dropFileServerLocked(old)
		}
		if a.servers[u.UID] == nil {
			a.servers[u.UID] = s
			go a.prepare(s)
			s = nil
		}
	}
	a.mu.Unlock()
	if s != nil {
		s.ctl.Close() // another server was there, busy: this one is not needed
	}
}

// prepare makes the pipes of s's next operation, unless it has them or is gone.
func (a *Agent) prepare(s *fileServer) {
	files, err := pipes(2)
	if err != nil {
		return // the operation makes its own, and says why it cannot
	}
	a.mu.Lock()
	if s.next == nil && a.servers[s.uid] == s {
		s.next, files = files, nil
	}
	a.mu.Unlock()
	closeFiles(files)
}

// pipesFor returns the pipes of s's next operation: those made ahead, or new ones.
func (a *Agent) pipesFor(s *fileServer) ([]*os.File, error) {
	a.mu.Lock()
	files := s.next
	s.next = nil
	a.mu.Unlock()
	if files != nil {
		return files, nil
	}
	return pipes(2)
}

// launchFileServer starts a spawn helper that becomes u's file server.
func (a *Agent) launchFileServer(u users.User, key string) (*fileServer, error) {
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	// Ours through the poller: SendRights waits while the socket is full.
	_ = syscall.SetNonblock(pair[0], true)
	ours, theirs := os.NewFile(uintptr(pair[0]), "fileserver"), os.NewFile(uintptr(pair[1]), "fileserver")
	request := spawn.Request{
		Run:         "fileserver",
		Dir:         "/",
		UID:         u.UID,
		GID:         u.GID,
		Groups:      u.Groups,
		OOMScoreAdj: session.OOMScoreAdj,
	}
	proc, failure, err := a.spawner.StartOwn(request, []*os.File{theirs}, "fileserver")
	theirs.Close()
	if err == nil && failure == nil {
		failure = proc.Go()
	}
	if err == nil && failure != nil {
		err = fmt.Errorf("%s", failure.Message)
	}
	if err != nil {
		ours.Close()
		return nil, err
	}
	s := &fileServer{uid: u.UID, key: key, pid: proc.PID, ctl: ours, dead: make(chan struct{})}
	status := a.Expect(proc.PID)
	go func() {
		<-status
		close(s.dead)
	}()
	return s, nil
}

func (s *fileServer) exited() bool {
	select {
	case <-s.dead:
		return true
	default:
		return false
	}
}

// dropFileServerLocked lets s go (it exits when its socket closes); a server that is stopped
// or in an operation is killed. Agent.mu is held.
func (a *Agent) dropFileServerLocked(s *fileServer) {
	a.unlistLocked(s)
	s.ctl.Close()
	if !s.exited() && (s.busy || stopped(s.pid)) {
		_ = syscall.Kill(s.pid, syscall.SIGKILL)
	}
}

// unlistLocked takes s out of the agent's servers, with the pipes made for its next
// operation. Agent.mu is held.
func (a *Agent) unlistLocked(s *fileServer) {
	if a.servers[s.uid] == s {
		delete(a.servers, s.uid)
	}
	closeFiles(s.next)
	s.next = nil
}

// release makes s idle again after an operation, and makes the pipes of its next.
func (a *Agent) release(s *fileServer) {
	a.mu.Lock()
	s.busy = false
	ahead := s.next == nil
	a.mu.Unlock()
	if ahead {
		go a.prepare(s)
	}
}

// abandon ends the operation s is in: SIGTERM lets it remove a file it was staging (then
// SIGKILL, as for a helper), and the server goes.
func (a *Agent) abandon(s *fileServer) {
	a.mu.Lock()
	a.unlistLocked(s)
	a.mu.Unlock()
	s.ctl.Close()
	if stopped(s.pid) {
		_ = syscall.Kill(s.pid, syscall.SIGKILL) // it would not act on SIGTERM until continued
		return
	}
	_ = syscall.Kill(s.pid, syscall.SIGTERM)
}

// hand gives s an operation, its input and its output (fileops.Server reads them), in one
// message: each wakes the server, and a wake-up under gVisor is a good part of a millisecond.
func (s *fileServer) hand(operation []byte, input, output *os.File) error {
	message := make([]byte, 4, 4+len(operation))
	binary.BigEndian.PutUint32(message, uint32(len(operation)))
	return spawn.SendRights(s.ctl, append(message, operation...), []int{int(input.Fd()), int(output.Fd())})
}

// takenCheck is how long an operation handed to a file server may wait for its 'T' before
// the server is looked at.
const takenCheck = 25 * time.Millisecond

// taken waits for s's 'T', the operation taken. A server that a process of its user stopped
// (SIGSTOP, or a tracer) would hold it for ever: while the 'T' is late the server is looked
// at every takenCheck (not before each operation: reading its /proc status costs half a
// millisecond under gVisor), and one stopped or gone is given up.
func (s *fileServer) taken() error {
	for {
		err := s.expectWithin('T', takenCheck)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if s.exited() || stopped(s.pid) {
			return s.giveUp()
		}
	}
}

// errTookAndDied says a file server took its operation and was killed in it (giveUp).
var errTookAndDied = errors.New("the file server took the operation and was killed in it")

// giveUp kills s, seen stopped or gone, and says whether it took the operation all the same:
// a process of its user may have continued it just after it was seen stopped, and it may
// then have begun the operation (a remove, a move), which a helper must not do again. Once
// it is dead its socket holds its 'T' or nothing more.
func (s *fileServer) giveUp() error {
	_ = syscall.Kill(s.pid, syscall.SIGKILL)
	select {
	case <-s.dead:
	case <-time.After(time.Second):
	}
	if s.expectWithin('T', 100*time.Millisecond) == nil {
		return errTookAndDied
	}
	return fmt.Errorf("file server %d was stopped", s.pid)
}

// expectWithin is expect, giving up after d (os.ErrDeadlineExceeded).
func (s *fileServer) expectWithin(want byte, d time.Duration) error {
	_ = s.ctl.SetReadDeadline(time.Now().Add(d))
	defer s.ctl.SetReadDeadline(time.Time{})
	return s.expect(want)
}

// expect reads the server's next word on its socket, which must be want.
func (s *fileServer) expect(want byte) error {
	var word [1]byte
	if _, err := io.ReadFull(s.ctl, word[:]); err != nil {
		return err
	}
	if word[0] != want {
		return fmt.Errorf("file server %d said %q, not %q", s.pid, word[0], want)
	}
	return nil
}

// stopped says whether process pid is stopped (SIGSTOP, or traced): a server that a process
// of its user stopped would hold every operation handed to it.
func stopped(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the state follows the last ')', whatever comm holds.
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 || end+2 >= len(stat) {
		return false
	}
	state := stat[end+2]
	return state == 'T' || state == 't'
}
