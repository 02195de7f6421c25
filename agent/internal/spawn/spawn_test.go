//go:build linux

package spawn

// These tests start real helpers from the test binary (TestMain makes it one, as main does
// for the agent) and real commands in them. As root the commands run as nobody, so
// privileges are really dropped; otherwise as the test's own user.

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// handlers are the in-process handlers of the test helper (Request.Run).
var handlers = map[string]func() int{
	"exit7": func() int { return 7 },
	"whoami": func() int {
		fmt.Printf("%d:%d", os.Getuid(), os.Getgid())
		return 0
	},
}

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "spawn" {
		Child(handlers)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testPool = NewPool(self, func(pid int) { go func() { _ = wait(pid) }() })
	os.Exit(m.Run())
}

var testPool *Pool

// ids is the uid and gid commands run as.
func ids() (uint32, uint32) {
	if os.Getuid() == 0 {
		return 65534, 65534
	}
	return uint32(os.Getuid()), uint32(os.Getgid())
}

// request runs script with /bin/sh as the test's command user.
func request(script string) Request {
	uid, gid := ids()
	return Request{Fallback: "/bin/sh", FallbackArgs: []string{"-c", script}, Dir: "/", UID: uid, GID: gid, Env: []string{"PATH=/usr/bin:/bin"}}
}

// wait collects a child's exit status.
func wait(pid int) syscall.WaitStatus {
	var ws syscall.WaitStatus
	for {
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != syscall.EINTR {
			return ws
		}
	}
}

// run starts req with a pipe for stdout, lets it go, and returns its output and status.
func run(t *testing.T, req Request, extra ...*os.File) (string, syscall.WaitStatus) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	proc, failure, err := testPool.Start(req, [3]*os.File{nil, w, nil}, extra, false)
	w.Close()
	if err != nil || failure != nil {
		t.Fatalf("start: %v %+v", err, failure)
	}
	if failure := proc.Go(); failure != nil {
		t.Fatalf("go: %+v", failure)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(out), wait(proc.PID)
}

func TestACommandRunsAsItsUserWithNoPrivilegesLeft(t *testing.T) {
	out, ws := run(t, request("id -u; id -g; id -G; grep -E '^(NoNewPrivs|CapEff|CapBnd|CapAmb):' /proc/self/status"))
	uid, gid := ids()
	bounding := "0000000000000000"
	if os.Getuid() != 0 {
		// A helper that is not root cannot drop the bounding set, and needs not: it has no capability.
		bounding = statusField(t, "CapBnd")
	}
	want := fmt.Sprintf("%d\n%d\n%d\nCapEff:\t0000000000000000\nCapBnd:\t%s\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n", uid, gid, gid, bounding)
	if ws.ExitStatus() != 0 || out != want {
		t.Errorf("exit %d, output\n%s\nwant\n%s", ws.ExitStatus(), out, want)
	}
}

// statusField is a field of the test process's own /proc status.
func statusField(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, name+":\t") {
			return strings.TrimPrefix(line, name+":\t")
		}
	}
	t.Fatalf("no %s in /proc/self/status", name)
	return ""
}

func TestACapabilityAskedForIsKeptInEverySet(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("only root has capabilities to keep")
	}
	req := request("grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status")
	req.Capabilities = []int{5} // CAP_KILL
	out, _ := run(t, req)
	var want string
	for _, set := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		want += set + ":\t0000000000000020\n"
	}
	if out != want {
		t.Errorf("capabilities\n%s\nwant\n%s", out, want)
	}
}

func TestTheCommandGetsTheFilesItIsHandedInPlace(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// fd 4 is the first extra file; fd 3 (the control socket) is closed once the command runs.
	out, ws := run(t, request("echo four >&4; if [ -e /proc/self/fd/3 ]; then echo fd3; fi; echo stdout"), w)
	w.Close()
	fourth, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if ws.ExitStatus() != 0 || out != "stdout\n" || string(fourth) != "four\n" {
		t.Errorf("exit %d, stdout %q, fd 4 %q; want 0, %q, %q", ws.ExitStatus(), out, fourth, "stdout\n", "four\n")
	}
}

