//go:build linux

package session

// These tests run real commands through a Session, with a host that starts them as the
// agent does (the test binary is also the spawn helper: TestMain) and keeps the frames the
// session sends, decoded with the frame codec. As root, the commands run as nobody;
// otherwise as the test's own user. Spares are frozen: a command starts its own shell.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"sandboxd/agent/internal/output"
	"sandboxd/agent/internal/proto"
	"sandboxd/agent/internal/spawn"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "spawn" {
		spawn.Child(map[string]func() int{})
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testHost = newHost(self)
	os.Exit(m.Run())
}

var testHost *host

// host is what the agent is to a session, less the connection: frames go to a channel per
// session, and every child is reaped by whoever expects it.
type host struct {
	pool   *spawn.Pool
	spares *Spares

	mu      sync.Mutex
	frames  map[uint32]chan proto.Frame
	changed chan struct{}
}

func newHost(self string) *host {
	h := &host{frames: map[uint32]chan proto.Frame{}, changed: make(chan struct{})}
	h.pool = spawn.NewPool(self, func(pid int) { go func() { <-h.Expect(pid) }() })
	h.spares = NewSpares(h)
	h.spares.Freeze(true)
	return h
}

func (h *host) framesOf(channel uint32) chan proto.Frame {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch, ok := h.frames[channel]
	if !ok {
		ch = make(chan proto.Frame, 4096)
		h.frames[channel] = ch
	}
	return ch
}

func (h *host) Send(kind byte, channel uint32, payload []byte) bool {
	return h.SendFrame(proto.Encode(kind, channel, payload))
}

func (h *host) SendFrame(frame []byte) bool {
	f, err := proto.NewReader(bytes.NewReader(frame)).Read()
	if err != nil {
		panic(fmt.Sprintf("the session sent a frame the codec cannot read: %v", err))
	}
	h.framesOf(f.Channel) <- f
	return true
}

func (h *host) Connected() <-chan struct{} { return h.changed }

func (h *host) Expect(pid int) <-chan syscall.WaitStatus {
	ch := make(chan syscall.WaitStatus, 1)
	go func() {
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(pid, &ws, 0, nil)
			if err != syscall.EINTR {
				break
			}
		}
		ch <- ws
	}()
	return ch
}

func (h *host) Spawn(req spawn.Request, stdio [3]*os.File, extra []*os.File, tty bool) (*spawn.Process, *spawn.Failure, error) {
	return h.pool.Start(req, stdio, extra, tty)
}

func (h *host) Spares() *Spares { return h.spares }

// user is who commands run as: nobody as root (so privileges are really dropped), the
// test's own user otherwise (a helper that is not root may not change user).
func user() string {
	if os.Getuid() == 0 {
		return "65534:65534"
	}
	return strconv.Itoa(os.Getuid()) + ":" + strconv.Itoa(os.Getgid())
}

var channels atomic.Uint32

// call is one command run through a Session, and what it sent.
type call struct {
	t       *testing.T
	s       *Session
	frames  chan proto.Frame
	pid     int
	streams map[byte][]byte // output by stream ('1', '2')
	total   uint64          // output bytes received, both streams
	exit    *proto.ExitedMsg
	failed  *proto.FailedMsg
	taken   uint64 // input the command's stdin took, as the last FileTook said
}

// start runs command in a new session whose output the test reads as it comes.
func start(t *testing.T, command string, edit func(*proto.StartMsg)) *call {
	t.Helper()
	channel := channels.Add(1)
	msg := proto.StartMsg{
		ProcessID:   fmt.Sprintf("p-session-test%d", channel),
		Command:     command,
		Cwd:         "/",
		Env:         [][2]string{{"PATH", "/usr/local/bin:/usr/bin:/bin"}},
		User:        user(),
		Columns:     80,
		Rows:        24,
		TimeoutS:    60,
		GraceS:      0.5,
		BufferBytes: 1 << 20,
	}
	if edit != nil {
		edit(&msg)
	}
	c := &call{t: t, s: New(testHost, channel, msg), frames: testHost.framesOf(channel), streams: map[byte][]byte{}}
	c.s.Pull(proto.PullMsg{Until: 1 << 40, Reader: true})
	go c.s.Run()
	t.Cleanup(c.s.Discard)
	return c
}

