// Package fileops is the file-operation helper. The agent starts it as the workspace
// user for one operation, so paths (symlinks included) resolve inside the container and
// permissions are the user's shell's. It does only primitive operations; the file
// semantics (cat -n pages, exact replacement, diffs) live in the daemon.
//
// The operation (JSON) comes on fd 4. Frames (one kind byte, a 4-byte big-endian length,
// the payload), as sandboxd's file operations have always spoken:
//
//	stdout: 'D' data bytes; 'L' one selected line (an 8-byte big-endian character count
//	        of the whole line, then its first bytes); 'R' the result as JSON, or 'E' an
//	        error as JSON {"code", "errno", "message"}: exactly one of the two, always last.
//	stdin (write, upload): 'I' bytes, 'C' end of data.
package fileops

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"sandboxd/agent/internal/users"
)

// chunk is the size of a data frame.
const chunk = 64 << 10

// procFileCap is the most read from a file that reports size 0 (/proc, /sys).
const procFileCap = 64 << 20

// OpError is a failure the daemon maps to a status: code is one of not_found,
// not_directory, is_directory, permission, exists, not_empty, no_space, invalid, io,
// too_large, binary, conflict, aborted, network.
type OpError struct {
	Code    string `json:"code"`
	Errno   int    `json:"errno"`
	Message string `json:"message"`
}

func (e *OpError) Error() string { return e.Message }

func opErr(code, format string, args ...any) *OpError {
	return &OpError{Code: code, Message: fmt.Sprintf(format, args...)}
}

var codes = map[syscall.Errno]string{
	syscall.ENOENT:       "not_found",
	syscall.ENOTDIR:      "not_directory",
	syscall.EISDIR:       "is_directory",
	syscall.EACCES:       "permission",
	syscall.EPERM:        "permission",
	syscall.EROFS:        "permission",
	syscall.EEXIST:       "exists",
	syscall.ENOTEMPTY:    "not_empty",
	syscall.EBUSY:        "busy",
	syscall.ENOSPC:       "no_space",
	syscall.EDQUOT:       "no_space",
	syscall.ELOOP:        "invalid",
	syscall.ENAMETOOLONG: "invalid",
	syscall.EXDEV:        "invalid",
	syscall.EINVAL:       "invalid",
}

// strerror is the C library's wording, as the shell prints it.
func strerror(errno syscall.Errno) string {
	text := errno.Error()
	if text == "" {
		return "error"
	}
	return string(text[0]-32) + text[1:]
}

// fromOS turns a system error about path into an OpError ("PATH: No such file or directory").
func fromOS(err error, path string) *OpError {
	var op *OpError
	if errors.As(err, &op) {
		return op
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		code, ok := codes[errno]
		if !ok {
			code = "io"
		}
		if errno == syscall.EACCES {
			return denied(path)
		}
		return &OpError{Code: code, Errno: int(errno), Message: fmt.Sprintf("%s: %s", path, strerror(errno))}
	}
	return &OpError{Code: "io", Message: fmt.Sprintf("%s: %v", path, err)}
}

// denied is EACCES on path, saying whose is the nearest of path and the directories above it
// that exists: "/workspace/a: Permission denied (/workspace belongs to uid 2000, mode 0755;
// this runs as uid 1000 (sandbox))". An image's own directory is left as the image made it
// (agent/internal/owner), and this says why a write there fails.
func denied(path string) *OpError {
	msg := path + ": Permission denied"
	for at := filepath.Clean(path); ; at = filepath.Dir(at) {
		var st syscall.Stat_t
		if syscall.Stat(at, &st) == nil {
			msg += fmt.Sprintf(" (%s belongs to %s, mode %04o; this runs as %s)",
				at, whoIs(st.Uid), st.Mode&0o7777, whoIs(uint32(os.Geteuid())))
			break
		}
		if at == "/" || at == "." {
			break
		}
	}
	return &OpError{Code: "permission", Errno: int(syscall.EACCES), Message: msg}
}

// whoIs names a uid as "uid 1000 (sandbox)", or "uid 1000" when the image's passwd has no name for it.
func whoIs(uid uint32) string {
	if u, err := users.Resolve(strconv.FormatUint(uint64(uid), 10), ""); err == nil && u.Name != "" {
		return fmt.Sprintf("uid %d (%s)", uid, u.Name)
	}
	return fmt.Sprintf("uid %d", uid)
}

// out writes frames to the operation's output, buffered; input is where its data comes
// from (the 'I' and 'C' frames of write and upload).
type out struct {
	w     *bufio.Writer
	input *bufio.Reader
}

func (o *out) send(kind byte, payload []byte) {
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	_, _ = o.w.Write(hdr[:])
	_, _ = o.w.Write(payload)
}

