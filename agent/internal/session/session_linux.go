//go:build linux

// Package session runs one command: its start, its output (kept until the daemon
// acknowledges it), its input, signals, the kill ladder, its timeout, its exit.
package session

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"sandboxd/agent/internal/clock"
	"sandboxd/agent/internal/creds"
	"sandboxd/agent/internal/output"
	"sandboxd/agent/internal/proctree"
	"sandboxd/agent/internal/proto"
	"sandboxd/agent/internal/pty"
	"sandboxd/agent/internal/shell"
	"sandboxd/agent/internal/spawn"
	"sandboxd/agent/internal/users"
)

// MarkerName is the environment entry every process of a command inherits.
const MarkerName = "SANDBOXD_PROCESS_ID"

// MaxPendingInput bounds input the command has not read yet; more is dropped.
const MaxPendingInput = 16 << 20

// OOMScoreAdj makes the kernel's OOM killer pick commands before the agent.
const OOMScoreAdj = 1000

// sendChunk is the most output one frame carries.
const sendChunk = 256 << 10

// drainWindow is how long a pipe may be quiet after the command's exit before it counts
// as drained (a background writer may hold it open for ever).
const drainWindow = 20 * time.Millisecond

// drainBudget is the most reading done after the command's exit on a pipe that never goes
// quiet (a background writer flooding it).
const drainBudget = 500 * time.Millisecond

// shellStartBound is how long a Ctrl-C and the caller's input wait for the shell to reach
// the command (its login profile runs first); past it, a profile that never ends gets them.
const shellStartBound = 3 * time.Second

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
	discarded   bool
	pendingSig  []proto.SignalMsg
	pendingKill *float64
	shellUp     chan struct{} // closed once the shell is about to run the command (or shellStartBound passed)
	heldCtrlC   int           // Ctrl-Cs that came before shellUp
	until       uint64
	cursor      uint64
	cursorGap   uint64
	wake        chan struct{}

	stdin     *os.File
	master    *os.File
	input     []byte
	inputWake chan struct{}
	closeIn   bool
	lastInput byte

	oomBefore    int
	shellCmdline []byte // the shell's own /proc/<pid>/cmdline (bash), until it executes the command
	exitedAt     time.Time
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
	u, err := users.Resolve(s.spec.User, "")
	if err != nil {
		s.fail("user", err.Error())
		return
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
			return
		}
		if failure != nil {
			s.fail(failure.Stage, failure.Message)
			return
		}
	}
	if k == bashAlias {
		l.setRequest(s.ProcessID, s.spec.Command, suffix)
		s.shellCmdline = shellCmdline(shell.AliasArg)
	} else if k == bashNative {
		s.shellCmdline = shellCmdline(s.spec.Command)
	}
	pidStart := proctree.StartTime(l.pid)
	s.mu.Lock()
	s.pid, s.pidStart = l.pid, pidStart
	s.stdin, s.master = l.stdin, l.master
	s.started = true
	discarded := s.discarded
	s.mu.Unlock()
	if discarded {
		// The daemon let the session go while it was starting: the command never runs.
		l.closeAll()
		if l.proc != nil {
			l.proc.Abort()
		} else {
			proctree.HardKill(l.pid, s.marker, s.cred) // a spare: its profile is running
		}
		<-l.status
		close(s.done)
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

// awaitShell holds a Ctrl-C until the shell has read its profile. A shell that gets
// SIGINT while it waits for a child which then exits normally (the profile's `$(id -u)`)
// takes the signal as the child's and goes on: the Ctrl-C was lost (C10). One that gets
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
	s.shellStarted()
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

func capabilityNumbers(names []string) []int {
	var out []int
	for _, name := range names {
		if n, ok := capabilityByName[strings.TrimPrefix(strings.ToUpper(name), "CAP_")]; ok {
			out = append(out, n)
		}
	}
	return out
}

type reader struct {
	file    *os.File
	stream  byte
	drained chan struct{}
}

// startReaders reads every output pipe into the buffer (and the spill file).
func (s *Session) startReaders(files []*os.File) []*reader {
	var out []*reader
	for i, f := range files {
		stream := byte('1')
		if i == 1 {
			stream = '2'
		}
		r := &reader{file: f, stream: stream, drained: make(chan struct{})}
		out = append(out, r)
		go s.read(r)
	}
	return out
}

// read copies one pipe into the buffer until its end. Once the command has exited (finish
// sets a read deadline), the pipe is drained while bytes are waiting in it, for at most
// drainBudget of reading: the rest is a leftover's (a background writer), read so that it
// never blocks, and not kept. Time spent waiting for the daemon to take output
// (back-pressure) does not count: nothing the command wrote before it exited is lost.
func (s *Session) read(r *reader) {
	defer r.file.Close()
	chunk := make([]byte, 64<<10)
	forward := true
	drained := false
	var blocked time.Duration
	markDrained := func() {
		if !drained {
			drained = true
			close(r.drained)
		}
	}
	defer markDrained()
	for {
		n, err := r.file.Read(chunk)
		if n > 0 && forward {
			s.spill.feed(chunk[:n])
			began := time.Now()
			if !s.buf.Append(r.stream, chunk[:n]) {
				forward = false
			}
			blocked += time.Since(began)
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			exitedAt := s.exitTime()
			if forward && waiting(r.file) > 0 && time.Since(exitedAt)-blocked < drainBudget {
				_ = r.file.SetReadDeadline(time.Now().Add(drainWindow))
				continue
			}
			forward = false
			markDrained()
			_ = r.file.SetReadDeadline(time.Time{})
			continue
		}
		return // EOF, or EIO from a terminal whose last holder closed it
	}
}

// waiting is how many bytes can be read from f at once (FIONREAD).
func waiting(f *os.File) int {
	raw, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	var n int32
	_ = raw.Control(func(fd uintptr) {
		_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	})
	return int(n)
}

func (s *Session) exitTime() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitedAt
}

