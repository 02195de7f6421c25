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
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
	for c := 0; c < 64; c++ {
		if keep&(1<<uint(c)) != 0 {
			if errno := prctl(prCapAmbient, prCapAmbientRaise, uintptr(c)); errno != 0 {
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

// Child process, as the agent sees it.
type Process struct {
	PID int
	ctl *os.File
}

// Pool starts helpers from the agent's binary and keeps one idle ahead of need.
type Pool struct {
	self string
	// reap collects the exit status of a helper the pool lets go (one that died idle), so
	// that it is not left for a later process with the same pid.
	reap func(pid int)

	mu      sync.Mutex
	idle    *helper
	filling bool
}

// helper is a started spawn helper that has not been handed a request yet.
type helper struct {
	pid int
	ctl *os.File
}

// NewPool returns a pool of helpers started from the binary at self; reap must collect the
// exit status of the pid it is given.
func NewPool(self string, reap func(pid int)) *Pool {
	return &Pool{self: self, reap: reap}
}

// Fill starts an idle helper in the background unless one is there or on its way. A
// helper that cannot start (a workspace out of processes) is no error here: the next
// Start starts one itself and reports why it cannot.
func (p *Pool) Fill() {
	p.mu.Lock()
	if p.idle != nil || p.filling {
		p.mu.Unlock()
		return
	}
	p.filling = true
	p.mu.Unlock()
	go func() {
		h, _ := p.launch()
		p.mu.Lock()
		p.filling = false
		if p.idle == nil && h != nil {
			p.idle, h = h, nil
		}
		p.mu.Unlock()
		if h != nil {
			h.release(p.reap)
		}
	}()
}

// Start hands req and the command's stdio (the first is also its controlling terminal
// when tty is set; a nil one stays /dev/null) and extra files (fd 4 on; fd 3 is the
// helper's control socket, closed when the command runs) to the idle helper, or to one it
// starts when none is idle or the idle one has died. It returns once the helper is ready
// to exec (call Go to let it) or has failed (the Failure, the helper already gone).
func (p *Pool) Start(req Request, stdio [3]*os.File, extra []*os.File, tty bool) (*Process, *Failure, error) {
	if len(extra) > maxHanded-3 {
		return nil, nil, fmt.Errorf("%d extra files: a helper takes at most %d", len(extra), maxHanded-3)
	}
	var files []*os.File
	req.Files, req.TTY = nil, tty
	for i, f := range append(stdio[:], extra...) {
		if f != nil {
			files = append(files, f)
			req.Files = append(req.Files, handedTargets[i])
		}
	}
	p.mu.Lock()
	h := p.idle
	p.idle = nil
	p.mu.Unlock()
	defer p.Fill()
	if h != nil {
		proc, failure := p.hand(h, req, files)
		if failure == nil || failure.Stage != "handoff" {
			return proc, failure, nil
		}
		h.release(p.reap) // it died while idle: start another
	}
	h, failure := p.launch()
	if failure != nil {
		return nil, failure, nil
	}
	proc, failure := p.hand(h, req, files)
	if failure != nil && failure.Stage == "handoff" {
		failure = died()
	}
	return proc, failure, nil
}

// StartOwn is Start for a helper of its own, started now and never the idle one: one
// that lives on (a user's file server) and that ps tells apart by its argv, "sandboxd-agent
// spawn NAME". Its stdio stays /dev/null.
func (p *Pool) StartOwn(req Request, extra []*os.File, name string) (*Process, *Failure, error) {
	if len(extra) > maxHanded-3 {
		return nil, nil, fmt.Errorf("%d extra files: a helper takes at most %d", len(extra), maxHanded-3)
	}
	req.Files, req.TTY = nil, false
	for i := range extra {
		req.Files = append(req.Files, handedTargets[3+i])
	}
	h, failure := p.launch(name)
	if failure != nil {
		return nil, failure, nil
	}
	proc, failure := p.hand(h, req, extra)
	if failure != nil && failure.Stage == "handoff" {
		failure = died()
	}
	return proc, failure, nil
}

// hand is h.hand, collecting the status of a helper killed for stalling (nobody expects it).
func (p *Pool) hand(h *helper, req Request, files []*os.File) (*Process, *Failure) {
	proc, failure := h.hand(req, files)
	if failure != nil && failure.Stage == "stalled" {
		p.reap(h.pid)
	}
	return proc, failure
}

// launch starts a helper that waits for its request; name, if any, follows "spawn" in its argv.
func (p *Pool) launch(name ...string) (*helper, *Failure) {
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, &Failure{Stage: "spawn", Message: "socketpair: " + errText(err)}
	}
	// Ours through the poller, so that waiting on the helper can have a deadline.
	_ = syscall.SetNonblock(pair[0], true)
	ours, theirs := os.NewFile(uintptr(pair[0]), "spawn-control"), os.NewFile(uintptr(pair[1]), "spawn-control")
	defer theirs.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		ours.Close()
		return nil, &Failure{Stage: "spawn", Message: "open /dev/null: " + errText(err)}
	}
	defer null.Close()
	attr := &os.ProcAttr{
		Env: []string{},
		// 0-2 and 4-7 are the places of the files it is handed (receive).
		Files: []*os.File{null, null, null, theirs, null, null, null, null},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}
	proc, err := os.StartProcess(p.self, append([]string{"sandboxd-agent", "spawn"}, name...), attr)
	if err != nil {
		ours.Close()
		return nil, &Failure{Stage: "fork", Message: "fork: " + errText(err)}
	}
	return &helper{pid: proc.Pid, ctl: ours}, nil
}

// hand sends the request and its files, then waits for Ready or the helper's failure. A
// helper that is gone before it took the request fails at stage "handoff".
func (h *helper) hand(req Request, files []*os.File) (*Process, *Failure) {
	body, _ := json.Marshal(req)
	var header [4]byte
	binary.BigEndian.PutUint32(header[:], uint32(len(body)))
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	err := SendRights(h.ctl, header[:], fds)
	runtime.KeepAlive(files)
	if err == nil {
		_, err = h.ctl.Write(body)
	}
	if err != nil {
		h.ctl.Close()
		return nil, &Failure{Stage: "handoff", Message: "the spawn helper died: " + errText(err)}
	}
	var first [1]byte
	_ = h.ctl.SetReadDeadline(time.Now().Add(time.Duration(helperTimeout.Load())))
	n, err := h.ctl.Read(first[:])
	if n == 1 && first[0] == Ready {
		_ = h.ctl.SetReadDeadline(time.Time{})
		return &Process{PID: h.pid, ctl: h.ctl}, nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, stalled(h.pid, h.ctl)
	}
	rest, _ := io.ReadAll(io.LimitReader(h.ctl, 64*1024))
	h.ctl.Close()
	failure := decodeFailure(append(first[:n], rest...))
	if n == 0 && failure.Stage == "died" {
		failure.Stage = "handoff" // ended without reading: killed while idle, or out of threads
	}
	return nil, failure
}

// release lets an unused helper go: it exits when its control socket closes.
func (h *helper) release(reap func(pid int)) {
	h.ctl.Close()
	reap(h.pid)
}

// Abort tells the helper not to run the command: it exits at once.
func (p *Process) Abort() { p.ctl.Close() }

// Go lets the command run. It returns a Failure if executing it failed.
func (p *Process) Go() *Failure {
	defer p.ctl.Close()
	if _, err := p.ctl.Write([]byte{Go}); err != nil {
		return died()
	}
	_ = p.ctl.SetReadDeadline(time.Now().Add(time.Duration(helperTimeout.Load())))
	report, err := io.ReadAll(io.LimitReader(p.ctl, 64*1024))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return stalled(p.PID, p.ctl)
	}
	if len(report) == 0 {
		return nil // close-on-exec closed it: the command runs
	}
	return decodeFailure(report)
}

