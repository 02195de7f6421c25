//go:build linux

// Package pty opens pseudo-terminals with the standard library only.
package pty

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// Open returns a new terminal's master and slave ends, the slave of the given size
// and owned by uid:gid (so programs that reopen it by name may).
func Open(columns, rows int, uid, gid uint32) (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	var unlock int32
	if err := ioctl(master, syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	var number uint32
	if err := ioctl(master, syscall.TIOCGPTN, uintptr(unsafe.Pointer(&number))); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	name := fmt.Sprintf("/dev/pts/%d", number)
	slave, err = os.OpenFile(name, os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open %s: %w", name, err)
	}
	_ = os.Chown(name, int(uid), int(gid)) // best effort: needs CAP_CHOWN
	if err := Resize(master, columns, rows); err != nil {
		master.Close()
		slave.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

type winsize struct {
	rows, columns, x, y uint16
}

// Resize sets a terminal's size in character cells.
func Resize(f *os.File, columns, rows int) error {
	size := winsize{rows: clamp(rows), columns: clamp(columns)}
	if err := ioctl(f, syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&size))); err != nil {
		return fmt.Errorf("set terminal size: %w", err)
	}
	return nil
}

func clamp(n int) uint16 {
	if n < 1 {
		return 1
	}
	if n > 65535 {
		return 65535
	}
	return uint16(n)
}

// ioctl runs one ioctl on f without f.Fd(), which would switch f to blocking mode and
// out of the poller (reads with deadlines need it there).
func ioctl(f *os.File, request, arg uintptr) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := raw.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, request, arg)
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}
