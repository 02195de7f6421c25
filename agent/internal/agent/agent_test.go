//go:build linux

package agent

// These tests run the agent in the test process on a socket of its own and speak the
// frame protocol to it as the daemon does. The test binary is also the spawn helper
// (TestMain), so commands and file operations start exactly as in a workspace: as
// root, the commands run as nobody; otherwise as the test's own user.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"sandboxd/agent/internal/fileops"
	"sandboxd/agent/internal/output"
	"sandboxd/agent/internal/proto"
	"sandboxd/agent/internal/spawn"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "spawn" {
		spawn.Child(fileops.Helpers)
	}
	dir, err := os.MkdirTemp("", "sandboxd-agent-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	SocketPath = filepath.Join(dir, "agent.sock")
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testAgent = New(self)
	go func() {
		err := testAgent.Serve()
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}()
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// user is who commands run as: nobody when the tests run as root (so privileges are
// really dropped), the test's own user otherwise (a non-root agent may not change user).
func user() string {
	if os.Getuid() == 0 {
		return "65534:65534"
	}
	return strconv.Itoa(os.Getuid()) + ":" + strconv.Itoa(os.Getgid())
}

var channels atomic.Uint32

func nextChannel() uint32 { return channels.Add(1) }

// daemon is one connection to the agent, speaking for the daemon.
type daemon struct {
	t      *testing.T
	conn   net.Conn
	reader *proto.Reader
}

// connect dials the agent and says hello; it returns the connection and the welcome.
// The agent serves one connection at a time, so tests that connect run one by one.
func connect(t *testing.T) (*daemon, proto.WelcomeMsg) {
	t.Helper()
	var conn net.Conn
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		conn, err = net.Dial("unix", SocketPath)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent does not listen: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	d := &daemon{t: t, conn: conn, reader: proto.NewReader(conn)}
	t.Cleanup(func() { conn.Close() })
	d.send(proto.Hello, 0, proto.HelloMsg{Protocol: proto.Version})
	frame := d.next()
	if frame.Kind != proto.Welcome {
		t.Fatalf("first frame %q %s, want a welcome", frame.Kind, frame.Payload)
	}
	var welcome proto.WelcomeMsg
	if err := json.Unmarshal(frame.Payload, &welcome); err != nil {
		t.Fatal(err)
	}
	return d, welcome
}

func (d *daemon) send(kind byte, channel uint32, v any) {
	d.t.Helper()
	payload, ok := v.([]byte)
	if !ok && v != nil {
		var err error
		if payload, err = json.Marshal(v); err != nil {
			d.t.Fatal(err)
		}
	}
	if _, err := d.conn.Write(proto.Encode(kind, channel, payload)); err != nil {
		d.t.Fatal(err)
	}
}

func (d *daemon) next() proto.Frame {
	d.t.Helper()
	_ = d.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	frame, err := d.reader.Read()
	if err != nil {
		d.t.Fatalf("reading a frame: %v", err)
	}
	return frame
}

// run is one command's frames, read until it exits (or fails to start).
type run struct {
	channel uint32
	pid     int
	output  []byte
	exit    *proto.ExitedMsg
	failed  *proto.FailedMsg
	mayFail bool   // a test of failures to start
	taken   uint64 // input taken, as the session's last FileTook said
}

func start(d *daemon, command string, edit func(*proto.StartMsg)) *run {
	d.t.Helper()
	r := &run{channel: nextChannel()}
	msg := proto.StartMsg{
		ProcessID:   fmt.Sprintf("p-test%d", r.channel),
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
	d.send(proto.Start, r.channel, msg)
	d.send(proto.Pull, r.channel, proto.PullMsg{Until: 1 << 40, Reader: true})
	return r
}

// step reads frames until one of r's arrives, keeping and acknowledging output; it
// returns that frame.
func (r *run) step(d *daemon) proto.Frame {
	d.t.Helper()
	for {
		frame := d.next()
		if frame.Channel != r.channel {
			continue
		}
		switch frame.Kind {
		case proto.Output:
			if len(frame.Payload) < 9 {
				d.t.Fatalf("short output frame: %q", frame.Payload)
			}
			offset := binary.BigEndian.Uint64(frame.Payload[1:9])
			if offset != uint64(len(r.output)) {
				d.t.Fatalf("output at offset %d, %d bytes received before", offset, len(r.output))
			}
			r.output = append(r.output, frame.Payload[9:]...)
			d.send(proto.Pull, r.channel, proto.PullMsg{Ack: uint64(len(r.output)), Until: 1 << 40, Reader: true})
		case proto.Started:
			var msg proto.StartedMsg
			_ = json.Unmarshal(frame.Payload, &msg)
			r.pid = msg.PID
		case proto.FileTook:
			var msg proto.FileTookMsg
			_ = json.Unmarshal(frame.Payload, &msg)
			r.taken = msg.Bytes
		}
		return frame
	}
}

// waitFor reads r's output until it contains text.
func (r *run) waitFor(d *daemon, text string) {
	d.t.Helper()
	for !bytes.Contains(r.output, []byte(text)) {
		frame := r.step(d)
		if frame.Kind != proto.Started && frame.Kind != proto.Output && frame.Kind != proto.FileTook {
			d.t.Fatalf("frame %q %s before the output %q (output so far %q)", frame.Kind, frame.Payload, text, r.output)
		}
	}
}

// wait reads r's frames until it has exited or failed to start.
func (r *run) wait(d *daemon) *run {
	d.t.Helper()
	for r.exit == nil && r.failed == nil {
		frame := r.step(d)
		switch frame.Kind {
		case proto.Exited:
			r.exit = &proto.ExitedMsg{}
			if err := json.Unmarshal(frame.Payload, r.exit); err != nil {
				d.t.Fatal(err)
			}
		case proto.Failed:
			r.failed = &proto.FailedMsg{}
			_ = json.Unmarshal(frame.Payload, r.failed)
		case proto.Started, proto.Output, proto.FileTook:
		default:
			d.t.Fatalf("unexpected frame %q %s", frame.Kind, frame.Payload)
		}
	}
	d.send(proto.Discard, r.channel, nil)
	if r.failed != nil && !r.mayFail {
		d.t.Fatalf("the command failed to start: %+v", r.failed)
	}
	return r
}

// failing marks a run whose start is meant to fail.
func (r *run) failing() *run {
	r.mayFail = true
	return r
}

func TestExitStatuses(t *testing.T) {
	d, _ := connect(t)
	cases := []struct {
		command      string
		output       string
		code, signal int
		merge        bool // stderr into stdout: the order of two pipes is only as good as the reader's luck
	}{
		{command: "echo hi", output: "hi\n", code: 0},
		{command: "echo out; echo err >&2; exit 7", output: "out\nerr\n", code: 7, merge: true},
		{command: "kill -9 $$", code: 137, signal: 9},
		// A single simple command replaces its shell, as under a real bash -lc: the
		// signal is the command's own, and bash prints no "Terminated" of its own.
		{command: "sh -c 'kill -TERM $$'", code: 143, signal: 15, output: "", merge: true},
		{command: "-version 2>&1", code: 127, output: "bash: line 1: -version: command not found\n", merge: true}, // not an option of bash's
		{command: "-version\necho next", code: 0, output: "bash: line 1: -version: command not found\nnext\n", merge: true},
	}
	for _, c := range cases {
		merge := c.merge
		r := start(d, c.command, func(m *proto.StartMsg) { m.MergeStderr = merge }).wait(d)
		if r.failed != nil {
			t.Fatalf("%q failed to start: %+v", c.command, r.failed)
		}
		if r.exit.ExitCode != c.code || r.exit.Signal != c.signal {
			t.Errorf("%q: exit %d signal %d, want %d %d", c.command, r.exit.ExitCode, r.exit.Signal, c.code, c.signal)
		}
		if string(r.output) != c.output {
			t.Errorf("%q: output %q, want %q", c.command, r.output, c.output)
		}
		if r.exit.End != uint64(len(r.output)) {
			t.Errorf("%q: end %d after %d bytes", c.command, r.exit.End, len(r.output))
		}
	}
}

func TestTheKillLadderEndsTheCommandItself(t *testing.T) {
	// The command that ignores SIGTERM is the shell's pid (a single simple command
	// replaces its shell), so the ladder's SIGKILL ends it and its own 137 is reported, not
	// the 143 of a shell that stayed between.
	d, _ := connect(t)
	r := start(d, `sh -c 'trap "" TERM; exec sleep 100.7'`, nil)
	r.step(d) // started
	deadline := time.Now().Add(10 * time.Second)
	for {
		found := processesWith("100.7")
		if len(found) == 1 && found[0] == "sleep 100.7" {
			break // TERM is ignored by now: the trap ran before the exec
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes carrying the command's text: %q, want sleep's alone", found)
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.send(proto.Kill, r.channel, proto.KillMsg{GraceS: 0.3})
	r.wait(d)
	if r.exit.ExitCode != 137 || r.exit.Signal != 9 || len(r.output) != 0 {
		t.Errorf("exit %+v output %q, want 137 by SIGKILL and no output", r.exit, r.output)
	}
}

func TestTheCallersEnvironmentOutlivesTheLoginProfile(t *testing.T) {
	d, _ := connect(t)
	env := [][2]string{{"PATH", "/opt/bin"}, {"QUOTED", "it's \"$HOME\"\nsecond line"}, {"UID", "0"}, {"not-a-name", "x"}}
	r := start(d, `echo "$PATH"; /bin/echo "$QUOTED"; /usr/bin/env | /bin/grep -c '^not-a-name=x$'`, func(m *proto.StartMsg) { m.Env = env }).wait(d)
	want := "/opt/bin\nit's \"$HOME\"\nsecond line\n1\n"
	if string(r.output) != want || r.exit.ExitCode != 0 {
		t.Errorf("output %q exit %+v, want %q", r.output, r.exit, want)
	}
}

func TestACallersMarkerCannotHideTheTreeFromItsTimeout(t *testing.T) {
	d, _ := connect(t)
	r := start(d, `echo "$SANDBOXD_PROCESS_ID"; (setsid sleep 332.5 &); sleep 100.5`, func(m *proto.StartMsg) {
		m.Env = [][2]string{{"SANDBOXD_PROCESS_ID", "p-forged"}}
		m.TimeoutS = 1
	}).wait(d)
	if want := fmt.Sprintf("p-test%d\n", r.channel); string(r.output) != want {
		t.Errorf("the command saw marker %q, want %q", r.output, want)
	}
	if !r.exit.TimedOut || r.exit.Leftovers != 0 {
		t.Errorf("exit %+v, want a timeout with nothing left over", r.exit)
	}
	if left := processesWith("332.5"); len(left) != 0 {
		t.Errorf("left after the timeout: %q", left)
	}
}

func TestCommandsHaveNoPrivileges(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("privileges are dropped only by a root agent")
	}
	d, _ := connect(t)
	r := start(d, "grep -E '^(Uid|CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; cat /proc/self/oom_score_adj", nil).wait(d)
	fields := map[string]string{}
	lines := strings.Split(strings.TrimSpace(string(r.output)), "\n")
	for _, line := range lines[:len(lines)-1] {
		name, value, _ := strings.Cut(line, ":")
		fields[name] = strings.Join(strings.Fields(value), " ")
	}
	want := map[string]string{
		"Uid": "65534 65534 65534 65534", "CapEff": "0000000000000000", "CapPrm": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
	}
	for name, value := range want {
		if fields[name] != value {
			t.Errorf("%s: %q, want %q (output %q)", name, fields[name], value, r.output)
		}
	}
	if got := lines[len(lines)-1]; got != "1000" {
		t.Errorf("oom_score_adj %q, want 1000", got)
	}
}

func TestNoProcessButTheCommandCarriesItsText(t *testing.T) {
	d, _ := connect(t)
	r := start(d, "sleep 31.4159; echo done", nil)
	r.step(d) // started
	deadline := time.Now().Add(10 * time.Second)
	for {
		found := processesWith("31.4159")
		if len(found) == 1 && strings.HasPrefix(found[0], "sleep") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes carrying the command's text: %q, want only sleep's", found)
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.send(proto.Kill, r.channel, proto.KillMsg{GraceS: 0.5})
	r.wait(d)
}

// processesWith returns the command lines of the live processes whose argv or
// environment holds text.
func processesWith(text string) []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, entry := range entries {
		if _, err := strconv.Atoi(entry.Name()); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + entry.Name() + "/cmdline")
		environ, _ := os.ReadFile("/proc/" + entry.Name() + "/environ")
		if bytes.Contains(cmdline, []byte(text)) || bytes.Contains(environ, []byte(text)) {
			found = append(found, string(bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '})))
		}
	}
	return found
}

func TestInterruptReachesTheProcessGroup(t *testing.T) {
	d, _ := connect(t)
	r := start(d, "sleep 100.25 & sleep 101.25; echo unreachable", nil)
	r.step(d)
	// Ready when both sleeps run: SIGINT before that could reach the shell alone.
	deadline := time.Now().Add(10 * time.Second)
	for len(processesWith("sleep\x0010")) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the command's processes never all ran")
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.send(proto.Signal, r.channel, proto.SignalMsg{Signal: 2, Interrupt: true})
	r.wait(d)
	if r.exit.ExitCode != 130 || r.exit.Signal != 2 {
		t.Errorf("exit %+v, want 130 by SIGINT", r.exit)
	}
	if left := processesWith(".25\x00"); len(left) != 0 {
		t.Errorf("left after the interrupted command: %q", left)
	}
}

func TestTimeoutEndsTheWholeTree(t *testing.T) {
	d, _ := connect(t)
	r := start(d, "sleep 1000.5 & setsid sleep 1001.5 & sleep 1002.5", func(m *proto.StartMsg) { m.TimeoutS = 1 }).wait(d)
	if !r.exit.TimedOut || r.exit.Leftovers != 0 {
		t.Errorf("exit %+v, want a timeout with nothing left over", r.exit)
	}
	if left := processesWith(".5\x00"); len(left) != 0 {
		t.Errorf("left after the timeout: %q", left)
	}
}

func TestBackgroundServerDoesNotHoldTheCall(t *testing.T) {
	d, _ := connect(t)
	began := time.Now()
	r := start(d, "(sleep 5; echo late) & echo now", nil).wait(d)
	if r.failed != nil {
		t.Fatalf("failed: %+v", r.failed)
	}
	if elapsed := time.Since(began); elapsed > 3*time.Second {
		t.Errorf("the call took %v: the background writer held it", elapsed)
	}
	if r.exit.ExitCode != 0 || string(r.output) != "now\n" {
		t.Errorf("exit %+v output %q", r.exit, r.output)
	}
	d.send(proto.Discard, r.channel, nil)
}

func TestInputAndEndOfInput(t *testing.T) {
	d, _ := connect(t)
	r := start(d, "read first; echo \"1:$first\"; cat", nil)
	r.step(d)
	d.send(proto.Input, r.channel, []byte("hello\n"))
	r.waitFor(d, "1:hello\n")
	d.send(proto.Input, r.channel, []byte("bye"))
	d.send(proto.CloseInput, r.channel, nil)
	r.wait(d)
	if string(r.output) != "1:hello\nbye" || r.exit.ExitCode != 0 {
		t.Errorf("output %q exit %+v", r.output, r.exit)
	}
	if r.taken != 9 { // "hello\n" and "bye", as the session reported them taken
		t.Errorf("input taken %d, want 9", r.taken)
	}
}

func TestReconnectResumesAtTheAcknowledgedByte(t *testing.T) {
	d, _ := connect(t)
	r := start(d, "for i in $(seq 1 6); do echo $i; sleep 0.2; done", nil)
	r.waitFor(d, "2\n")
	acked := len(r.output)
	d.conn.Close()

	d2, welcome := connect(t)
	var state *proto.SessionState
	for i := range welcome.Sessions {
		if welcome.Sessions[i].Channel == r.channel {
			state = &welcome.Sessions[i]
		}
	}
	if state == nil {
		t.Fatalf("the welcome does not name channel %d: %+v", r.channel, welcome.Sessions)
	}
	// The old connection's last Pull may still be unread when the new one is welcomed: the
	// welcome's ack is at most what was acknowledged, and the resume below names the rest.
	if state.PID != r.pid || state.Ack > uint64(acked) {
		t.Errorf("state %+v, want pid %d ack at most %d", state, r.pid, acked)
	}
	rest := &run{channel: r.channel, output: r.output}
	d2.send(proto.Pull, r.channel, proto.PullMsg{Ack: uint64(acked), Until: 1 << 40, Reader: true})
	rest.wait(d2)
	if string(rest.output) != "1\n2\n3\n4\n5\n6\n" || rest.exit.ExitCode != 0 || rest.exit.Dropped != 0 {
		t.Errorf("output %q exit %+v", rest.output, rest.exit)
	}
}

func TestOutputWithoutAReaderKeepsTheHeadAndCountsTheRest(t *testing.T) {
	d, _ := connect(t)
	r := &run{channel: nextChannel()}
	d.send(proto.Start, r.channel, proto.StartMsg{
		ProcessID: fmt.Sprintf("p-test%d", r.channel), Command: "head -c 300000 /dev/zero", Cwd: "/",
		Env: [][2]string{{"PATH", "/usr/bin:/bin"}}, User: user(), TimeoutS: 60, GraceS: 0.5, BufferBytes: 65536,
	})
	d.send(proto.Pull, r.channel, proto.PullMsg{Reader: false}) // the starting call walked away
	frame := r.step(d)
	if frame.Kind != proto.Started {
		t.Fatalf("frame %q %s", frame.Kind, frame.Payload)
	}
	// Nobody pulls: no output is sent, the exit still is, with the gap counted.
	frame = r.step(d)
	for frame.Kind == proto.Dropped {
		frame = r.step(d)
	}
	if frame.Kind != proto.Exited {
		t.Fatalf("frame %q %s, want the exit", frame.Kind, frame.Payload)
	}
	var exit proto.ExitedMsg
	_ = json.Unmarshal(frame.Payload, &exit)
	// Offsets number the bytes kept: the head ends at 65536, the gap after it is counted.
	if exit.End != 65536 || exit.Dropped != 300000-65536 {
		t.Errorf("exit %+v, want end 65536 with %d dropped", exit, 300000-65536)
	}
	d.send(proto.Pull, r.channel, proto.PullMsg{Until: 1 << 40, Reader: true})
	for len(r.output) < 65536 {
		frame = r.step(d)
		if frame.Kind != proto.Dropped && frame.Kind != proto.Exited && frame.Kind != proto.Output {
			t.Fatalf("frame %q %s", frame.Kind, frame.Payload)
		}
	}
	if len(r.output) != 65536 || bytes.Count(r.output, []byte{0}) != 65536 {
		t.Errorf("kept %d bytes, want the 65536 of the head", len(r.output))
	}
	d.send(proto.Discard, r.channel, nil)
}

func TestStartFailuresAreReported(t *testing.T) {
	d, _ := connect(t)
	r := start(d, "true", func(m *proto.StartMsg) { m.Cwd = "/does/not/exist" }).failing().wait(d)
	if r.failed == nil || r.failed.Stage != "chdir" || !strings.Contains(r.failed.Message, "/does/not/exist") {
		t.Errorf("failed %+v exit %+v, want a chdir failure naming the directory", r.failed, r.exit)
	}
	r = start(d, "true", func(m *proto.StartMsg) { m.User = "no-such-user-here" }).failing().wait(d)
	if r.failed == nil || r.failed.Stage != "user" {
		t.Errorf("failed %+v exit %+v, want a user failure", r.failed, r.exit)
	}
}

// runFileOp runs one file operation and returns the helper's frames (kind and payload).
func runFileOp(d *daemon, operation map[string]any, input []byte) [][2]string {
	d.t.Helper()
	channel := nextChannel()
	d.send(proto.FileOp, channel, map[string]any{"user": user(), "operation": operation})
	if input != nil {
		d.send(proto.FileData, channel, input)
	}
	d.send(proto.FileEnd, channel, nil)
	var stream []byte
	for {
		frame := d.next()
		if frame.Channel != channel {
			continue
		}
		switch frame.Kind {
		case proto.FileOut:
			stream = append(stream, frame.Payload...)
			d.send(proto.FileAck, channel, proto.FileAckMsg{Ack: uint64(len(stream))})
		case proto.FileTook:
		case proto.Result:
			var replies [][2]string
			for len(stream) >= 5 {
				n := binary.BigEndian.Uint32(stream[1:5])
				replies = append(replies, [2]string{string(stream[0]), string(stream[5 : 5+n])})
				stream = stream[5+n:]
			}
			return replies
		default:
			d.t.Fatalf("file operation: frame %q %s", frame.Kind, frame.Payload)
		}
	}
}

// openDir is a temporary directory the workspace user (user()) may write in.
func openDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sandboxd-agent-files-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestFileWriteThenReadRoundTrips(t *testing.T) {
	dir := openDir(t)
	content := []byte("caf\xc3\xa9\r\nsecond\r\nno final newline \xff")
	d, _ := connect(t)
	path := filepath.Join(dir, "sub", "file.txt")
	replies := runFileOp(d, map[string]any{"op": "write", "path": path, "mkdirs": true}, content)
	if last := replies[len(replies)-1]; last[0] != "R" {
		t.Fatalf("write: %q", replies)
	}
	replies = runFileOp(d, map[string]any{"op": "read", "path": path, "max_bytes": 1 << 20}, nil)
	var data []byte
	for _, reply := range replies {
		if reply[0] == "D" {
			data = append(data, reply[1]...)
		}
	}
	if !bytes.Equal(data, content) || replies[len(replies)-1][0] != "R" {
		t.Errorf("read back %q (%q), want %q", data, replies, content)
	}
	if os.Getuid() == 0 {
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if owner := info.Sys().(*syscall.Stat_t).Uid; owner != 65534 {
			t.Errorf("the file belongs to uid %d, want the workspace user's 65534", owner)
		}
	}
	replies = runFileOp(d, map[string]any{"op": "read", "path": "/proc/1/environ", "max_bytes": 1 << 20}, nil)
	if os.Getuid() == 0 && replies[len(replies)-1][0] != "E" {
		t.Errorf("the helper read root's /proc/1/environ: %q", replies)
	}
}

func TestBadFramesFailTheirChannelOnly(t *testing.T) {
	d, _ := connect(t)
	r := start(d, "read line; echo got $line", nil)
	r.step(d)
	bad := []struct {
		kind    byte
		channel uint32
		payload []byte
	}{
		{'Z', r.channel, nil},                   // unknown kind
		{proto.Pull, r.channel, []byte("{not")}, // JSON that does not parse
		{proto.Input, 999999, []byte("x")},      // no such channel
		{proto.Start, 0, []byte("{}")},          // channel 0 is the connection's
		{proto.Start, r.channel, []byte("{}")},  // channel in use
	}
	for _, b := range bad {
		d.send(b.kind, b.channel, b.payload)
		for {
			frame := d.next()
			if frame.Kind == proto.Output && frame.Channel == r.channel {
				t.Fatalf("output before the command had input: %q", frame.Payload)
			}
			if frame.Kind == proto.ErrorMsg {
				var reply proto.ErrorReply
				if err := json.Unmarshal(frame.Payload, &reply); err != nil || reply.Code != "protocol" || frame.Channel != b.channel {
					t.Errorf("frame %q on %d: error %s on channel %d", b.kind, b.channel, frame.Payload, frame.Channel)
				}
				break
			}
		}
	}
	d.send(proto.Input, r.channel, []byte("fine\n"))
	r.wait(d)
	if string(r.output) != "got fine\n" {
		t.Errorf("the session after bad frames: output %q exit %+v", r.output, r.exit)
	}
}

func TestAnOversizedFrameEndsTheConnectionNotTheAgent(t *testing.T) {
	d, _ := connect(t)
	header := make([]byte, 9)
	binary.BigEndian.PutUint32(header, proto.MaxPayload+6)
	header[4] = proto.Input
	if _, err := d.conn.Write(header); err != nil {
		t.Fatal(err)
	}
	_ = d.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, err := d.reader.Read(); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the agent kept a connection that sent an oversized frame")
			}
			break
		}
	}
	d2, _ := connect(t)
	if r := start(d2, "echo alive", nil).wait(d2); string(r.output) != "alive\n" {
		t.Errorf("after the oversized frame: %q", r.output)
	}
}

// idleHelper waits for the agent's idle spawn helper (its child "sandboxd-agent spawn",
// started ahead of need) other than not, and returns its pid.
func idleHelper(t *testing.T, not int) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == not {
				continue
			}
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
			if string(cmdline) == "sandboxd-agent\x00spawn\x00" && len(fields) > 1 && fields[1] == strconv.Itoa(os.Getpid()) {
				return pid
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no idle spawn helper appeared")
	return 0
}

// testAgent is the agent the tests speak to.
var testAgent *Agent

// settleSpares waits until no spare and no file server is being made: a spare takes the
// idle helper too.
func settleSpares(t *testing.T) {
	t.Helper()
	settled := func() bool {
		testAgent.mu.Lock()
		starting := len(testAgent.serverStarting)
		testAgent.mu.Unlock()
		return starting == 0 && testAgent.Spares().Settled()
	}
	for deadline := time.Now().Add(10 * time.Second); !settled(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a spare or a file server is still being made after 10 s")
		}
	}
}

