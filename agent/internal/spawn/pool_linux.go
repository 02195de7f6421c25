//go:build linux

package spawn

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

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

// SendRights writes data with fds attached (SCM_RIGHTS) to the first of its bytes, waiting
// while the socket is full.
func SendRights(ctl *os.File, data []byte, fds []int) error {
	raw, err := ctl.SyscallConn()
	if err != nil {
		return err
	}
	var sent int
	var sendErr error
	err = raw.Write(func(fd uintptr) bool {
		for {
			sent, sendErr = syscall.SendmsgN(int(fd), data, syscall.UnixRights(fds...), nil, syscall.MSG_NOSIGNAL)
			if sendErr != syscall.EINTR {
				return sendErr != syscall.EAGAIN
			}
		}
	})
	if err == nil {
		err = sendErr
	}
	if err == nil && sent < len(data) {
		_, err = ctl.Write(data[sent:]) // a stream socket may take a long message in parts
	}
	return err
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
