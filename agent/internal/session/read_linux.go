//go:build linux

package session

import (
	"errors"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// drainWindow is how long a pipe may be quiet after the command's exit before it counts
// as drained (a background writer may hold it open for ever).
const drainWindow = 20 * time.Millisecond

// drainBudget is the most reading done after the command's exit on a pipe that never goes
// quiet (a background writer flooding it), once what was waiting in it is read.
const drainBudget = 500 * time.Millisecond

type reader struct {
	file    *os.File
	stream  byte
	drained chan struct{}
}

// startReaders reads every output pipe into the buffer (and the spill file).
func (s *Session) startReaders(files []*os.File) []*reader {
	var out []*reader
	for i, f := range files {
		stream := byte('1')
		if i == 1 {
			stream = '2'
		}
		r := &reader{file: f, stream: stream, drained: make(chan struct{})}
		out = append(out, r)
		go s.read(r)
	}
	return out
}

// read copies one pipe into the buffer until its end. Once the command has exited (finish
// sets a read deadline), the pipe is drained: all that was waiting in it when this reader
// first saw the exit (the command's, written before it exited), then whatever keeps coming
// for at most drainBudget of reading, counted from then: the rest is a leftover's (a
// background writer), read so that it never blocks, and not kept. Time spent waiting for the
// daemon to take output (back-pressure) does not count, nor does the time before this
// reader ran at all (a loaded machine may not run it for a second): nothing the command
// wrote before it exited is lost.
func (s *Session) read(r *reader) {
	defer r.file.Close()
	chunk := make([]byte, 64<<10)
	forward := true
	drained := false
	var blocked time.Duration
	var drainStart time.Time // when this reader first saw the command's exit
	owed := 0                // bytes waiting then, still to read: the command's own
	markDrained := func() {
		if !drained {
			drained = true
			close(r.drained)
		}
	}
	defer markDrained()
	for {
		n, err := r.file.Read(chunk)
		if owed -= n; owed < 0 {
			owed = 0
		}
		if n > 0 && forward {
			s.spill.feed(chunk[:n])
			began := time.Now()
			if !s.buf.Append(r.stream, chunk[:n]) {
				forward = false
			}
			if !drainStart.IsZero() {
				blocked += time.Since(began)
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if drainStart.IsZero() {
				drainStart, owed = time.Now(), waiting(r.file)
			}
			if forward && (owed > 0 || (waiting(r.file) > 0 && time.Since(drainStart)-blocked < drainBudget)) {
				_ = r.file.SetReadDeadline(time.Now().Add(drainWindow))
				continue
			}
			forward = false
			markDrained()
			_ = r.file.SetReadDeadline(time.Time{})
			continue
		}
		return // EOF, or EIO from a terminal whose last holder closed it
	}
}

// waiting is how many bytes can be read from f at once (FIONREAD).
func waiting(f *os.File) int {
	raw, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	var n int32
	_ = raw.Control(func(fd uintptr) {
		_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	})
	return int(n)
}