// whoReads reads /proc/self/cmdline and /proc/self/stat with a file operation: the argv and
// pid of the process that performs it.
func whoReads(d *daemon) (string, int) {
	d.t.Helper()
	read := func(path string) []byte {
		var data []byte
		replies := runFileOp(d, map[string]any{"op": "read", "path": path, "max_bytes": 1 << 20}, nil)
		for _, reply := range replies {
			if reply[0] == "D" {
				data = append(data, reply[1]...)
			}
		}
		if len(replies) == 0 || replies[len(replies)-1][0] != "R" {
			d.t.Fatalf("read %s: %q", path, replies)
		}
		return data
	}
	cmdline := read("/proc/self/cmdline")
	pid, _ := strconv.Atoi(strings.Fields(string(read("/proc/self/stat")))[0])
	return strings.ReplaceAll(strings.TrimSuffix(string(cmdline), "\x00"), "\x00", " "), pid
}

func TestFileOperationsRunInTheUsersFileServerAndWithoutIt(t *testing.T) {
	d, _ := connect(t)
	runFileOp(d, map[string]any{"op": "stat", "path": "/"}, nil) // the user's first: a server starts
	settleSpares(t)
	who, server := whoReads(d)
	if who != "sandboxd-agent spawn fileserver" {
		t.Fatalf("a read ran in %q, want the user's file server", who)
	}
	if _, again := whoReads(d); again != server {
		t.Fatalf("the next read ran in pid %d, not the server's %d", again, server)
	}
	// Killed by a process of its user: the next operation takes a helper, and a new server starts.
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitState(t, server, "Z")
	if who, pid := whoReads(d); who != "sandboxd-agent spawn fileserver" && who != "sandboxd-agent spawn" || pid == server {
		t.Fatalf("after the server was killed: %q pid %d", who, pid)
	}
	settleSpares(t)
	who, second := whoReads(d)
	if who != "sandboxd-agent spawn fileserver" || second == server {
		t.Fatalf("no new server after the first died: %q pid %d", who, second)
	}
	// Stopped: it would hold every operation; it is killed and the operation goes elsewhere.
	if err := syscall.Kill(second, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, second, "T")
	if _, pid := whoReads(d); pid == second {
		t.Fatalf("a read ran in the stopped server %d", second)
	}
	waitState(t, second, "Z") // killed: it goes
}

