//go:build linux

// Package session runs one command: its start, its output (kept until the daemon
// acknowledges it), its input, signals, the kill ladder, its timeout, its exit.
package session

import (
	"encoding/json"
	"os"
	"sync"
	"syscall"
	"time"

	"sandboxd/agent/internal/clock"
	"sandboxd/agent/internal/creds"
	"sandboxd/agent/internal/output"
	"sandboxd/agent/internal/proctree"
	"sandboxd/agent/internal/proto"
	"sandboxd/agent/internal/shell"
	"sandboxd/agent/internal/spawn"
	"sandboxd/agent/internal/users"
)

// MarkerName is the environment entry every process of a command inherits.
const MarkerName = "SANDBOXD_PROCESS_ID"

// OOMScoreAdj makes the kernel's OOM killer pick commands before the agent.
const OOMScoreAdj = 1000

// Host is what a session needs from the agent.
type Host interface {
	// Send queues a frame for the daemon; false when no daemon is connected.
	Send(kind byte, channel uint32, payload []byte) bool
	// SendFrame queues a frame built in place (proto.InPlace); false when no daemon is connected.
	SendFrame(frame []byte) bool
	// Connected returns a channel closed when the current connection goes (or a new one comes).
	Connected() <-chan struct{}
	// Expect registers a child's pid; its wait status arrives on the returned channel.
	Expect(pid int) <-chan syscall.WaitStatus
	// Spawn starts the command's helper (spawn.Pool.Start).
	Spawn(req spawn.Request, stdio [3]*os.File, extra []*os.File, tty bool) (*spawn.Process, *spawn.Failure, error)
	// Spares are the login shells started ahead of need.
	Spares() *Spares
}

// Session is one command.
type Session struct {
	Channel   uint32
	ProcessID string

	host   Host
	spec   proto.StartMsg
	user   users.User
	cred   creds.User
	marker []byte
	buf    *output.Buffer

	mu          sync.Mutex
	pid         int
	pidStart    uint64 // when pid started (proctree.StartTime)
	started     bool
	startFailed *proto.FailedMsg
	exit        *proto.ExitedMsg
	interrupted bool
	killing     bool
	killAt      time.Time
	timedOut    bool
	killed      bool // a Kill was asked for (reported with the exit)
	discarded   bool
	pendingSig  []proto.SignalMsg
	pendingKill *float64
	shellUp     chan struct{} // closed once the shell is about to run the command (or shellStartBound passed)
	heldCtrlC   int           // Ctrl-Cs that came before shellUp
	shellReady  bool          // the shell wrote its ready byte: blocked reading its command, it forks nothing more
	earlyCtrlC  bool          // a Ctrl-C went to the shell before it was ready: its profile may have swallowed it
	until       uint64
	cursor      uint64
	cursorGap   uint64
	rewound     uint64 // counts moves of the cursor back (a resend, a reconnect): a send begun before one must not move it on
	readerAway  uint64 // counts pulls and breaks: a ReaderAway's timer acts only if none came since
	wake        chan struct{}

	stdin     *os.File
	master    *os.File
	input     []byte
	inputWake chan struct{}
	// inputReceived and inputTaken count input in (queued) and out (written, or discarded
	// with a stdin the command closed): what FeatureInputTaken reports.
	inputReceived uint64
	inputTaken    uint64
	closeIn       bool
	lastInput     byte

	oomBefore    int
	shellCmdline []byte // the shell's own /proc/<pid>/cmdline (bash), until it executes the command
	spill        *spill
	exiting      chan struct{} // closed when the command has exited: its last output goes at once
	done         chan struct{}
}

// New makes a session for a Start frame; Run starts its command.
func New(host Host, channel uint32, msg proto.StartMsg) *Session {
	s := &Session{
		Channel:   channel,
		ProcessID: msg.ProcessID,
		host:      host,
		spec:      msg,
		marker:    []byte(MarkerName + "=" + msg.ProcessID),
		buf:       output.New(msg.BufferBytes),
		wake:      make(chan struct{}, 1),
		inputWake: make(chan struct{}, 1),
		exiting:   make(chan struct{}),
		shellUp:   make(chan struct{}),
		done:      make(chan struct{}),
	}
	// The call that starts a command reads it: until the first Pull says more, a full
	// buffer holds the command back rather than dropping what a slow daemon had yet to
	// ask for (a daemon that goes away says otherwise: ReaderGone).
	s.buf.SetReader(true, 0)
	return s
}

func (s *Session) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Session) send(kind byte, v any) {
	body, _ := json.Marshal(v)
	s.host.Send(kind, s.Channel, body)
}

func (s *Session) fail(stage, message string) {
	f := &proto.FailedMsg{Stage: stage, Message: message}
	s.mu.Lock()
	s.startFailed = f
	s.mu.Unlock()
	s.send(proto.Failed, f)
	close(s.done)
}

