//go:build linux

package session

import (
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sandboxd/agent/internal/proto"
	"sandboxd/agent/internal/pty"
	"sandboxd/agent/internal/shell"
	"sandboxd/agent/internal/spawn"
	"sandboxd/agent/internal/users"
)

// kind is how a command's shell starts.
type kind int

const (
	// bashAlias: bash in alias mode (shell.Alias); a spare can stand in for it.
	bashAlias kind = iota
	// bashNative: `bash -lc COMMAND` itself (shell.Native).
	bashNative
	// plainSh: an image without bash: `sh -c` reads the command from fd 4.
	plainSh
)

// kindOf is the start a command takes: bash when the image has it (in the mode its text
// allows), sh otherwise.
func kindOf(command string) (kind, bool) {
	if spawn.LookPath("bash") == "" {
		return plainSh, false
	}
	mode, suffix := shell.Choose(command)
	if mode == shell.Alias {
		return bashAlias, suffix
	}
	return bashNative, false
}

// launched is a command's shell once its helper is ready: the agent's ends of its stdio and
// its gate. The shell writes one byte once its profile is done (ready: true, or false if it
// ended first); release then lets it run the command (the request in alias mode, a line
// otherwise). Until Go, the helper has not executed the shell.
type launched struct {
	pid    int
	proc   *spawn.Process
	status <-chan syscall.WaitStatus
	stdin  *os.File   // the pipe's write end, or the terminal's master
	master *os.File   // the terminal's master (tty), else nil
	outs   []*os.File // stdout, then stderr (one of them when merged, or the master)

	ready  chan bool
	readyR *os.File
	gateW  *os.File // fd 4 (alias mode) or fd 7's write end
	gateFn func(w *os.File)
}

// release hands the shell what it waits for after its ready byte, and closes the gate.
func (l *launched) release() {
	if l.gateW != nil {
		l.gateFn(l.gateW) // EPIPE if a Ctrl-C ended the shell: nothing to hand
		l.gateW.Close()
		l.gateW = nil
	}
}

// closeAll closes every end the agent holds (a start that goes no further).
func (l *launched) closeAll() {
	for _, f := range append([]*os.File{l.stdin, l.readyR, l.gateW}, l.outs...) {
		if f != nil {
			f.Close()
		}
	}
}

// watchReady reads the ready byte (or the pipe's end) once, off the caller's path.
func (l *launched) watchReady() {
	l.ready = make(chan bool, 1)
	go func() {
		var b [1]byte
		n, _ := l.readyR.Read(b[:])
		l.ready <- n == 1
	}()
}

// shellSpec is what a shell's start depends on: the command aside, the same for a spare and
// for the command that takes it.
type shellSpec struct {
	env          [][2]string
	cwd          string
	user         users.User
	tty          bool
	columns      int
	rows         int
	mergeStderr  bool
	capabilities []string
}

func specOf(msg proto.StartMsg, u users.User) shellSpec {
	return shellSpec{env: msg.Env, cwd: msg.Cwd, user: u, tty: msg.TTY, columns: msg.Columns, rows: msg.Rows, mergeStderr: msg.MergeStderr, capabilities: commandCapabilities(msg, u)}
}

// commandCapabilities are what a command keeps: the workspace's added capabilities, and its
// root capabilities when it runs as uid 0 (whatever name the image gives uid 0), sorted and
// once each so that a spare's spec compares equal.
func commandCapabilities(msg proto.StartMsg, u users.User) []string {
	names := append([]string(nil), msg.Capabilities...)
	if u.UID == 0 {
		names = append(names, msg.RootCapabilities...)
	}
	sort.Strings(names)
	kept := names[:0]
	for i, name := range names {
		if i == 0 || name != names[i-1] {
			kept = append(kept, name)
		}
	}
	return kept
}

// launch starts the helper of a shell of kind k, with marker in its environment. The
// command (native and sh kinds) is part of the start; in alias mode it comes with release,
// set by the caller (setRequest).
func launch(host Host, spec shellSpec, k kind, command string, marker []byte) (*launched, *spawn.Failure, error) {
	stdio, l, err := openStdio(spec)
	if err != nil {
		return nil, nil, err
	}
	closeShellSide := func(files []*os.File) {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}
	req, extra, err := shellRequest(spec, k, command, marker, l)
	if err != nil {
		closeShellSide(stdio[:])
		l.closeAll()
		return nil, nil, err
	}
	proc, failure, err := host.Spawn(req, stdio, extra, spec.tty)
	closeShellSide(stdio[:])
	closeShellSide(extra)
	if err == nil && failure != nil && failure.Stage == "fork" && strings.Contains(failure.Message, "resource temporarily unavailable") {
		failure.Message += " (the workspace's process limit is reached)"
	}
	if err != nil || failure != nil {
		l.closeAll()
		return nil, failure, err
	}
	l.pid, l.proc = proc.PID, proc
	l.status = host.Expect(proc.PID)
	l.watchReady()
	return l, nil, nil
}