// The user's file server keeps its buffers from one operation to the next: nothing of one
// (data it never read, output bigger than the next's) may reach the next.
func TestAFileServerCarriesNothingFromOneOperationToTheNext(t *testing.T) {
	dir := openDir(t)
	d, _ := connect(t)
	runFileOp(d, map[string]any{"op": "stat", "path": "/"}, nil)
	settleSpares(t)
	_, server := whoReads(d)
	big := bytes.Repeat([]byte("0123456789abcdef"), 40000) // 640 KiB: more than a buffer
	path := filepath.Join(dir, "f")
	write := func(data []byte) string {
		replies := runFileOp(d, map[string]any{"op": "write", "path": path}, data)
		return replies[len(replies)-1][0]
	}
	read := func() []byte {
		var data []byte
		for _, reply := range runFileOp(d, map[string]any{"op": "read", "path": path, "max_bytes": 1 << 20}, nil) {
			if reply[0] == "D" {
				data = append(data, reply[1]...)
			}
		}
		return data
	}
	// Refused before its data is read (the directory is missing and not to be made).
	replies := runFileOp(d, map[string]any{"op": "write", "path": filepath.Join(dir, "missing", "f")}, big)
	if replies[len(replies)-1][0] != "E" {
		t.Fatalf("a write into a missing directory: %q", replies)
	}
	if got := write([]byte("small")); got != "R" || string(read()) != "small" {
		t.Fatalf("after a refused write: %s, read back %q", got, read())
	}
	if got := write(big); got != "R" || !bytes.Equal(read(), big) {
		t.Fatalf("a big write: %s, read back %d bytes", got, len(read()))
	}
	if got := write([]byte("tiny")); got != "R" || string(read()) != "tiny" {
		t.Fatalf("a small write after a big one: %s, read back %q", got, read())
	}
	if _, pid := whoReads(d); pid != server {
		t.Fatalf("the operations left the server %d for pid %d", server, pid)
	}
}