// Run starts the command and follows it to its end; it returns when the command has
// exited and its exit has been reported (its leftovers are still watched).
//
// A command that bash runs in alias mode takes the user's spare if one fits (Spares.Take):
// its shell is started already, profile read. Any other starts its shell now. Either way
// the command then runs in the same way, and a spare like its shell is asked for.
func (s *Session) Run() {
	l, spec, k, ok := s.startShell()
	if !ok {
		return
	}
	pidStart := proctree.StartTime(l.pid)
	s.mu.Lock()
	s.pid, s.pidStart = l.pid, pidStart
	s.stdin, s.master = l.stdin, l.master
	s.started = true
	discarded := s.discarded
	s.mu.Unlock()
	if discarded {
		s.abandonStart(l)
		return
	}
	// Reported before the command can run: a command that kills everything at once
	// still is a command that started.
	s.send(proto.Started, proto.StartedMsg{PID: l.pid})
	if l.proc != nil {
		proc := l.proc
		l.proc = nil
		if failure := proc.Go(); failure != nil {
			l.closeAll()
			s.fail(failure.Stage, failure.Message)
			return
		}
	}
	if k != plainSh {
		// Made once this command's end is reported: under gVisor a login shell starting
		// beside the report's scan of the workspace's processes slows both.
		s.host.Spares().Want(spec, s.done)
	}
	go s.awaitShell(l)
	s.applyPending()
	go s.writeInput()
	if s.spec.TimeoutS > 0 {
		clock.AfterFunc(time.Duration(s.spec.TimeoutS*float64(time.Second)), s.onTimeout)
	}
	readers := s.startReaders(l.outs)
	go s.pump()
	ws := <-l.status
	s.finish(ws, readers)
}

// startShell has the command's shell ready to be let go: the user's spare when one fits,
// else a shell started now. False when it could not start (the failure is reported).
func (s *Session) startShell() (*launched, shellSpec, kind, bool) {
	u, err := users.Resolve(s.spec.User, "")
	if err != nil {
		s.fail("user", err.Error())
		return nil, shellSpec{}, 0, false
	}
	s.user = u
	s.cred = creds.User{UID: u.UID, GID: u.GID, Groups: u.Groups}
	s.oomBefore = oomKills()
	s.spill = newSpill(s.spec.SpillPath, s.spec.SpillAfterBytes, s.cred)
	spec := specOf(s.spec, u)
	k, suffix := kindOf(s.spec.Command)
	var l *launched
	if k == bashAlias && !spec.tty {
		l = s.host.Spares().Take(spec)
	}
	if l == nil {
		var failure *spawn.Failure
		l, failure, err = launch(s.host, spec, k, s.spec.Command, s.marker)
		if err != nil {
			s.fail("spawn", err.Error())
			return nil, spec, k, false
		}
		if failure != nil {
			s.fail(failure.Stage, failure.Message)
			return nil, spec, k, false
		}
	}
	if k == bashAlias {
		l.setRequest(s.ProcessID, s.spec.Command, suffix)
		s.shellCmdline = shellCmdline(shell.AliasArg)
	} else if k == bashNative {
		s.shellCmdline = shellCmdline(s.spec.Command)
	}
	return l, spec, k, true
}

// abandonStart ends a shell the daemon let go of while it was starting: the command never runs.
func (s *Session) abandonStart(l *launched) {
	l.closeAll()
	if l.proc != nil {
		l.proc.Abort()
	} else {
		proctree.HardKill(l.pid, s.marker, s.cred) // a spare: its profile is running
	}
	<-l.status
	close(s.done)
}

// Discard lets the session go. A command still running is killed with its whole tree; an
// exited one's leftovers (a server started with &) stay under its timeout, as they would
// had the session been kept.
func (s *Session) Discard() {
	s.mu.Lock()
	s.discarded = true
	running := s.started && s.exit == nil
	s.mu.Unlock()
	if running {
		proctree.HardKill(s.pid, s.marker, s.cred)
	}
	s.buf.Close()
	s.poke()
}

// State is the session as a (re)connecting daemon is told it.
func (s *Session) State() proto.SessionState {
	ack, ackGap, end, _ := s.buf.State()
	s.mu.Lock()
	defer s.mu.Unlock()
	return proto.SessionState{
		Channel:     s.Channel,
		ProcessID:   s.ProcessID,
		PID:         s.pid,
		Running:     s.started && s.exit == nil,
		Ack:         ack,
		AckGap:      ackGap,
		End:         end,
		Exit:        s.exit,
		Failed:      s.startFailed,
		Interrupted: s.interrupted,
		DaemonState: s.spec.DaemonState,
		Reading:     s.buf.Reading() && s.exit == nil,

		InputReceived: s.inputReceived,
		InputTaken:    s.inputTaken,
	}
}

// Rename gives the session the process id and daemon state of a copy of the workspace
// restored from a checkpoint (PROTOCOL.md, R). Its processes keep their marker: it is how
// the agent finds them, never shown.
func (s *Session) Rename(msg proto.RenameMsg) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ProcessID = msg.ProcessID
	s.spec.DaemonState = msg.DaemonState
}

// Done is closed once the command's end (or its failure to start) is reported.
func (s *Session) Done() <-chan struct{} { return s.done }
