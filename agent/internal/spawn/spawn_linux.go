//go:build linux

package spawn

import (
	"encoding/binary"
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
	prCapbsetRead           = 23
	prCapbsetDrop           = 24
	prSetKeepcaps           = 8
	prSetNoNewPrivs         = 38
	prCapAmbient            = 47
	prCapAmbientRaise       = 2
	linuxCapabilityVersion3 = 0x20080522
)

// Child is the spawn helper: it receives a Request and the command's files on fd 3,
// becomes the workspace user with no privileges, reports Ready, waits for Go, and
// executes the command -- or, for a Request naming one of handlers, runs it in this very
// process and exits with its status: no execve follows the change of user, so the
// process is never dumpable (a same-user process cannot open its pipes through /proc,
// not even in a start-up window). It never returns.
func Child(handlers map[string]func() int) {
	// Capabilities, the bounding set and no_new_privs belong to a thread: all of it must
	// happen on the thread that finally calls execve.
	runtime.LockOSThread()
	ctl := os.NewFile(3, "control")
	req, err := receive(ctl)
	if err != nil {
		if errors.Is(err, io.EOF) {
			os.Exit(0) // an idle helper the agent let go
		}
		fail(ctl, "request", err)
	}
	if req.TTY {
		if _, _, errno := syscall.RawSyscall(syscall.SYS_IOCTL, 0, syscall.TIOCSCTTY, 0); errno != 0 {
			fail(ctl, "stdio", fmt.Errorf("controlling terminal: %w", errno))
		}
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
	if err := dropPrivileges(&req, handler != nil); err != nil {
		failf(ctl, "privileges", "privileges: %v", err) // which step refused, and why
	}
	if err := syscall.Chdir(req.Dir); err != nil {
		failf(ctl, "chdir", "working directory %s: %s", req.Dir, errText(err))
	}
	path, argv := req.command()
	if _, err := ctl.Write([]byte{Ready}); err != nil {
		os.Exit(127)
	}
	var answer [1]byte
	if _, err := io.ReadFull(ctl, answer[:]); err != nil || answer[0] != Go {
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

// Descriptors a helper keeps free for the files it is handed: 0-2 and 4-7 hold /dev/null
// from its start (so that nothing of its own takes them), 3 is its control socket.
var (
	handedTargets = []int{0, 1, 2, 4, 5, 6, 7}
	maxHanded     = len(handedTargets)
)

// receive reads a request and its files from the control socket: a 4-byte big-endian
// length carrying the files as SCM_RIGHTS, then the request's JSON. Each file is put in
// place (Request.Files); a target left out keeps /dev/null, or is closed beyond fd 2.
func receive(ctl *os.File) (Request, error) {
	var req Request
	var header [4]byte
	oob := make([]byte, syscall.CmsgSpace(4*maxHanded))
	var n, oobn, flags int
	var err error
	for {
		// An idle helper waits here for as long as it takes: a signal (the Go runtime's
		// own preemption among them) must not end its wait.
		n, oobn, flags, _, err = syscall.Recvmsg(int(ctl.Fd()), header[:], oob, syscall.MSG_CMSG_CLOEXEC)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return req, err
	}
	if n == 0 {
		return req, io.EOF
	}
	if flags&syscall.MSG_CTRUNC != 0 {
		return req, errors.New("more files than a helper takes")
	}
	var fds []int
	messages, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return req, err
	}
	for i := range messages {
		rights, err := syscall.ParseUnixRights(&messages[i])
		if err != nil {
			return req, err
		}
		fds = append(fds, rights...)
	}
	if _, err := io.ReadFull(ctl, header[n:]); err != nil {
		return req, err
	}
	body := make([]byte, binary.BigEndian.Uint32(header[:]))
	if _, err := io.ReadFull(ctl, body); err != nil {
		return req, err
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return req, err
	}
	if len(fds) != len(req.Files) {
		return req, fmt.Errorf("%d files for %d descriptors", len(fds), len(req.Files))
	}
	placed := map[int]bool{}
	for i, target := range req.Files {
		if !isHandedTarget(target) {
			return req, fmt.Errorf("descriptor %d is not one a helper is handed", target)
		}
		if err := syscall.Dup3(fds[i], target, 0); err != nil {
			return req, fmt.Errorf("descriptor %d: %w", target, err)
		}
		placed[target] = true
	}
	for _, received := range fds {
		syscall.Close(received)
	}
	for _, target := range handedTargets {
		if target > 2 && !placed[target] {
			syscall.Close(target)
		}
	}
	return req, nil
}

func isHandedTarget(fd int) bool {
	for _, target := range handedTargets {
		if fd == target {
			return true
		}
	}
	return false
}

// command is the shell to run and its argv: Shell when it is found in systemPath, else Fallback.
func (req *Request) command() (string, []string) {
	if req.Shell != "" {
		if found := LookPath(req.Shell); found != "" {
			return found, append([]string{req.Shell}, req.Args...)
		}
	}
	return req.Fallback, append([]string{filepath.Base(req.Fallback)}, req.FallbackArgs...)
}

// systemPath is where the shell is looked for: the caller's PATH is the command's
// business and must not decide which shell runs it (or whether one is found).
const systemPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// LookPath is where name is found in the system's PATH (not the caller's), or "".
func LookPath(name string) string {
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

func capset(sys syscaller, keep uint64) error {
	hdr := capHeader{version: linuxCapabilityVersion3}
	data := [2]capData{
		{effective: uint32(keep), permitted: uint32(keep), inheritable: uint32(keep)},
		{effective: uint32(keep >> 32), permitted: uint32(keep >> 32), inheritable: uint32(keep >> 32)},
	}
	if errno := sys(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return errno
	}
	return nil
}

func prctl(option, arg2, arg3 uintptr) syscall.Errno {
	_, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, option, arg2, arg3, 0, 0, 0)
	return errno
}

// A syscaller makes a system call that changes credentials: on this thread only, or on
// every thread of the process.
type syscaller func(trap, a1, a2, a3 uintptr) syscall.Errno

// thisThread is enough before an execve: the new program gets the credentials of the
// thread that calls it (this one: Child locks it), and the other threads end. It costs a
// few microseconds, where each call on every thread stops the world (64 of them for the
// bounding set took 9 to 16 ms).
func thisThread(trap, a1, a2, a3 uintptr) syscall.Errno {
	_, _, errno := syscall.RawSyscall(trap, a1, a2, a3)
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
// (none by default) in every set, the bounding set included, and no_new_privs on: on this
// thread alone when it executes a program next (inProcess false), else on every thread.
// Only capabilities the bounding set holds are dropped from it: a handful, so even on every
// thread that stays cheap.
func dropPrivileges(req *Request, inProcess bool) error {
	sys := syscaller(thisThread)
	if inProcess {
		sys = allThreads
	}
	if os.Geteuid() != 0 {
		// An agent that is not root (its tests on a host) has nothing to drop but can be nobody else.
		if req.UID != uint32(os.Getuid()) {
			return fmt.Errorf("the agent runs as uid %d and cannot start commands as uid %d", os.Getuid(), req.UID)
		}
		if errno := sys(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0); errno != 0 {
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
		if held, _, _ := syscall.RawSyscall(syscall.SYS_PRCTL, prCapbsetRead, uintptr(c), 0); held != 1 {
			continue // not in the set (the container's holds the agent's few): nothing to drop
		}
		if errno := sys(syscall.SYS_PRCTL, prCapbsetDrop, uintptr(c), 0); errno != 0 && errno != syscall.EINVAL {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, errno)
		}
	}
	if keep != 0 {
		if errno := sys(syscall.SYS_PRCTL, prSetKeepcaps, 1, 0); errno != 0 {
			return fmt.Errorf("keepcaps: %w", errno)
		}
	}
	// gid_t is 32 bits on every Linux Go supports; an empty list still needs a valid pointer.
	groups := append(make([]uint32, 0, len(req.Groups)+1), req.Groups...)
	if errno := sys(syscall.SYS_SETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(&groups[:1][0])), 0); errno != 0 {
		return fmt.Errorf("setgroups: %w", errno)
	}
	runtime.KeepAlive(groups)
	gid, uid := uintptr(req.GID), uintptr(req.UID)
	if errno := sys(syscall.SYS_SETRESGID, gid, gid, gid); errno != 0 {
		return fmt.Errorf("setresgid %d: %w", req.GID, errno)
	}
	if errno := sys(syscall.SYS_SETRESUID, uid, uid, uid); errno != 0 {
		return fmt.Errorf("setresuid %d: %w", req.UID, errno)
	}
	if err := capset(sys, keep); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	// Root keeps its permitted set across exec by itself (no_new_privs caps it at this one);
	// another user keeps capabilities only as ambient ones, which gVisor does not have.
	for c := 0; c < 64 && req.UID != 0; c++ {
		if keep&(1<<uint(c)) != 0 {
			if errno := prctl(prCapAmbient, prCapAmbientRaise, uintptr(c)); errno == syscall.EINVAL {
				return fmt.Errorf("capability %d cannot pass to a non-root command: this kernel has no ambient capabilities (gVisor's has none; run the command as root, or under runc)", c)
			} else if errno != 0 {
				return fmt.Errorf("ambient capability %d: %w", c, errno)
			}
		}
	}
	if errno := sys(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0); errno != 0 {
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