// waitState waits until process pid is in state ("Z" also when it is gone: reaped).
func waitState(t *testing.T, pid int, state string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		stat, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if bytes.Contains(stat, []byte(") "+state+" ")) || (state == "Z" && len(stat) == 0) {
			return
		}
	}
	t.Fatalf("process %d is not in state %s after 10 s", pid, state)
}

func TestCommandsStartInTheIdleHelperAndWithoutOne(t *testing.T) {
	d, _ := connect(t)
	settleSpares(t)
	helper := idleHelper(t, 0)
	// Two lines: bash's native mode, which starts in a helper (no spare stands in for it).
	r := start(d, "echo $$\n:", nil).wait(d)
	if r.exit == nil || string(r.output) != strconv.Itoa(helper)+"\n" {
		t.Fatalf("output %q exit %+v failed %+v, want the idle helper's pid %d", r.output, r.exit, r.failed, helper)
	}
	// An idle helper killed (the pool's next) does not fail the next command: another starts.
	dead := idleHelper(t, helper)
	if err := syscall.Kill(dead, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for {
		var stat syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", strconv.Itoa(dead), "cmdline"), &stat) != nil {
			break // reaped
		}
		if state, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(dead), "stat")); bytes.Contains(state, []byte(") Z ")) {
			break // dead, not yet reaped
		}
		time.Sleep(5 * time.Millisecond)
	}
	r = start(d, "echo $$\n:", nil).wait(d)
	if r.exit == nil || r.exit.ExitCode != 0 || string(r.output) == strconv.Itoa(dead)+"\n" || len(r.output) < 2 {
		t.Fatalf("after the idle helper died: output %q exit %+v failed %+v", r.output, r.exit, r.failed)
	}
	replies := runFileOp(d, map[string]any{"op": "stat", "path": "/"}, nil)
	if len(replies) == 0 || replies[len(replies)-1][0] != "R" {
		t.Fatalf("a file operation after it: %v", replies)
	}
}

