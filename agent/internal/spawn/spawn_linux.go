//go:build linux

package spawn

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"
)

const (
	prCapbsetDrop           = 24
	prSetKeepcaps           = 8
	prSetNoNewPrivs         = 38
	prCapAmbient            = 47
	prCapAmbientRaise       = 2
	linuxCapabilityVersion3 = 0x20080522
)

// Child is the spawn helper: it reads a Request on fd 3, becomes the workspace user with
// no privileges, reports Ready, waits for Go, and executes the command -- or, for a
// Request naming one of handlers, runs it in this very process and exits with its status:
// no execve follows the change of user, so the process is never dumpable (a same-user
// process cannot open its pipes through /proc, not even in a start-up window). It never
// returns.
func Child(handlers map[string]func() int) {
	// Capabilities, the bounding set and no_new_privs belong to a thread: all of it must
	// happen on the thread that finally calls execve.
	runtime.LockOSThread()
	ctl := os.NewFile(3, "control")
	in := bufio.NewReader(ctl)
	line, err := in.ReadBytes('\n')
	if err != nil {
		fail(ctl, "request", err)
	}
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		fail(ctl, "request", err)
	}
	handler := handlers[req.Run]
	if req.Run != "" && handler == nil {
		failf(ctl, "request", "no in-process handler %q", req.Run)
	}
	if handler == nil {
		if err := defaultSignals(); err != nil {
			fail(ctl, "signals", err)
		}
	}
	if req.OOMScoreAdj != 0 {
		// Under memory pressure the kernel should pick the command, never the agent.
		_ = os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(req.OOMScoreAdj)), 0)
	}
	if err := dropPrivileges(&req); err != nil {
		fail(ctl, "privileges", err)
	}
	if err := syscall.Chdir(req.Dir); err != nil {
		failf(ctl, "chdir", "working directory %s: %s", req.Dir, errText(err))
	}
	path, argv := req.command()
	if _, err := ctl.Write([]byte{Ready}); err != nil {
		os.Exit(127)
	}
	var answer [1]byte
	if _, err := io.ReadFull(in, answer[:]); err != nil || answer[0] != Go {
		os.Exit(127) // the agent went away before it could report the command: do not run it
	}
	if handler != nil {
		ctl.Close() // as close-on-exec would: the agent sees that it runs
		os.Exit(handler())
	}
	// fd 3 is close-on-exec: the agent sees it close when the command runs.
	syscall.CloseOnExec(3)
	err = syscall.Exec(path, argv, req.Env)
	failf(ctl, "exec", "%s: %s", path, errText(err))
}

// command is the shell to run and its argv: Shell when it is found in systemPath, else Fallback.
func (req *Request) command() (string, []string) {
	if req.Shell != "" {
		if found := lookPath(req.Shell); found != "" {
			return found, append([]string{req.Shell}, req.Args...)
		}
	}
	return req.Fallback, append([]string{filepath.Base(req.Fallback)}, req.FallbackArgs...)
}

// systemPath is where the shell is looked for: the caller's PATH is the command's
// business and must not decide which shell runs it (or whether one is found).
const systemPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func lookPath(name string) string {
	for _, dir := range filepath.SplitList(systemPath) {
		candidate := filepath.Join(dir, name)
		if info, err := os.Stat(candidate); err == nil && info.Mode().IsRegular() && syscall.Access(candidate, 1) == nil {
			return candidate
		}
	}
	return ""
}

type sigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

// defaultSignals gives every signal its default disposition and unblocks them all: the
// command must start as a fresh program would, with SIGINT able to reach it.
func defaultSignals() error {
	var act sigaction // SIG_DFL, no flags, empty mask
	for sig := 1; sig <= 64; sig++ {
		if sig == int(syscall.SIGKILL) || sig == int(syscall.SIGSTOP) || (sig >= 32 && sig <= 34) {
			continue // 32-34: the C library's own realtime signals; not ours to touch
		}
		_, _, errno := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0)
		if errno != 0 && errno != syscall.EINVAL {
			return fmt.Errorf("signal %d: %w", sig, errno)
		}
	}
	var empty uint64
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, 2 /* SIG_SETMASK */, uintptr(unsafe.Pointer(&empty)), 0, 8, 0, 0); errno != 0 {
		return fmt.Errorf("signal mask: %w", errno)
	}
	return nil
}

type capHeader struct {
	version uint32
	pid     int32
}

type capData struct {
	effective   uint32
	permitted   uint32
	inheritable uint32
}

func capsetAll(keep uint64) error {
	hdr := capHeader{version: linuxCapabilityVersion3}
	data := [2]capData{
		{effective: uint32(keep), permitted: uint32(keep), inheritable: uint32(keep)},
		{effective: uint32(keep >> 32), permitted: uint32(keep >> 32), inheritable: uint32(keep >> 32)},
	}
	if errno := allThreads(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return errno
	}
	return nil
}

func prctl(option, arg2, arg3 uintptr) syscall.Errno {
	_, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, option, arg2, arg3, 0, 0, 0)
	return errno
}

// allThreads runs a system call on every thread of the process (a helper that runs in
// process must be unprivileged on all of them), or on this one where Go cannot do that
// (a race-detector build of the tests: it is this thread that executes the command).
func allThreads(trap, a1, a2, a3 uintptr) syscall.Errno {
	_, _, errno := syscall.AllThreadsSyscall(trap, a1, a2, a3)
	if errno == syscall.ENOTSUP {
		_, _, errno = syscall.RawSyscall(trap, a1, a2, a3)
	}
	return errno
}

