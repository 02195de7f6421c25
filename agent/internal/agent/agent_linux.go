//go:build linux

// Package agent is the in-container agent: it holds the workspace's sessions and
// serves one daemon connection at a time over the frame protocol (PROTOCOL.md).
package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"sandboxd/agent/internal/clock"
	"sandboxd/agent/internal/proto"
	"sandboxd/agent/internal/session"
	"sandboxd/agent/internal/spawn"
)

// Version is the agent's release, reported in Welcome.
var Version = "dev"

// SocketPath is where the agent listens: in /run/sandboxd, a root-only tmpfs the daemon
// mounts. An agent that is not root (its tests on a host) takes SANDBOXD_AGENT_SOCKET
// instead; root never does (an image's environment must not move it).
var SocketPath = socketPath()

func socketPath() string {
	if path := os.Getenv("SANDBOXD_AGENT_SOCKET"); path != "" && os.Getuid() != 0 {
		return path
	}
	return "/run/sandboxd/agent.sock"
}

// trusted says whether a peer of this uid may speak for the daemon (or be the agent): root,
// or the agent's own user when it is not root.
func trusted(uid uint32) bool { return uid == 0 || uid == uint32(os.Getuid()) }

// maxQueuedBytes bounds frames waiting for a slow daemon; past it the connection is dropped
// (output is kept by the sessions and sent again on the next connection).
const maxQueuedBytes = 64 << 20

// Agent holds the sessions and the current connection.
type Agent struct {
	spawner *spawn.Pool
	spares  *session.Spares
	logf    func(string, ...any)

	mu       sync.Mutex
	sessions map[uint32]*session.Session
	files    map[uint32]*fileOp
	forwards map[uint32]*forward
	// Each user's file server (fileServer), and the users whose server is being started.
	servers        map[uint32]*fileServer
	serverStarting map[uint32]bool
	conn           *conn
	changed        chan struct{} // closed when the connection changes
	// The listener, and whether it was let go for a checkpoint (letGo) until a SIGUSR1.
	listener *net.UnixListener
	away     bool
	relisten chan os.Signal

	reapMu   sync.Mutex
	expected map[int]chan syscall.WaitStatus
	unowned  map[int]reaped // statuses of children nobody expected yet (a race with Expect)
}

type reaped struct {
	status syscall.WaitStatus
	at     time.Time
}

// New returns an agent that starts helpers from the binary at self.
func New(self string) *Agent {
	a := &Agent{
		logf:           log.New(os.Stderr, "sandboxd-agent: ", 0).Printf,
		sessions:       map[uint32]*session.Session{},
		files:          map[uint32]*fileOp{},
		forwards:       map[uint32]*forward{},
		servers:        map[uint32]*fileServer{},
		serverStarting: map[uint32]bool{},
		changed:        make(chan struct{}),
		relisten:       make(chan os.Signal, 1),
		expected:       map[int]chan syscall.WaitStatus{},
		unowned:        map[int]reaped{},
	}
	// From the start: a SIGUSR1 (the daemon's word after a checkpoint) must never end the agent.
	signal.Notify(a.relisten, syscall.SIGUSR1)
	a.spawner = spawn.NewPool(self, func(pid int) { go func() { <-a.Expect(pid) }() })
	a.spares = session.NewSpares(a)
	return a
}

// Spares are the login shells started ahead of need (session.Spares).
func (a *Agent) Spares() *session.Spares { return a.spares }

// Spawn starts a helper for req (see spawn.Pool.Start).
func (a *Agent) Spawn(req spawn.Request, stdio [3]*os.File, extra []*os.File, tty bool) (*spawn.Process, *spawn.Failure, error) {
	return a.spawner.Start(req, stdio, extra, tty)
}

// Connected returns a channel closed at the next change of connection.
func (a *Agent) Connected() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.changed
}

// Send queues a frame on the current connection; false without one.
func (a *Agent) Send(kind byte, channel uint32, payload []byte) bool {
	return a.SendFrame(proto.Encode(kind, channel, payload))
}

// SendFrame queues a frame built in place; false without a connection.
func (a *Agent) SendFrame(frame []byte) bool {
	a.mu.Lock()
	c := a.conn
	a.mu.Unlock()
	if c == nil {
		return false
	}
	return c.enqueueAfterWelcome(frame)
}