func TestAPullBeyondTheWindowKeepsTheSessionBounded(t *testing.T) {
	d, _ := connect(t)
	channel := nextChannel()
	msg := proto.StartMsg{ProcessID: "p-flood", Command: "head -c 200000000 /dev/zero", Cwd: "/", User: user(), TimeoutS: 60, GraceS: 0.5, BufferBytes: 1 << 20}
	d.send(proto.Start, channel, msg)
	// A reader that says "send everything" and never acknowledges a byte.
	d.send(proto.Pull, channel, proto.PullMsg{Until: 1 << 40, Reader: true})
	var got uint64
	limit := uint64(output.MaxWindow + 1<<20)
	for got <= limit {
		_ = d.conn.SetReadDeadline(time.Now().Add(time.Second))
		frame, err := d.reader.Read()
		if err != nil {
			break // the flow stopped: what the agent holds is bounded
		}
		if frame.Channel == channel && frame.Kind == proto.Output {
			got += uint64(len(frame.Payload) - 9)
		}
		if frame.Channel == channel && frame.Kind == proto.Exited {
			t.Fatalf("the command finished with nothing acknowledged: %s", frame.Payload)
		}
	}
	if got > limit || got < 1<<20 {
		t.Fatalf("%d bytes sent without an acknowledgement; want between the buffer and %d", got, limit)
	}
	d.send(proto.Discard, channel, nil)
}