// helperTimeout bounds each wait on a helper (ready, then executing the command), 30 s
// unless SetHelperTimeout says otherwise. Once a helper has become the workspace user, any
// process of that user may stop it (SIGSTOP): the command would then never start, nor its
// timeout run.
var helperTimeout atomic.Int64

func init() { helperTimeout.Store(int64(30 * time.Second)) }

// SetHelperTimeout changes the bound of each wait on a helper (for tests) and returns the one before.
func SetHelperTimeout(d time.Duration) time.Duration {
	return time.Duration(helperTimeout.Swap(int64(d)))
}

// stalled kills a helper that did not answer in time; its status is collected by whoever
// expects its pid (the agent reaps every child).
func stalled(pid int, ctl *os.File) *Failure {
	_ = syscall.Kill(pid, syscall.SIGKILL)
	ctl.Close()
	return &Failure{Stage: "stalled", Message: fmt.Sprintf("the command's helper did not start it within %s (stopped by a process of the workspace?); it was killed", time.Duration(helperTimeout.Load()))}
}

// SendRights writes data with fds attached (SCM_RIGHTS), waiting while the socket is full.
func SendRights(ctl *os.File, data []byte, fds []int) error {
	raw, err := ctl.SyscallConn()
	if err != nil {
		return err
	}
	var sendErr error
	err = raw.Write(func(fd uintptr) bool {
		for {
			sendErr = syscall.Sendmsg(int(fd), data, syscall.UnixRights(fds...), nil, syscall.MSG_NOSIGNAL)
			if sendErr != syscall.EINTR {
				return sendErr != syscall.EAGAIN
			}
		}
	})
	if err != nil {
		return err
	}
	return sendErr
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