// Threads made at start and kept idle. The workspace's process limit counts threads, and
// Go ends a program that cannot make one it needs: under a fork bomb that holds every pid,
// the agent and its bridge run on threads they already have. Each is also a task of the
// machine's (kernel.pid_max bounds them all, and is what a host full of idle workspaces runs
// out of first): 8 carry forty calls at once through a fork bomb, where 24 cost a host
// sixteen more tasks for every workspace.
const (
	agentThreads  = 8
	bridgeThreads = 8
)

// reserveThreads makes the Go runtime start n threads now; they stay, idle, for later use.
func reserveThreads(n int) {
	var ready, release sync.WaitGroup
	release.Add(1)
	for i := 0; i < n; i++ {
		ready.Add(1)
		go func() {
			runtime.LockOSThread() // one goroutine per thread: n threads at once
			ready.Done()
			release.Wait()
			runtime.UnlockOSThread() // the thread goes back to the runtime's idle list
		}()
	}
	ready.Wait()
	release.Done()
}

// Serve listens on SocketPath and serves connections until the listener fails.
func (a *Agent) Serve() error {
	reserveThreads(agentThreads)
	if err := setSubreaper(); err != nil {
		a.logf("cannot become the subreaper of commands: %v", err)
	}
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	go a.reap(children)
	children <- syscall.SIGCHLD // children that ended before the handler was in place
	signal.Ignore(syscall.SIGPIPE)
	a.spawner.Fill() // the first command need not wait for its helper to start
	dir := filepath.Dir(SocketPath)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	if os.Getuid() == 0 {
		// Root's alone, whoever the image made its owner: nobody else may enter it, or put
		// a socket of their own (or a link to one) where the daemon looks for the agent's.
		if err := os.Lchown(dir, 0, 0); err != nil {
			return fmt.Errorf("socket directory: %w", err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	_ = os.Remove(awayPath()) // an agent that died away (its container restarted): this one is not
	for {
		listener, err := listenAtOnce(SocketPath)
		if err != nil {
			return err
		}
		_ = os.Remove(awayPath())
		a.mu.Lock()
		a.listener, a.away = listener, false
		a.mu.Unlock()
		err = a.accept(listener)
		a.mu.Lock()
		away := a.away
		a.mu.Unlock()
		if !away {
			return err
		}
		// Let go for a checkpoint: the daemon says when it is taken (and in a restored copy,
		// when it runs) with a SIGUSR1. A daemon that died meanwhile cannot: listen again
		// after a while all the same (a checkpoint still being taken then fails, and says why).
		select {
		case <-a.relisten:
		case <-time.After(relistenAfter):
			a.logf("no word after a checkpoint in %v: listening again", relistenAfter)
		}
	}
}

// relistenAfter is how long an agent that let go of its listener for a checkpoint waits for
// the daemon's SIGUSR1 before it listens again on its own.
const relistenAfter = 60 * time.Second

// accept serves the connections of listener until it fails or is let go.
func (a *Agent) accept(listener *net.UnixListener) error {
	for {
		raw, err := listener.AcceptUnix()
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
		if uid, err := peerUID(raw); err != nil || !trusted(uid) {
			raw.Close() // only root (the daemon's exec) may speak for the daemon
			continue
		}
		a.adopt(newConn(raw, a))
	}
}

// letGo closes the listener for a checkpoint (a socket bound on the host cannot be saved);
// the connection c is closed once its last frame is sent. A SIGUSR1 sent before now is old
// news: only one from now on makes the agent listen again.
func (a *Agent) letGo(c *conn) {
	for drained := false; !drained; {
		select {
		case <-a.relisten:
		default:
			drained = true
		}
	}
	a.mu.Lock()
	listener := a.listener
	a.away = listener != nil
	a.mu.Unlock()
	if listener != nil {
		listener.Close()
		// Its name goes too: a daemon that comes meanwhile waits for it, rather than taking a
		// refused connection for no agent at all. And a mark says why: only an agent that let go
		// is told to listen again (a signal must never reach an agent that is still starting).
		_ = os.Remove(SocketPath)
		if mark, err := os.OpenFile(awayPath(), os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			mark.Close()
		}
	}
}

// awayPath marks, beside the socket, an agent that let go of it for a checkpoint.
func awayPath() string { return filepath.Join(filepath.Dir(SocketPath), "agent.away") }

// listenAtOnce listens on path, where the name appears only once the socket listens: it
// listens under a name of its own beside path, then renames it into place. Under gVisor
// (--host-uds=create) bind(2) makes the host's file at once while listen(2) is a later
// round trip to the gofer, so a daemon that connects as soon as it sees the file would be
// refused for as long as that takes (runsc/fsgofer/lisafs.go BindAt, then Listen; a
// throttled workspace makes it hundreds of milliseconds). With the rename, a socket file
// the host sees always listens: a refusal there means no agent.
func listenAtOnce(path string) (*net.UnixListener, error) {
	fresh := path + ".new"
	_ = os.Remove(fresh)
	listener, err := net.ListenUnix("unix", &net.UnixAddr{Name: fresh, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", fresh, err)
	}
	listener.SetUnlinkOnClose(false) // its name moves: closing must not remove what is at the new one
	if err := os.Chmod(fresh, 0o600); err != nil {
		listener.Close()
		return nil, fmt.Errorf("socket mode: %w", err)
	}
	if err := os.Rename(fresh, path); err != nil {
		listener.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return listener, nil
}

// adopt makes c the connection, closing the one before.
func (a *Agent) adopt(c *conn) {
	a.mu.Lock()
	old := a.conn
	a.conn = c
	close(a.changed)
	a.changed = make(chan struct{})
	a.mu.Unlock()
	if old != nil {
		old.close()
	}
	a.abandonFiles()
	a.abandonForwards()
	go c.writeLoop()
	go a.readLoop(c)
}

func (a *Agent) drop(c *conn) {
	a.mu.Lock()
	var orphaned []*session.Session
	var forwards []*forward
	if a.conn == c {
		a.conn = nil
		close(a.changed)
		a.changed = make(chan struct{})
		for _, s := range a.sessions {
			orphaned = append(orphaned, s)
		}
		// Taken now: once the lock is let go a new connection may open forwards of its own.
		forwards = a.forwardsLocked()
	}
	a.mu.Unlock()
	c.close()
	for _, fw := range forwards {
		a.forgetForward(fw) // a forwarded connection's caller went with the daemon
	}
	for _, s := range orphaned {
		// A caller reading it comes back with the next daemon: its output waits (back-pressure)
		// a while; else nobody reads until a daemon is back: keep the head, count the rest.
		s.ReaderAway(session.ReaderGrace)
	}
}

func (a *Agent) readLoop(c *conn) {
	defer a.drop(c)
	reader := proto.NewReader(c.raw)
	for {
		frame, err := reader.Read()
		if err != nil {
			if !errors.Is(err, io.EOF) && !c.isClosed() {
				a.logf("connection: %v", err)
			}
			return
		}
		a.dispatch(c, frame)
	}
}

// greet answers a Hello. Until then the connection carries no session frame; each session
// first goes back to the daemon's last acknowledgement (what the welcome reports), so the
// daemon never sees output from beyond it, nor frames before the welcome.
func (a *Agent) greet(c *conn) {
	a.mu.Lock()
	sessions := make([]*session.Session, 0, len(a.sessions))
	for _, s := range a.sessions {
		sessions = append(sessions, s)
	}
	a.mu.Unlock()
	c.mu.Lock()
	c.greeted = false
	c.mu.Unlock()
	for _, s := range sessions {
		s.Reconnected()
	}
	c.enqueue(proto.Encode(proto.Welcome, 0, a.welcome()))
	c.mu.Lock()
	c.greeted = true
	c.mu.Unlock()
	for _, s := range sessions {
		s.Wake() // a gap at the acknowledgement is news to the daemon
	}
}

func (a *Agent) welcome() []byte {
	a.mu.Lock()
	states := make([]proto.SessionState, 0, len(a.sessions))
	for _, s := range a.sessions {
		states = append(states, s.State())
	}
	a.mu.Unlock()
	body, _ := json.Marshal(proto.WelcomeMsg{Protocol: proto.Version, Agent: Version, PID: os.Getpid(), Features: proto.Features, Sessions: states, Frozen: clock.Frozen()})
	return body
}

func setSubreaper() error {
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, 36 /* PR_SET_CHILD_SUBREAPER */, 1, 0, 0, 0, 0); errno != 0 {
		return errno
	}
	return nil
}

// peerUID is the uid of the process at the other end of a Unix socket.
func peerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	return cred.Uid, nil
}
