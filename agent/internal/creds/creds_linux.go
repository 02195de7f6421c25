//go:build linux

// Package creds runs a function with the filesystem credentials of another user.
//
// The agent is root; to read a file or a process's environment with exactly the
// rights of the workspace user (no more), it switches one OS thread's effective
// uid, gid and groups to the user's for the duration of the call. Those are
// per-thread in Linux (and in gVisor); the rest of the agent is unaffected.
package creds

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"
)

// User is a uid, gid and supplementary groups.
type User struct {
	UID    uint32
	GID    uint32
	Groups []uint32
}

// As runs fn on a thread whose filesystem credentials are u's. The thread goes back to
// root's afterwards; a thread that cannot is retired rather than reused.
func As(u User, fn func() error) error {
	if os.Geteuid() != 0 {
		return fn() // an agent that is not root (its tests) has no other rights to take
	}
	result := make(chan error, 1)
	go run(u, fn, result)
	return <-result
}

func run(u User, fn func() error, result chan<- error) {
	runtime.LockOSThread()
	if syscall.Gettid() == syscall.Getpid() {
		// The thread-group leader. /proc/<agent> is judged by its credentials (gVisor makes
		// them the owner of those files), so they never change: while this goroutine holds
		// the leader, another thread does the work.
		inner := make(chan error, 1)
		go run(u, fn, inner)
		err := <-inner
		runtime.UnlockOSThread()
		result <- err
		return
	}
	groups, err := syscall.Getgroups()
	if err == nil {
		err = switchTo(u)
	}
	if err == nil {
		err = fn()
	}
	if restore(groups) == nil {
		runtime.UnlockOSThread()
	} // else: this goroutine ends locked, and Go ends its thread with it
	result <- err
}

func setgroups(groups []uint32) error {
	var ptr unsafe.Pointer
	if len(groups) > 0 {
		ptr = unsafe.Pointer(&groups[0])
	}
	// The raw system call is per thread; syscall.Setgroups would change every thread.
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETGROUPS, uintptr(len(groups)), uintptr(ptr), 0); errno != 0 {
		return errno
	}
	return nil
}

func switchTo(u User) error {
	if err := setgroups(u.Groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	// The effective ids, on this thread only (the raw system calls; Go's own change every
	// thread): the filesystem ids follow them, and the saved id 0 lets the thread come back.
	// setfsuid alone would do under runc, but gVisor does not implement it.
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETRESGID, ^uintptr(0), uintptr(u.GID), ^uintptr(0)); errno != 0 {
		return fmt.Errorf("setresgid: %w", errno)
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETRESUID, ^uintptr(0), uintptr(u.UID), ^uintptr(0)); errno != 0 {
		return fmt.Errorf("setresuid: %w", errno)
	}
	return nil
}

func restore(groups []int) error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); errno != 0 {
		return fmt.Errorf("setresuid 0: %w", errno)
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETRESGID, ^uintptr(0), 0, ^uintptr(0)); errno != 0 {
		return fmt.Errorf("setresgid 0: %w", errno)
	}
	saved := make([]uint32, len(groups))
	for i, g := range groups {
		saved[i] = uint32(g)
	}
	return setgroups(saved)
}
