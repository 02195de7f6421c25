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
// quiet (a background writer flooding it).
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
// sets a read deadline), the pipe is drained while bytes are waiting in it, for at most
// drainBudget of reading: the rest is a leftover's (a background writer), read so that it
// never blocks, and not kept. Time spent waiting for the daemon to take output
// (back-pressure) does not count: nothing the command wrote before it exited is lost.
func (s *Session) read(r *reader) {
	defer r.file.Close()
	chunk := make([]byte, 64<<10)
	forward := true
	drained := false
	var blocked time.Duration
	markDrained := func() {
		if !drained {
			drained = true
			close(r.drained)
		}
	}
	defer markDrained()
	for {
		n, err := r.file.Read(chunk)
		if n > 0 && forward {
			s.spill.feed(chunk[:n])
			began := time.Now()
			if !s.buf.Append(r.stream, chunk[:n]) {
				forward = false
			}
			blocked += time.Since(began)
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			exitedAt := s.exitTime()
			if forward && waiting(r.file) > 0 && time.Since(exitedAt)-blocked < drainBudget {
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

func (s *Session) exitTime() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitedAt
}