// step returns the session's next frame, keeping (and acknowledging) output.
func (c *call) step() proto.Frame {
	c.t.Helper()
	var f proto.Frame
	select {
	case f = <-c.frames:
	case <-time.After(30 * time.Second):
		c.t.Fatalf("no frame in 30 s; output so far %q", c.streams)
	}
	switch f.Kind {
	case proto.Output:
		if len(f.Payload) < 9 {
			c.t.Fatalf("short output frame %q", f.Payload)
		}
		if offset := binary.BigEndian.Uint64(f.Payload[1:9]); offset != c.total {
			c.t.Fatalf("output at offset %d after %d bytes", offset, c.total)
		}
		c.streams[f.Payload[0]] = append(c.streams[f.Payload[0]], f.Payload[9:]...)
		c.total += uint64(len(f.Payload) - 9)
		c.s.Pull(proto.PullMsg{Ack: c.total, Until: 1 << 40, Reader: true})
	case proto.Started:
		var msg proto.StartedMsg
		c.decode(f, &msg)
		c.pid = msg.PID
	case proto.Exited:
		c.exit = &proto.ExitedMsg{}
		c.decode(f, c.exit)
	case proto.Failed:
		c.failed = &proto.FailedMsg{}
		c.decode(f, c.failed)
	case proto.FileTook:
		var msg proto.FileTookMsg
		c.decode(f, &msg)
		if msg.Bytes < c.taken {
			c.t.Fatalf("input taken went back from %d to %d", c.taken, msg.Bytes)
		}
		c.taken = msg.Bytes
	default:
		c.t.Fatalf("unexpected frame %q %s", f.Kind, f.Payload)
	}
	return f
}

func (c *call) decode(f proto.Frame, v any) {
	c.t.Helper()
	if err := json.Unmarshal(f.Payload, v); err != nil {
		c.t.Fatalf("frame %q: %v", f.Kind, err)
	}
}

// waitFor reads frames until the command's stdout holds text: the command is ready.
func (c *call) waitFor(text string) {
	c.t.Helper()
	for !bytes.Contains(c.streams['1'], []byte(text)) {
		if f := c.step(); f.Kind != proto.Started && f.Kind != proto.Output {
			c.t.Fatalf("frame %q %s before the output %q", f.Kind, f.Payload, text)
		}
	}
}

// wait reads frames until the command exited (or failed to start) and returns its exit.
func (c *call) wait() *proto.ExitedMsg {
	c.t.Helper()
	for c.exit == nil && c.failed == nil {
		c.step()
	}
	if c.failed != nil {
		c.t.Fatalf("the command failed to start: %+v", c.failed)
	}
	select {
	case <-c.s.Done():
	case <-time.After(5 * time.Second):
		c.t.Fatal("Done is not closed once the exit is reported")
	}
	return c.exit
}

func TestAnExitIsReportedAfterTheOutputItAccountsFor(t *testing.T) {
	c := start(t, "printf out; printf err >&2; exit 7", nil)
	exit := c.wait()
	if c.pid <= 0 {
		t.Errorf("started pid %d", c.pid)
	}
	if got := string(c.streams['1']); got != "out" {
		t.Errorf("stdout %q, want %q", got, "out")
	}
	if got := string(c.streams['2']); got != "err" {
		t.Errorf("stderr %q, want %q", got, "err")
	}
	want := proto.ExitedMsg{ExitCode: 7, End: 6}
	if *exit != want {
		t.Errorf("exit %+v, want %+v", *exit, want)
	}
	state := c.s.State()
	if state.Running || state.Exit == nil || state.Exit.ExitCode != 7 || state.End != 6 || state.PID != c.pid {
		t.Errorf("state after the exit %+v", state)
	}
}

func TestMergedStderrIsOneStream(t *testing.T) {
	c := start(t, "echo a; echo b >&2; echo c", func(m *proto.StartMsg) { m.MergeStderr = true })
	c.wait()
	if got := string(c.streams['1']); got != "a\nb\nc\n" {
		t.Errorf("stdout %q, want %q", got, "a\nb\nc\n")
	}
	if len(c.streams['2']) != 0 {
		t.Errorf("stderr %q, want none", c.streams['2'])
	}
}

func TestInputReachesTheCommandAndItsEndEndsIt(t *testing.T) {
	c := start(t, "while IFS= read -r line; do echo \"got $line\"; done; echo done", nil)
	c.s.Input([]byte("one\ntw"))
	c.s.Input([]byte("o\n"))
	c.s.CloseInput()
	if exit := c.wait(); exit.ExitCode != 0 {
		t.Errorf("exit code %d", exit.ExitCode)
	}
	if got, want := string(c.streams['1']), "got one\ngot two\ndone\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	// What a daemon windows its input by (FeatureInputTaken): all 8 bytes in, and taken.
	if state := c.s.State(); c.taken != 8 || state.InputReceived != 8 || state.InputTaken != 8 {
		t.Errorf("taken %d, state received %d taken %d; want 8 each", c.taken, state.InputReceived, state.InputTaken)
	}
}