// dropPrivileges leaves the process as the request's user with only the kept capabilities
// (none by default) in every set, the bounding set included, and no_new_privs on.
func dropPrivileges(req *Request) error {
	if os.Geteuid() != 0 {
		// An agent that is not root (its tests on a host) has nothing to drop but can be nobody else.
		if req.UID != uint32(os.Getuid()) {
			return fmt.Errorf("the agent runs as uid %d and cannot start commands as uid %d", os.Getuid(), req.UID)
		}
		if errno := allThreads(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0); errno != 0 {
			return fmt.Errorf("no_new_privs: %w", errno)
		}
		return nil
	}
	var keep uint64
	for _, c := range req.Capabilities {
		if c >= 0 && c < 64 {
			keep |= 1 << uint(c)
		}
	}
	for c := 0; c < 64; c++ {
		if keep&(1<<uint(c)) != 0 {
			continue
		}
		if errno := allThreads(syscall.SYS_PRCTL, prCapbsetDrop, uintptr(c), 0); errno != 0 && errno != syscall.EINVAL {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, errno)
		}
	}
	if keep != 0 {
		if errno := allThreads(syscall.SYS_PRCTL, prSetKeepcaps, 1, 0); errno != 0 {
			return fmt.Errorf("keepcaps: %w", errno)
		}
	}
	groups := make([]int, len(req.Groups))
	for i, g := range req.Groups {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(int(req.GID), int(req.GID), int(req.GID)); err != nil {
		return fmt.Errorf("setresgid %d: %w", req.GID, err)
	}
	if err := syscall.Setresuid(int(req.UID), int(req.UID), int(req.UID)); err != nil {
		return fmt.Errorf("setresuid %d: %w", req.UID, err)
	}
	if err := capsetAll(keep); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	for c := 0; c < 64; c++ {
		if keep&(1<<uint(c)) != 0 {
			if errno := prctl(prCapAmbient, prCapAmbientRaise, uintptr(c)); errno != 0 {
				return fmt.Errorf("ambient capability %d: %w", c, errno)
			}
		}
	}
	if errno := allThreads(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0); errno != 0 {
		return fmt.Errorf("no_new_privs: %w", errno)
	}
	return nil
}

func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}

func fail(ctl *os.File, stage string, err error) {
	failf(ctl, stage, "%s: %s", stage, errText(err))
}

func failf(ctl *os.File, stage, format string, args ...any) {
	report, _ := json.Marshal(Failure{Stage: stage, Message: fmt.Sprintf(format, args...)})
	_, _ = ctl.Write(report)
	os.Exit(127)
}

// Child process, as the agent sees it.
type Process struct {
	PID int
	ctl *os.File
}

// Start starts the spawn helper with the given stdio (the first is also its controlling
// terminal when tty is set) and extra files (fd 4 on; fd 3 is the helper's control
// socket, closed when the command runs) and hands it req. It returns once the helper is
// ready to exec (call Go to let it) or has failed (the Failure, the helper already gone).
func Start(self string, req Request, stdio [3]*os.File, extra []*os.File, tty bool) (*Process, *Failure, error) {
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "spawn-control"), os.NewFile(uintptr(pair[1]), "spawn-control")
	defer theirs.Close()
	attr := &os.ProcAttr{
		Env:   []string{},
		Files: append([]*os.File{stdio[0], stdio[1], stdio[2], theirs}, extra...),
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: tty, Ctty: 0},
	}
	argv := []string{"sandboxd-agent", "spawn"}
	if req.Run != "" {
		argv = append(argv, req.Run) // for ps: what the helper is for
	}
	proc, err := os.StartProcess(self, argv, attr)
	if err != nil {
		ours.Close()
		return nil, &Failure{Stage: "fork", Message: "fork: " + errText(err)}, nil
	}
	theirs.Close()
	body, _ := json.Marshal(req)
	if _, err := ours.Write(append(body, '\n')); err != nil {
		ours.Close()
		return nil, &Failure{Stage: "request", Message: "the spawn helper died: " + errText(err)}, nil
	}
	p := &Process{PID: proc.Pid, ctl: ours}
	var first [1]byte
	n, _ := ours.Read(first[:])
	if n == 1 && first[0] == Ready {
		return p, nil, nil
	}
	rest, _ := io.ReadAll(io.LimitReader(ours, 64*1024))
	ours.Close()
	return nil, decodeFailure(append(first[:n], rest...)), nil
}

// Abort tells the helper not to run the command: it exits at once.
func (p *Process) Abort() { p.ctl.Close() }

// Go lets the command run. It returns a Failure if executing it failed.
func (p *Process) Go() *Failure {
	defer p.ctl.Close()
	if _, err := p.ctl.Write([]byte{Go}); err != nil {
		return died()
	}
	report, _ := io.ReadAll(io.LimitReader(p.ctl, 64*1024))
	if len(report) == 0 {
		return nil // close-on-exec closed it: the command runs
	}
	return decodeFailure(report)
}

// died is the failure of a helper that ended without a word: killed, or unable to run at
// all (a workspace out of processes cannot give it the threads it starts with).
func died() *Failure {
	return &Failure{Stage: "died", Message: "the command's process died before it started (the workspace may be out of processes or memory)"}
}

func decodeFailure(report []byte) *Failure {
	var f Failure
	if len(report) == 0 || json.Unmarshal(report, &f) != nil || f.Stage == "" {
		return died()
	}
	return &f
}