func TestAHelperStoppedBeforeItStartsTheCommandIsKilledInTime(t *testing.T) {
	// Once a helper has become the workspace user, a process of that user may SIGSTOP it
	// before it executes the command: the start must fail in bounded time, not hang.
	defer spawn.SetHelperTimeout(spawn.SetHelperTimeout(500 * time.Millisecond))
	d, _ := connect(t)
	settleSpares(t)
	helper := idleHelper(t, 0)
	if err := syscall.Kill(helper, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	// Two lines: bash's native mode, which no spare stands in for (it would not need the helper).
	r := start(d, "echo ran\necho again", nil).failing().wait(d)
	if r.failed == nil || r.failed.Stage != "stalled" || len(r.output) != 0 {
		t.Fatalf("failed %+v exit %+v output %q, want a stalled start", r.failed, r.exit, r.output)
	}
	if waited := time.Since(began); waited > 10*time.Second {
		t.Fatalf("the stalled start took %s", waited)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if syscall.Kill(helper, 0) != nil {
			break // killed and reaped
		}
		if state, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(helper), "stat")); bytes.Contains(state, []byte(") Z ")) {
			break
		}
	}
	if state, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(helper), "stat")); bytes.Contains(state, []byte(") T ")) {
		t.Fatalf("the stopped helper is still there: %s", state)
	}
	r = start(d, "echo ran", nil).wait(d)
	if r.exit == nil || string(r.output) != "ran\n" {
		t.Fatalf("the next command: output %q exit %+v failed %+v", r.output, r.exit, r.failed)
	}
}