// waitForProcess waits until a process runs with exactly args as its command line: the
// command is where the test may signal it.
func waitForProcess(t *testing.T, args ...string) {
	t.Helper()
	want := strings.Join(args, "\x00") + "\x00"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(cmdline) == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no process %q ran within 10 s", args)
		}
	}
}

func TestASignalReachesTheCommand(t *testing.T) {
	c := start(t, "exec sleep 60.41", nil)
	waitForProcess(t, "sleep", "60.41")
	c.s.Signal(proto.SignalMsg{Signal: int(syscall.SIGTERM)})
	exit := c.wait()
	if exit.Signal != int(syscall.SIGTERM) || exit.ExitCode != 128+int(syscall.SIGTERM) || exit.TimedOut {
		t.Errorf("exit %+v, want SIGTERM (143)", *exit)
	}
}

func TestCtrlCInterruptsTheCommandAndIsRecorded(t *testing.T) {
	c := start(t, "sleep 60.42; echo unreachable", nil)
	waitForProcess(t, "sleep", "60.42")
	c.s.Signal(proto.SignalMsg{Signal: int(syscall.SIGINT), Interrupt: true})
	exit := c.wait()
	if exit.Signal != int(syscall.SIGINT) || exit.ExitCode != 130 {
		t.Errorf("exit %+v, want SIGINT (130)", *exit)
	}
	if !c.s.State().Interrupted || len(c.streams['1']) != 0 {
		t.Errorf("interrupted %v, output %q; want true and none", c.s.State().Interrupted, c.streams['1'])
	}
}

func TestTheKillLadderEndsACommandThatIgnoresSIGTERM(t *testing.T) {
	c := start(t, "trap '' TERM; sleep 60.43; echo survived", nil)
	waitForProcess(t, "sleep", "60.43") // TERM is ignored by now: the trap ran before the fork
	began := time.Now()
	c.s.Kill(proto.KillMsg{GraceS: 0.2})
	exit := c.wait()
	if exit.Signal != int(syscall.SIGKILL) || exit.ExitCode != 137 {
		t.Errorf("exit %+v, want SIGKILL (137)", *exit)
	}
	if took := time.Since(began); took < 200*time.Millisecond {
		t.Errorf("SIGKILL came %s after the kill, before its grace of 200ms", took)
	}
	if bytes.Contains(c.streams['1'], []byte("survived")) {
		t.Error("the command went on after the kill")
	}
}

func TestATimeoutEndsTheCommandAndSaysSo(t *testing.T) {
	c := start(t, "sleep 60.44", func(m *proto.StartMsg) { m.TimeoutS, m.GraceS = 1, 0.2 })
	exit := c.wait()
	if !exit.TimedOut || exit.Signal != int(syscall.SIGTERM) || exit.ExitCode != 143 {
		t.Errorf("exit %+v, want a timeout ended by SIGTERM (143)", *exit)
	}
}

func TestAStartThatFailsIsReportedWithItsStage(t *testing.T) {
	c := start(t, "true", func(m *proto.StartMsg) { m.Cwd = "/nonexistent-directory" })
	for c.failed == nil && c.exit == nil {
		c.step()
	}
	if c.failed == nil || c.failed.Stage != "chdir" {
		t.Fatalf("failed %+v exit %+v, want a failure at stage chdir", c.failed, c.exit)
	}
	if want := "working directory /nonexistent-directory: no such file or directory"; c.failed.Message != want {
		t.Errorf("message %q, want %q", c.failed.Message, want)
	}
	if state := c.s.State(); state.Failed == nil || *state.Failed != *c.failed || state.Running {
		t.Errorf("state %+v", state)
	}
}

func TestATerminalHasTheSizeAskedForAndItsResize(t *testing.T) {
	c := start(t, "stty size; echo ready; read _; stty size", func(m *proto.StartMsg) {
		m.TTY, m.Columns, m.Rows = true, 100, 30
	})
	c.waitFor("ready")
	c.s.Resize(proto.WindowMsg{Columns: 120, Rows: 40})
	c.s.Input([]byte("\n"))
	c.wait()
	if got, want := string(c.streams['1']), "30 100\r\nready\r\n\r\n40 120\r\n"; got != want {
		t.Errorf("terminal output %q, want %q", got, want)
	}
}

