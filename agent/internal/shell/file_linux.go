//go:build linux

package shell

import (
	"os"
	"syscall"
	"unsafe"
)

const (
	mfdCloexec      = 0x1
	mfdAllowSealing = 0x2
	fAddSeals       = 1033
	sealAll         = 0x1 | 0x2 | 0x4 | 0x8 // F_SEAL_SEAL, _SHRINK, _GROW, _WRITE
)

// HookFile returns a file holding text that the shell opens again as /dev/fd/5: a sealed
// memory file (each open reads it from its start, so a bash that the profile starts, which
// inherits the descriptor and BASH_ENV, cannot take the text from the shell), or a pipe
// where memory files are missing.
func HookFile(text string) (*os.File, error) {
	name := []byte("sandboxd-hook\x00")
	fd, _, errno := syscall.Syscall(sysMemfdCreate, uintptr(unsafe.Pointer(&name[0])), mfdCloexec|mfdAllowSealing, 0)
	if errno != 0 {
		return pipeFile(text)
	}
	f := os.NewFile(fd, "sandboxd-hook")
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return nil, err
	}
	// Nobody changes it after this, not even a process of the user's that opens it again.
	_, _, _ = syscall.Syscall(syscall.SYS_FCNTL, fd, fAddSeals, sealAll)
	return f, nil
}

func pipeFile(text string) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	go func() {
		_, _ = w.WriteString(text)
		w.Close()
	}()
	return r, nil
}