func TestANewSessionHoldsItsOutputForTheCallThatStartedIt(t *testing.T) {
	d, _ := connect(t)
	channel := nextChannel()
	d.send(proto.Start, channel, proto.StartMsg{
		ProcessID: "p-unpulled", Command: "head -c 300000 /dev/zero; echo done", Cwd: "/",
		Env: [][2]string{{"PATH", "/usr/bin:/bin"}}, User: user(), TimeoutS: 60, GraceS: 0.5, BufferBytes: 65536,
	})
	// No Pull yet (a slow daemon): the command waits on the full buffer, nothing is dropped.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		_ = d.conn.SetReadDeadline(deadline)
		frame, err := d.reader.Read()
		if err != nil {
			break
		}
		if frame.Channel == channel && (frame.Kind == proto.Dropped || frame.Kind == proto.Exited) {
			t.Fatalf("frame %q %s before any Pull", frame.Kind, frame.Payload)
		}
	}
	r := &run{channel: channel}
	d.send(proto.Pull, channel, proto.PullMsg{Until: 1 << 40, Reader: true})
	r.wait(d)
	if r.exit == nil || r.exit.Dropped != 0 || len(r.output) != 300005 {
		t.Fatalf("exit %+v after %d bytes, want all 300005 and nothing dropped", r.exit, len(r.output))
	}
}