// shellRequest is the helper's request and the files it hands the shell beyond stdio (fds
// 4-7), with the agent's ends kept in l.
func shellRequest(spec shellSpec, k kind, command string, marker []byte, l *launched) (spawn.Request, []*os.File, error) {
	env := commandEnv(spec.env, spec.user, marker)
	req := spawn.Request{
		Env:          env,
		Dir:          spec.cwd,
		UID:          spec.user.UID,
		GID:          spec.user.GID,
		Groups:       spec.user.Groups,
		Capabilities: capabilityNumbers(spec.capabilities),
		OOMScoreAdj:  OOMScoreAdj,
	}
	var texts []string // fds 4 and 5, written by the agent, read by the shell (sh kind)
	var hook *os.File
	switch k {
	case plainSh:
		req.Fallback, req.FallbackArgs = "/bin/sh", []string{"-c", shScript}
		texts = []string{command, shell.Exports(spec.env, MarkerName)}
	default:
		var err error
		if hook, err = bashRequest(&req, spec, k, command); err != nil {
			return req, nil, err
		}
	}
	extra := make([]*os.File, 4) // fds 4, 5, 6, 7
	if err := shellFiles(spec, k, texts, hook, extra, l); err != nil {
		for _, f := range extra {
			if f != nil {
				f.Close()
			}
		}
		return req, nil, err
	}
	return req, extra, nil
}

// bashRequest makes req start bash in the mode of k, and returns its hook file.
func bashRequest(req *spawn.Request, spec shellSpec, k kind, command string) (*os.File, error) {
	mode, arg := shell.Alias, shell.AliasArg
	if k == bashNative {
		mode, arg = shell.Native, command
	}
	req.Shell, req.Args = "bash", shellArgs(arg)
	// BASH_ENV names the hook; the hook gives the caller's (or the image's) back.
	var bashEnv *string
	kept := req.Env[:0]
	for _, entry := range req.Env {
		if strings.HasPrefix(entry, "BASH_ENV=") {
			value := entry[len("BASH_ENV="):]
			bashEnv = &value
			continue
		}
		kept = append(kept, entry)
	}
	req.Env = append(kept, shell.HookEnv)
	return shell.HookFile(shell.Hook(mode, os.Getpid(), shell.Exports(spec.env, MarkerName), bashEnv))
}

// shellFiles fills extra (fds 4-7) with the shell's ends of its ready pipe, its gate, its
// hook and (sh kind) the pipes of texts, and keeps the agent's ends in l. On an error the
// caller closes what extra holds.
func shellFiles(spec shellSpec, k kind, texts []string, hook *os.File, extra []*os.File, l *launched) error {
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	l.readyR, extra[shell.ReadyFD-4] = readyR, readyW
	gateR, gateW, err := os.Pipe()
	if err != nil {
		return err
	}
	l.gateW = gateW
	switch k {
	case bashAlias:
		extra[shell.RequestFD-4], extra[shell.HookFD-4] = gateR, hook
		l.gateFn = func(w *os.File) {} // setRequest replaces it
	case bashNative:
		extra[shell.GoFD-4], extra[shell.HookFD-4] = gateR, hook
		l.gateFn = writeLine
	case plainSh:
		extra[shell.GoFD-4] = gateR
		l.gateFn = writeLine
		for i, text := range texts {
			r, w, err := os.Pipe()
			if err != nil {
				return err
			}
			_ = r.Chown(int(spec.user.UID), int(spec.user.GID))
			extra[i] = r
			go func(text string) {
				// Read by the shell once it runs (a start that fails closes the pipe: EPIPE, ignored).
				_, _ = w.Write([]byte(text))
				w.Close()
			}(text)
		}
	}
	return nil
}

// shellArgs is bash's argv after its name: -lc and the -c string, with "--" before one that
// starts with "-" (which bash would take for options, as a real `bash -lc` does).
func shellArgs(arg string) []string {
	if strings.HasPrefix(arg, "-") {
		return []string{"-lc", "--", arg}
	}
	return []string{"-lc", arg}
}

// shellCmdline is /proc/<pid>/cmdline of a shell started with arg.
func shellCmdline(arg string) []byte {
	return []byte("bash\x00" + strings.Join(shellArgs(arg), "\x00") + "\x00")
}

