//go:build linux

package fileops

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"
)

// ServedByServer says whether a file server performs operation (its JSON).
func ServedByServer(operation []byte) bool {
	var head struct {
		Op string `json:"op"`
	}
	if json.Unmarshal(operation, &head) != nil {
		return false
	}
	_, ok := serverOps[head.Op]
	return ok
}

// Server is a workspace user's file server, the spawn helper's "fileserver" handler: as
// that user, with no privilege on any thread, it performs operations one at a time for as
// long as the agent holds the other end of its socket (fd 4). A tool call then starts no
// process, which under gVisor is what a file operation cost (25-30 ms, against 2 ms).
//
// An operation comes as a 4-byte big-endian length carrying two files as SCM_RIGHTS (the
// operation's input, then its output: the pipes a helper would have as stdin and stdout),
// then that many bytes of JSON. The server answers 'T' on the socket when it has taken the
// operation and 'D' when it is done; its frames are a helper's, and it closes the output
// after the last ('R' or 'E'). SIGTERM removes a file being staged and ends the server.
func Server() int {
	cleanUpOnTerm()
	// One pair of buffers serves every operation: fresh ones each time were memory to
	// fault in again, which under gVisor cost about a millisecond per operation.
	o := &out{w: bufio.NewWriterSize(io.Discard, bufferSize), input: bufio.NewReaderSize(eof{}, bufferSize)}
	var done atomic.Uint64
	for {
		request, input, output, err := receiveOp(4)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				fmt.Fprintln(os.Stderr, "sandboxd-agent fileserver:", err)
				return 1
			}
			return 0 // the agent let it go
		}
		// 'T' says the operation is the server's: a server that dies before it took one
		// (killed by a process of its user, its threads still exiting when it was handed
		// the operation) has not begun it, and the agent has a helper do it instead.
		if !tell(4, 'T') {
			return 0
		}
		o.w.Reset(output)
		o.input.Reset(input)
		runWith(o, request, serverOps)
		o.w.Reset(io.Discard)
		o.input.Reset(eof{})
		input.Close()
		output.Close()
		// 'D' says it is done and idle: the output's end alone cannot tell done from dead.
		if !tell(4, 'D') {
			return 0
		}
		// What an operation took (a listing, a written file's pieces) is given back once the
		// server has stood idle for a while: it waits idle for most of its life, counted in
		// the workspace's memory. Not at once: operations back to back would each fault
		// their memory in again.
		n := done.Add(1)
		time.AfterFunc(idleRelease, func() {
			if done.Load() == n {
				debug.FreeOSMemory()
			}
		})
	}
}

// idleRelease is how long a file server stands idle before it gives its memory back.
const idleRelease = 500 * time.Millisecond

// eof is the input of an operation not in progress.
type eof struct{}

func (eof) Read([]byte) (int, error) { return 0, io.EOF }

// receiveOp reads one operation from the socket fd: its JSON, input and output.
func receiveOp(fd int) (request []byte, input, output *os.File, err error) {
	var header [4]byte
	oob := make([]byte, syscall.CmsgSpace(4*2))
	var n, oobn int
	for {
		n, oobn, _, _, err = syscall.Recvmsg(fd, header[:], oob, syscall.MSG_CMSG_CLOEXEC)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return nil, nil, nil, err
	}
	if n == 0 {
		return nil, nil, nil, io.EOF
	}
	var fds []int
	messages, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, nil, nil, err
	}
	for i := range messages {
		rights, err := syscall.ParseUnixRights(&messages[i])
		if err != nil {
			return nil, nil, nil, err
		}
		fds = append(fds, rights...)
	}
	if len(fds) != 2 {
		for _, f := range fds {
			syscall.Close(f)
		}
		return nil, nil, nil, fmt.Errorf("an operation came with %d files, not 2", len(fds))
	}
	input, output = os.NewFile(uintptr(fds[0]), "input"), os.NewFile(uintptr(fds[1]), "output")
	fail := func(err error) ([]byte, *os.File, *os.File, error) {
		input.Close()
		output.Close()
		return nil, nil, nil, err
	}
	if _, err := readFull(fd, header[n:]); err != nil {
		return fail(err)
	}
	size := binary.BigEndian.Uint32(header[:])
	if size > maxRequest {
		return fail(fmt.Errorf("an operation of %d bytes", size))
	}
	request = make([]byte, size)
	if _, err := readFull(fd, request); err != nil {
		return fail(err)
	}
	return request, input, output, nil
}

// tell writes one byte to the agent on socket fd; false if the agent is gone.
func tell(fd int, b byte) bool {
	for {
		err := syscall.Sendmsg(fd, []byte{b}, nil, nil, syscall.MSG_NOSIGNAL)
		if err != syscall.EINTR {
			return err == nil
		}
	}
}

// readFull reads len(p) bytes from fd (not an *os.File: one would close the socket when
// collected).
func readFull(fd int, p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := syscall.Read(fd, p[done:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, io.ErrUnexpectedEOF
		}
		done += n
	}
	return done, nil
}

// Helpers are the spawn helper's in-process handlers (spawn.Request.Run): one operation,
// or a user's file server.
var Helpers = map[string]func() int{"fileop": Main, "fileserver": Server}