// finish waits for the output the command wrote before it exited, ends what an
// interrupted or killed command left, and reports the exit.
func (s *Session) finish(ws syscall.WaitStatus, readers []*reader) {
	now := time.Now()
	s.mu.Lock()
	s.exitedAt = now
	s.mu.Unlock()
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

func (s *Session) killDeadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killAt
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

func (s *Session) onTimeout() {
	s.mu.Lock()
	if s.exit == nil {
		s.timedOut = true
	}
	s.mu.Unlock()
	s.startKill(time.Duration(s.spec.GraceS * float64(time.Second)))
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
func (s *Session) interruptAgainIfSwallowed(pid int) {
	for deadline := time.Now().Add(swallowWatch); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
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
	}
}

// swallowWatch is how long a Ctrl-C'd shell is watched for executing its command anyway.
const swallowWatch = 2 * time.Second

// Kill runs the kill ladder over the whole tree.
func (s *Session) Kill(msg proto.KillMsg) {
	s.mu.Lock()
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

// Resize sets the terminal's size; the foreground group gets SIGWINCH.
func (s *Session) Resize(msg proto.WindowMsg) {
	s.mu.Lock()
	master, pid := s.master, s.pid
	s.mu.Unlock()
	if master != nil && pid > 0 && pty.Resize(master, msg.Columns, msg.Rows) == nil {
		_ = syscall.Kill(-pid, syscall.SIGWINCH)
	}
}

// Input queues bytes for the command's stdin (bounded; more is dropped).
func (s *Session) Input(data []byte) {
	s.mu.Lock()
	room := MaxPendingInput - len(s.input)
	if room > len(data) {
		room = len(data)
	}
	if room > 0 {
		s.input = append(s.input, data[:room]...)
	}
	if len(data) > 0 {
		s.lastInput = data[len(data)-1]
	}
	s.mu.Unlock()
	select {
	case s.inputWake <- struct{}{}:
	default:
	}
}

// CloseInput ends the command's input (in tty mode with EOF characters).
func (s *Session) CloseInput() {
	s.mu.Lock()
	if s.spec.TTY {
		// ^D ends input only at the start of a line; after a partial line it first
		// flushes that line, so a second one is needed.
		if s.lastInput == '\n' || s.lastInput == '\r' {
			s.input = append(s.input, 4)
		} else {
			s.input = append(s.input, 4, 4)
		}
	} else {
		s.closeIn = true
	}
	s.mu.Unlock()
	select {
	case s.inputWake <- struct{}{}:
	default:
	}
}

func (s *Session) writeInput() {
	// Nothing reaches the terminal before the command runs: a ^C typed there would be a
	// SIGINT the starting shell could swallow, and a profile could read what was typed.
	select {
	case <-s.shellUp:
	case <-s.done:
	}
	for {
		select {
		case <-s.inputWake:
		case <-s.done:
			if !s.spec.TTY {
				s.stdin.Close()
			}
			return
		}
		for {
			s.mu.Lock()
			pending, closing := s.input, s.closeIn
			s.input = nil
			s.mu.Unlock()
			if len(pending) > 0 {
				if _, err := s.stdin.Write(pending); err != nil {
					// The command closed its stdin: what it did not read is gone.
					s.mu.Lock()
					s.input = nil
					s.mu.Unlock()
				}
				continue
			}
			if closing && !s.spec.TTY {
				s.stdin.Close()
				return
			}
			break
		}
	}
}

// Pull acknowledges output and allows more to be sent.
func (s *Session) Pull(msg proto.PullMsg) {
	s.buf.Ack(msg.Ack, msg.AckGap)
	s.mu.Lock()
	if msg.Until > s.until {
		s.until = msg.Until
	}
	window := 0
	if s.until > msg.Ack {
		window = int(s.until - msg.Ack)
	}
	s.buf.SetReader(msg.Reader, window)
	if msg.Ack > s.cursor || (msg.Ack == s.cursor && msg.AckGap > s.cursorGap) {
		s.cursor, s.cursorGap = msg.Ack, msg.AckGap
	}
	s.mu.Unlock()
	if msg.Tail {
		// With no reader and more held than Cap, nothing more is kept until an
		// acknowledgement: the end told here stays the end of what is held.
		_, _, end, _ := s.buf.State()
		s.send(proto.Tail, proto.TailMsg{End: end})
	}
	s.poke()
}

// ReaderGone says no daemon is connected: the output is kept up to the buffer's size, and
// what does not fit is dropped (counted) rather than blocking the command.
func (s *Session) ReaderGone() { s.buf.SetReader(false, 0) }

// Reconnected restarts sending from what the daemon acknowledged (it lost the rest).
func (s *Session) Reconnected() {
	ack, ackGap, _, _ := s.buf.State()
	s.mu.Lock()
	s.cursor, s.cursorGap, s.until = ack, ackGap, ack
	s.mu.Unlock()
	s.poke()
}

// Wake makes the session look again for frames it may send.
func (s *Session) Wake() { s.poke() }

// pump sends output between the cursor and the daemon's limit.
//
// Output read in small pieces while the previous frame left less than coalesceWindow ago
// waits out the rest of that window, so a flood goes in frames of up to sendChunk (each
// frame costs the daemon the same, whatever its size) and a lone prompt goes at once.
func (s *Session) pump() {
	var lastSent time.Time
	for {
		changed := s.buf.Changed()
		connection := s.host.Connected()
		s.mu.Lock()
		cursor, cursorGap, until, discarded := s.cursor, s.cursorGap, s.until, s.discarded
		s.mu.Unlock()
		if discarded {
			return
		}
		pieces := s.buf.Since(cursor, cursorGap, until, sendChunk)
		size := pieceBytes(pieces)
		if wait := coalesceWindow - time.Since(lastSent); wait > 0 && size < sendChunk {
			select {
			case <-time.After(wait):
			case <-s.exiting:
				lastSent = time.Time{}
			}
			continue
		}
		sent := false
		for _, f := range frames(pieces, size) {
			var ok bool
			if f.Gap > 0 {
				body, _ := json.Marshal(proto.DroppedMsg{Offset: f.Offset, Bytes: f.Gap})
				ok = s.host.Send(proto.Dropped, s.Channel, body)
				cursor, cursorGap = f.Offset, f.Gap
			} else {
				ok = s.host.SendFrame(proto.InPlace(f.Data, proto.Output, s.Channel))
				cursor, cursorGap = f.Offset+uint64(len(f.Data)-outputHeader), 0
			}
			if !ok {
				break
			}
			sent = true
		}
		s.mu.Lock()
		if sent && (cursor > s.cursor || (cursor == s.cursor && cursorGap > s.cursorGap)) {
			s.cursor, s.cursorGap = cursor, cursorGap
		}
		s.mu.Unlock()
		if sent {
			lastSent = time.Now()
			continue
		}
		select {
		case <-changed:
		case <-s.wake:
		case <-connection:
		}
	}
}

// coalesceWindow is the shortest time between two frames of small output.
const coalesceWindow = 2 * time.Millisecond

// waitSent waits (briefly: a daemon may be away) until the pump has sent every byte up
// to end that the daemon allows, so that the exit comes after the output it accounts for.
func (s *Session) waitSent(end uint64) {
	s.poke()
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); {
		s.mu.Lock()
		limit := end
		if s.until < limit {
			limit = s.until
		}
		sent := s.cursor >= limit
		s.mu.Unlock()
		if sent {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func pieceBytes(pieces []output.Piece) int {
	n := 0
	for _, p := range pieces {
		n += len(p.Data)
	}
	return n
}

// outputHeader is what precedes the bytes in an output frame as built by frames: the
// frame header, then the stream byte and the offset.
const outputHeader = proto.HeaderSize + 9

// frames turns pieces (size bytes of data in all) into frames: a gap as it is, adjacent data
// of one stream merged into one output frame, built whole in Data (header room, stream
// byte, offset, bytes).
func frames(pieces []output.Piece, size int) []output.Piece {
	var out []output.Piece
	for _, p := range pieces {
		if p.Gap > 0 {
			out = append(out, p)
			continue
		}
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.Gap == 0 && last.Stream == p.Stream && last.Offset+uint64(len(last.Data)-outputHeader) == p.Offset {
				last.Data = append(last.Data, p.Data...)
				continue
			}
		}
		frame := make([]byte, outputHeader, outputHeader+size)
		frame[proto.HeaderSize] = p.Stream
		binary.BigEndian.PutUint64(frame[proto.HeaderSize+1:outputHeader], p.Offset)
		out = append(out, output.Piece{Stream: p.Stream, Offset: p.Offset, Data: append(frame, p.Data...)})
	}
	return out
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
	}
}

// Done is closed once the command's end (or its failure to start) is reported.
func (s *Session) Done() <-chan struct{} { return s.done }

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

// spill is a copy of the output in a file of the user's, started once it passes after bytes.
type spill struct {
	mu     sync.Mutex
	path   string
	after  int64
	size   int64
	head   [][]byte
	file   *os.File
	broken bool
	user   creds.User
}

func newSpill(path string, after int64, u creds.User) *spill {
	return &spill{path: path, after: after, broken: path == "" || after <= 0, user: u}
}

func (sp *spill) feed(data []byte) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.broken {
		return
	}
	sp.size += int64(len(data))
	if sp.file == nil {
		sp.head = append(sp.head, append([]byte(nil), data...))
		if sp.size <= sp.after {
			return
		}
		// Created with the user's rights, so that it is the user's file in the user's directory.
		err := creds.As(sp.user, func() error {
			if err := os.MkdirAll(filepath.Dir(sp.path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(sp.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o644)
			sp.file = f
			return err
		})
		if err != nil {
			sp.broken, sp.head = true, nil
			return
		}
		for _, chunk := range sp.head {
			if _, err := sp.file.Write(chunk); err != nil {
				sp.broken = true
				break
			}
		}
		sp.head = nil
		return
	}
	if _, err := sp.file.Write(data); err != nil {
		sp.broken = true
	}
}

func (sp *spill) close() string {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.file == nil {
		return ""
	}
	if err := sp.file.Close(); err != nil {
		sp.broken = true
	}
	if sp.broken {
		return ""
	}
	return sp.path
}