// setRequest makes release hand a shell in alias mode its command.
func (l *launched) setRequest(processID, command string, suffix bool) {
	request := shell.Request(processID, command, suffix)
	l.gateFn = func(w *os.File) {
		// A command longer than the pipe holds is taken as the shell reads it.
		_, _ = w.Write(request)
	}
}

func writeLine(w *os.File) { _, _ = w.Write([]byte{'\n'}) }

// An image without bash: sh reads the command from fd 4 with builtins only (a caller's
// PATH cannot take the reading away), after the exports of fd 5, and then shakes hands
// with the agent (fd 6, fd 7) as the bash hook does. The command waits in $1 meanwhile;
// `set --` inside the eval empties it again. The space keeps a command that starts with
// "-" from being read as an option of eval.
const (
	shRead   = `while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done`
	shScript = `eval "$(` + shRead + ` <&5)"; set -- "$(` + shRead + ` <&4)"; printf . >&6; read -r _ <&7; eval " set --; $1" 4<&- 5<&- 6>&- 7<&-`
)

// openStdio returns the shell's stdin, stdout and stderr, and a launched holding the
// agent's ends: the pipes' other ends, or the terminal's master (once, it is both).
func openStdio(spec shellSpec) ([3]*os.File, *launched, error) {
	l := &launched{}
	if spec.tty {
		master, slave, err := pty.Open(spec.columns, spec.rows, spec.user.UID, spec.user.GID)
		if err != nil {
			return [3]*os.File{}, nil, err
		}
		l.master, l.stdin, l.outs = master, master, []*os.File{master}
		return [3]*os.File{slave, slave, slave}, l, nil
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return [3]*os.File{}, nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return [3]*os.File{}, nil, err
	}
	l.stdin = inW
	if spec.mergeStderr {
		l.outs = []*os.File{outR}
		return [3]*os.File{inR, outW, outW}, l, nil
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		for _, f := range []*os.File{inR, inW, outR, outW} {
			f.Close()
		}
		return [3]*os.File{}, nil, err
	}
	l.outs = []*os.File{outR, errR}
	return [3]*os.File{inR, outW, errW}, l, nil
}

// commandEnv is the image's environment (the agent's own, less what is the agent's),
// HOME of the user, then the daemon's list (defaults, workspace, call; PATH aside), then
// the marker.
func commandEnv(daemonEnv [][2]string, u users.User, marker []byte) []string {
	values := map[string]string{}
	var order []string
	set := func(name, value string) {
		if _, seen := values[name]; !seen {
			order = append(order, name)
		}
		values[name] = value
	}
	for _, entry := range os.Environ() {
		name, value, ok := strings.Cut(entry, "=")
		if !ok || strings.HasPrefix(name, "SANDBOXD_") {
			continue
		}
		set(name, value)
	}
	if _, ok := values["PATH"]; !ok {
		set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	set("HOME", u.Home)
	for _, pair := range daemonEnv {
		if pair[0] == "PATH" {
			// The login profile runs with the image's PATH (a caller's may lack `id`, which
			// Debian's profile calls); the shell then exports the caller's (shell.Exports).
			continue
		}
		set(pair[0], pair[1])
	}
	name, value, _ := strings.Cut(string(marker), "=")
	set(name, value)
	env := make([]string, 0, len(order))
	for _, name := range order {
		env = append(env, name+"="+values[name])
	}
	return env
}

// home is the HOME a shell of spec sees (the user's, unless the caller set one).
func (spec shellSpec) home() string {
	home := spec.user.Home
	for _, pair := range spec.env {
		if pair[0] == "HOME" {
			home = pair[1]
		}
	}
	return home
}

// key is what a spare must share with the command that takes it.
func (spec shellSpec) key() string {
	var b strings.Builder
	u := spec.user
	b.WriteString(strconv.FormatUint(uint64(u.UID), 10) + ":" + strconv.FormatUint(uint64(u.GID), 10) + ":")
	for _, g := range u.Groups {
		b.WriteString(strconv.FormatUint(uint64(g), 10) + ",")
	}
	b.WriteString("\x00" + u.Home + "\x00" + spec.cwd + "\x00" + strconv.FormatBool(spec.mergeStderr) + "\x00" + strings.Join(spec.capabilities, ",") + "\x00")
	for _, pair := range spec.env {
		b.WriteString(pair[0] + "=" + pair[1] + "\x00")
	}
	return b.String()
}

// readyDeadline stops a wait for the ready byte (a profile's child may hold the pipe open).
func (l *launched) readyDeadline() { _ = l.readyR.SetReadDeadline(time.Now()) }