func TestOutputPastTheSpillThresholdIsCopiedToTheSpillFile(t *testing.T) {
	dir := t.TempDir()
	// The spill file is created as the command's user.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "spill", "out.log")
	c := start(t, "seq 1 100", func(m *proto.StartMsg) { m.SpillPath, m.SpillAfterBytes = path, 10 })
	exit := c.wait()
	if exit.SpillPath != path {
		t.Fatalf("spill path %q, want %q", exit.SpillPath, path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, c.streams['1']) || len(data) != 292 {
		t.Errorf("spill file holds %d bytes, stdout %d; want the same 292", len(data), len(c.streams['1']))
	}
}

func TestFramesMergeAdjacentPiecesOfOneStreamOnly(t *testing.T) {
	pieces := []output.Piece{
		{Stream: '1', Offset: 0, Data: []byte("ab")},
		{Stream: '1', Offset: 2, Data: []byte("cd")},
		{Stream: '2', Offset: 4, Data: []byte("e")},
		{Offset: 5, Gap: 3},
		{Stream: '2', Offset: 8, Data: []byte("f")},
	}
	got := frames(pieces, 6)
	type frame struct {
		stream byte
		offset uint64
		data   string
		gap    uint64
	}
	var summary []frame
	for _, f := range got {
		if f.Gap > 0 {
			summary = append(summary, frame{offset: f.Offset, gap: f.Gap})
			continue
		}
		body := f.Data[proto.HeaderSize:]
		if body[0] != f.Stream || binary.BigEndian.Uint64(body[1:9]) != f.Offset {
			t.Errorf("frame of %+v has a header of stream %q offset %d", f, body[0], binary.BigEndian.Uint64(body[1:9]))
		}
		summary = append(summary, frame{stream: f.Stream, offset: f.Offset, data: string(body[9:])})
	}
	want := []frame{{'1', 0, "abcd", 0}, {'2', 4, "e", 0}, {0, 5, "", 3}, {'2', 8, "f", 0}}
	if fmt.Sprint(summary) != fmt.Sprint(want) {
		t.Errorf("frames %v, want %v", summary, want)
	}
}

// A loaded machine may not run a pipe's reader until long after the command's exit. What was
// waiting in the pipe then is the command's, written before it exited: it is kept, however
// late the reader first runs (it was taken for a background writer's flood and dropped, and
// the command's exit came with none of its output).
func TestAReaderThatFirstRunsLongAfterTheExitKeepsWhatWasWaiting(t *testing.T) {
	s := New(testHost, channels.Add(1), proto.StartMsg{ProcessID: "p-late-reader", BufferBytes: 1 << 20})
	s.spill = &spill{broken: true} // no spill file: it is Run that opens one
	rf, wf, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer wf.Close() // held open, as by a background child: no end of file comes
	want := []byte("the command's one line\n")
	if _, err := wf.Write(want); err != nil {
		t.Fatal(err)
	}
	_ = rf.SetReadDeadline(time.Now()) // the command exited (as finish does)
	time.Sleep(drainBudget + 100*time.Millisecond)
	r := &reader{file: rf, stream: '1', drained: make(chan struct{})}
	go s.read(r)
	select {
	case <-r.drained:
	case <-time.After(10 * time.Second):
		t.Fatal("the pipe was never counted drained")
	}
	var got []byte
	for _, p := range s.buf.Since(0, 0, 1<<40, 1<<20) {
		got = append(got, p.Data...)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("kept %q, want %q", got, want)
	}
}

// A Ctrl-C'd shell that may yet execute its command (which would never see the signal) is
// watched for 2 s, and on while it stays runnable without the CPU to get there: on a loaded
// machine a shell waited seconds between the signal and its execve, and the Ctrl-C was lost.
func TestASwallowedCtrlCIsWatchedForWhileTheShellIsStarved(t *testing.T) {
	for _, c := range []struct {
		waited time.Duration
		state  byte
		used   time.Duration
		want   bool
	}{
		{time.Second, 'S', time.Second, true},                // within the first 2 s: always
		{3 * time.Second, 'R', 0, true},                      // runnable, no CPU since: starved
		{3 * time.Second, 'D', 10 * time.Millisecond, true},  // in the kernel, hardly run
		{3 * time.Second, 'R', 60 * time.Millisecond, false}, // it ran on past the signal
		{3 * time.Second, 'S', 0, false},                     // asleep: it waits for a child
		{31 * time.Second, 'R', 0, false},                    // the bound
	} {
		if got := stillWatched(c.waited, c.state, c.used); got != c.want {
			t.Errorf("stillWatched(%v, %c, %v) = %v, want %v", c.waited, c.state, c.used, got, c.want)
		}
	}
}