func TestAnInProcessHandlerRunsAsTheUserAndExitsWithItsStatus(t *testing.T) {
	uid, gid := ids()
	out, ws := run(t, Request{Run: "whoami", Dir: "/", UID: uid, GID: gid})
	if want := fmt.Sprintf("%d:%d", uid, gid); ws.ExitStatus() != 0 || out != want {
		t.Errorf("exit %d output %q, want 0 %q", ws.ExitStatus(), out, want)
	}
	_, ws = run(t, Request{Run: "exit7", Dir: "/", UID: uid, GID: gid})
	if ws.ExitStatus() != 7 {
		t.Errorf("exit %d, want the handler's 7", ws.ExitStatus())
	}
}

func TestAFailedStartIsReportedWithItsStage(t *testing.T) {
	req := request("true")
	req.Dir = "/nonexistent-directory"
	proc, failure, err := testPool.Start(req, [3]*os.File{}, nil, false)
	if err != nil || proc != nil || failure == nil {
		t.Fatalf("start in a missing directory: %v %v %+v", err, proc, failure)
	}
	want := Failure{Stage: "chdir", Message: "working directory /nonexistent-directory: no such file or directory"}
	if *failure != want {
		t.Errorf("failure %+v, want %+v", *failure, want)
	}

	req = request("true")
	req.Fallback = "/nonexistent-shell"
	proc, failure, err = testPool.Start(req, [3]*os.File{}, nil, false)
	if err != nil || failure != nil {
		t.Fatalf("start: %v %+v", err, failure)
	}
	failure = proc.Go()
	want = Failure{Stage: "exec", Message: "/nonexistent-shell: no such file or directory"}
	if failure == nil || *failure != want {
		t.Errorf("failure %+v, want %+v", failure, want)
	}
	if ws := wait(proc.PID); ws.ExitStatus() != 127 {
		t.Errorf("a helper that could not exec exited %d, want 127", ws.ExitStatus())
	}

	req = request("true")
	req.Run = "no-such-handler"
	_, failure, _ = testPool.Start(req, [3]*os.File{}, nil, false)
	want = Failure{Stage: "request", Message: `no in-process handler "no-such-handler"`}
	if failure == nil || *failure != want {
		t.Errorf("failure %+v, want %+v", failure, want)
	}
}

func TestAnAbortedCommandNeverRuns(t *testing.T) {
	dir := t.TempDir()
	// Were the command to run, as its user, it could make the file.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	marker := filepath.Join(dir, "ran")
	proc, failure, err := testPool.Start(request("touch "+marker), [3]*os.File{}, nil, false)
	if err != nil || failure != nil {
		t.Fatalf("start: %v %+v", err, failure)
	}
	proc.Abort()
	if ws := wait(proc.PID); ws.ExitStatus() != 127 {
		t.Errorf("an aborted helper exited %d, want 127", ws.ExitStatus())
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("the aborted command ran: %v", err)
	}
}

func TestStartHandsTheRequestToTheIdleHelper(t *testing.T) {
	testPool.Fill()
	var idle int
	for deadline := time.Now().Add(10 * time.Second); idle == 0; time.Sleep(5 * time.Millisecond) {
		testPool.mu.Lock()
		if testPool.idle != nil {
			idle = testPool.idle.pid
		}
		testPool.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("no idle helper within 10 s")
		}
	}
	proc, failure, err := testPool.Start(request("exit 3"), [3]*os.File{}, nil, false)
	if err != nil || failure != nil {
		t.Fatalf("start: %v %+v", err, failure)
	}
	if proc.PID != idle {
		t.Errorf("the command runs in pid %d, not in the idle helper %d", proc.PID, idle)
	}
	if failure := proc.Go(); failure != nil {
		t.Fatalf("go: %+v", failure)
	}
	if ws := wait(proc.PID); ws.ExitStatus() != 3 {
		t.Errorf("exit %d, want 3", ws.ExitStatus())
	}
}

func TestLookPathSearchesTheSystemsPathOnly(t *testing.T) {
	if got := LookPath("sh"); got != "/usr/bin/sh" && got != "/bin/sh" {
		t.Errorf("LookPath(sh) = %q", got)
	}
	if got := LookPath("no-such-program-anywhere"); got != "" {
		t.Errorf("LookPath of a missing program = %q, want none", got)
	}
}