func (o *out) sendJSON(kind byte, v any) {
	body, _ := json.Marshal(v)
	o.send(kind, body)
}

// dataWriter turns writes into 'D' frames of at most chunk bytes.
type dataWriter struct {
	o       *out
	pending []byte
}

func (d *dataWriter) Write(p []byte) (int, error) {
	d.pending = append(d.pending, p...)
	for len(d.pending) >= chunk {
		d.o.send('D', d.pending[:chunk])
		d.pending = d.pending[chunk:]
	}
	return len(p), nil
}

func (d *dataWriter) flush() {
	if len(d.pending) > 0 {
		d.o.send('D', d.pending)
		d.pending = nil
	}
}

// in reads the 'I' frames of stdin until 'C'.
type in struct {
	r    *bufio.Reader
	data []byte
	done bool
}

var errCutOff = &OpError{Code: "aborted", Message: "the data stream was cut off before its end; nothing was written"}

func (i *in) Read(p []byte) (int, error) {
	for len(i.data) == 0 {
		if i.done {
			return 0, io.EOF
		}
		var hdr [5]byte
		if _, err := io.ReadFull(i.r, hdr[:]); err != nil {
			// The daemon hung up before its end-of-data frame: the call was cancelled.
			// Committing what arrived would leave a truncated file.
			return 0, errCutOff
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n > 4<<20 {
			return 0, opErr("invalid", "a data frame of %d bytes is too large", n)
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(i.r, payload); err != nil {
			return 0, errCutOff
		}
		if hdr[0] == 'C' {
			i.done = true
			continue
		}
		i.data = payload
	}
	n := copy(p, i.data)
	i.data = i.data[n:]
	return n, nil
}

// staging is the temporary file an operation is filling, removed if the operation is
// cancelled (the agent sends SIGTERM, then SIGKILL after a grace).
var staging struct {
	sync.Mutex
	path string
}

func stage(path string) {
	staging.Lock()
	staging.path = path
	staging.Unlock()
}

func cleanUpOnTerm() {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() {
		<-term
		// A rename racing this removal leaves the target whole either way (old or new).
		staging.Lock()
		if staging.path != "" {
			_ = os.Remove(staging.path)
		}
		os.Exit(128 + int(syscall.SIGTERM))
	}()
}

// Main runs one operation, read from fd 4, with stdin and stdout; its exit status is the
// process's.
func Main() int {
	cleanUpOnTerm()
	request, err := io.ReadAll(io.LimitReader(os.NewFile(4, "request"), maxRequest))
	if err != nil {
		return 127
	}
	run(request, os.Stdin, os.Stdout, allOps)
	return 0
}

// maxRequest bounds an operation's JSON.
const maxRequest = 1 << 20

// serverOps are the operations a file server performs: the short ones every tool call
// makes. An archive (download, upload) or a fetch may run for minutes, and would hold up
// the calls behind it: each still gets a helper of its own.
var serverOps = map[string]handler{
	"read":      typed(opRead),
	"read_text": typed(opReadText),
	"write":     typed(opWrite),
	"stat":      typed(opStat),
	"list":      typed(opList),
	"remove":    typed(opRemove),
	"move":      typed(opMove),
}

// allOps are what a helper of its own performs: the server's, and the long ones.
var allOps = func() map[string]handler {
	ops := map[string]handler{
		"download": typed(opDownload),
		"upload":   typed(opUpload),
		"fetch":    typed(opFetch),
	}
	for name, op := range serverOps {
		ops[name] = op
	}
	return ops
}()

// run performs one operation (JSON) with ops, reading its data from input and writing its
// frames to output, and always ends them with 'R' or 'E'.
func run(request []byte, input io.Reader, output io.Writer, ops map[string]handler) {
	runWith(&out{w: bufio.NewWriterSize(output, bufferSize), input: bufio.NewReaderSize(input, bufferSize)}, request, ops)
}

// bufferSize is the size of an operation's output and input buffers.
const bufferSize = 256 << 10

// runWith is run with the buffers of o, already set to the operation's output and input.
func runWith(o *out, request []byte, ops map[string]handler) {
	defer o.w.Flush()
	var object map[string]json.RawMessage // anything but an object is refused as it always was
	if err := json.Unmarshal(request, &object); err != nil {
		o.sendJSON('E', opErr("invalid", "the file operation is not JSON"))
		return
	}
	var h head
	_ = decode(request, &h)
	op, ok := ops[h.Op]
	if !ok {
		o.sendJSON('E', opErr("invalid", "unknown file operation %q", h.Op))
		return
	}
	result, err := op(request, o)
	if err != nil {
		o.sendJSON('E', fromOS(err, h.Path))
		return
	}
	o.sendJSON('R', result)
}