func TestATailPullTellsTheEndOfWhatIsHeld(t *testing.T) {
	d, welcome := connect(t)
	if !strings.Contains(" "+strings.Join(welcome.Features, " ")+" ", " "+proto.FeatureTail+" ") {
		t.Fatalf("welcome features %v, want %q", welcome.Features, proto.FeatureTail)
	}
	channel := nextChannel()
	const window = 4 << 20
	msg := proto.StartMsg{ProcessID: "p-tail", Command: "head -c 100000000 /dev/zero", Cwd: "/", User: user(), TimeoutS: 60, GraceS: 0.5, BufferBytes: 65536}
	d.send(proto.Start, channel, msg)
	// A reader's window well beyond the buffer, never acknowledged: the agent holds all of it.
	d.send(proto.Pull, channel, proto.PullMsg{Until: window, Reader: true})
	var got uint64
	for got < window {
		frame := d.next()
		if frame.Channel == channel && frame.Kind == proto.Output {
			got += uint64(len(frame.Payload) - 9)
		}
	}
	// The reader leaves: what is held is far beyond the buffer, so nothing more is kept.
	d.send(proto.Pull, channel, proto.PullMsg{Until: window, Reader: false, Tail: true})
	var tail proto.TailMsg
	var gap proto.DroppedMsg
	for tail.End == 0 || gap.Bytes == 0 {
		frame := d.next()
		switch {
		case frame.Channel != channel:
		case frame.Kind == proto.Tail:
			_ = json.Unmarshal(frame.Payload, &tail)
		case frame.Kind == proto.Dropped:
			_ = json.Unmarshal(frame.Payload, &gap)
		case frame.Kind != proto.Output:
			t.Fatalf("frame %q %s", frame.Kind, frame.Payload)
		}
	}
	if tail.End != window || gap.Offset != window {
		t.Fatalf("tail %+v and gap %+v, want both at %d", tail, gap, window)
	}
	d.send(proto.Discard, channel, nil)
}

// frozen sends Freeze and reads up to its answer (other channels' frames are dropped).
func (d *daemon) freeze(frozen bool) {
	d.t.Helper()
	d.send(proto.Freeze, 0, proto.FreezeMsg{Frozen: frozen})
	for {
		frame := d.next()
		if frame.Channel != 0 {
			continue
		}
		var msg proto.FreezeMsg
		if frame.Kind != proto.Frozen || json.Unmarshal(frame.Payload, &msg) != nil || msg.Frozen != frozen {
			d.t.Fatalf("answer to freeze(%v): %q %s", frozen, frame.Kind, frame.Payload)
		}
		return
	}
}

func TestAFrozenAgentsTimeoutsStandStill(t *testing.T) {
	d, _ := connect(t)
	r := start(d, "echo ready; sleep 100", func(m *proto.StartMsg) { m.TimeoutS = 1 })
	r.waitFor(d, "ready")
	d.freeze(true)
	began := time.Now()
	// Past its whole timeout, frozen: nothing of r's comes (the read times out).
	_ = d.conn.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
	for {
		frame, err := d.reader.Read()
		if err != nil {
			break
		}
		if frame.Channel == r.channel && frame.Kind == proto.Exited {
			t.Fatalf("exited while frozen: %s", frame.Payload)
		}
	}
	// The reader is broken by the deadline: a new connection, whose welcome says frozen.
	d, welcome := connect(t)
	if !welcome.Frozen {
		t.Fatal("the welcome of a frozen agent does not say so")
	}
	d.send(proto.Pull, r.channel, proto.PullMsg{Ack: uint64(len(r.output)), Until: 1 << 40, Reader: true})
	d.freeze(false)
	r.wait(d)
	if !r.exit.TimedOut {
		t.Fatalf("exit %+v, want the timeout once thawed", r.exit)
	}
	// 1.5 s frozen, then most of its second: a clock that counted the freeze fires at the thaw.
	if elapsed := time.Since(began); elapsed < 2*time.Second {
		t.Fatalf("timed out %s after the freeze: frozen time was counted", elapsed)
	}
}
