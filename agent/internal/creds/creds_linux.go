//go:build linux

// Package creds runs a function with the filesystem credentials of another user.
//
// The agent is root; to read a file or a process's environment with exactly the
// rights of the workspace user (no more), it switches one OS thread's filesystem
// uid, gid and groups to the user's for the duration of the call. Those are
// per-thread in Linux; the rest of the agent is unaffected.
package creds

import (
	"fmt"
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
	result := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := switchTo(u)
		if err == nil {
			err = fn()
		}
		if restore() == nil {
			runtime.UnlockOSThread()
		} // else: this goroutine ends locked, and Go ends its thread with it
		result <- err
	}()
	return <-result
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
	syscall.RawSyscall(syscall.SYS_SETFSGID, uintptr(u.GID), 0, 0)
	syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(u.UID), 0, 0)
	// setfsuid reports no error: ask for the value back to know it took.
	if got, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0); uint32(got) != u.UID {
		return fmt.Errorf("setfsuid %d did not take", u.UID)
	}
	return nil
}

func restore() error {
	syscall.RawSyscall(syscall.SYS_SETFSUID, 0, 0, 0)
	syscall.RawSyscall(syscall.SYS_SETFSGID, 0, 0, 0)
	if got, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0); got != 0 {
		return fmt.Errorf("setfsuid 0 did not take")
	}
	return setgroups(nil)
}
