//go:build linux

package agent

import (
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// The bridge's copy buffer and the size it asks for its stdout pipe (an unprivileged
// process may have up to /proc/sys/fs/pipe-max-size, 1 MiB by default).
const (
	bridgeCopyBytes = 1 << 20
	bridgePipeBytes = 1 << 20
)

// bridgeWait is how long the bridge waits for the agent to listen.
const bridgeWait = 10 * time.Second

// Bridge connects stdin and stdout to the agent's socket (the daemon's docker exec runs
// this), and returns when either side ends.
func Bridge() error {
	reserveThreads(bridgeThreads)
	var raw *net.UnixConn
	var err error
	// A workspace just created: its agent may still be starting.
	for deadline := time.Now().Add(bridgeWait); ; {
		raw, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: SocketPath, Net: "unix"})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("the agent does not answer on %s: %w", SocketPath, err)
	}
	defer raw.Close()
	if uid, err := peerUID(raw); err != nil || !trusted(uid) {
		return fmt.Errorf("the process on %s is not the agent (uid %d)", SocketPath, uid)
	}
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(raw, os.Stdin)
		_ = raw.CloseWrite()
		done <- struct{}{}
	}()
	go func() {
		// Output is most of what crosses: big pieces, and a pipe to the engine that holds
		// more than the default 64 KiB, mean fewer system calls and wake-ups per byte. (The
		// wrappers keep io.CopyBuffer from choosing a 32 KiB copy of its own.)
		_, _, _ = syscall.Syscall(syscall.SYS_FCNTL, 1, syscall.F_SETPIPE_SZ, bridgePipeBytes)
		buf := make([]byte, bridgeCopyBytes)
		_, _ = io.CopyBuffer(struct{ io.Writer }{os.Stdout}, struct{ io.Reader }{raw}, buf)
		done <- struct{}{}
	}()
	<-done
	return nil
}
