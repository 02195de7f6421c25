package fileops

import (
	"encoding/json"
	"errors"
	"fmt"
)

// The contract of each operation: the request the daemon sends (the JSON on fd 4, "op"
// naming the operation) and the result it gets back in the 'R' frame. agent/PROTOCOL.md
// lists the same fields; the daemon's sandboxd/fileops.py mirrors them.
//
// Result fields are declared in alphabetical order: results used to be maps, which
// encoding/json writes with sorted keys, and the bytes on the wire stay as they were.

// ReadRequest asks for a regular file's bytes, sent as 'D' frames.
type ReadRequest struct {
	Path     string `json:"path"`
	MaxBytes number `json:"max_bytes"` // larger files are refused with too_large
}

// ReadResult describes what read sent.
type ReadResult struct {
	Mode   int    `json:"mode"`   // permission and set-id bits
	Sha256 string `json:"sha256"` // of the bytes sent, hex
	Size   int64  `json:"size"`   // bytes sent
}

// ReadTextRequest asks for one page of a text file's lines, sent as 'L' frames.
type ReadTextRequest struct {
	Path      string `json:"path"`
	Offset    number `json:"offset"`     // first line of the page, 1-based
	Limit     number `json:"limit"`      // lines in the page
	KeepBytes number `json:"keep_bytes"` // bytes kept of each line's start
}

// ReadTextResult counts the whole file.
type ReadTextResult struct {
	Size       int64 `json:"size"`        // bytes read
	TotalLines int64 `json:"total_lines"` // a last line without a newline counts
}

// WriteRequest writes stdin's bytes to a file.
type WriteRequest struct {
	Path         string  `json:"path"`
	Mkdirs       bool    `json:"mkdirs"`                  // create missing parents
	ReturnOldMax number  `json:"return_old_max"`          // send the old content ('D') if it is at most this many bytes
	ExpectSha256 *string `json:"expect_sha256,omitempty"` // compare-and-swap: the old content's digest, or "absent"
}

// WriteResult describes the write.
type WriteResult struct {
	Atomic  bool  `json:"atomic"`   // a temporary file was renamed over the target
	Created bool  `json:"created"`  // there was no file before
	OldSize int64 `json:"old_size"` // bytes before, -1 when created
	Size    int64 `json:"size"`     // bytes written
}

// StatRequest describes one path.
type StatRequest struct {
	Path   string `json:"path"`
	Follow bool   `json:"follow"` // describe a final symlink's target instead
}

// Entry describes one path: stat's result, and each line of list's data.
type Entry struct {
	Group  string  `json:"group"`  // the group's name in the image, else its gid
	Mode   int     `json:"mode"`   // permission and set-id bits
	Mtime  float64 `json:"mtime"`  // modification time, seconds since the epoch
	Name   string  `json:"name"`   // last component ("/" for the root)
	Owner  string  `json:"owner"`  // the owner's name in the image, else its uid
	Path   string  `json:"path"`   // as asked (list: joined to the directory)
	Size   int64   `json:"size"`   // bytes
	Target string  `json:"target"` // a symlink's target, else ""
	Type   string  `json:"type"`   // file, directory, symlink or other
}

// ListRequest lists a directory: one Entry as JSON per line, in 'D' frames, sorted by name.
type ListRequest struct {
	Path string `json:"path"`
}

// ListResult counts the entries sent.
type ListResult struct {
	Count int `json:"count"`
}

// RemoveRequest deletes a file, a link or a directory.
type RemoveRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"` // a directory and everything in it
}

// RemoveResult is empty: removed.
type RemoveResult struct{}

// MoveRequest renames a path (copying across filesystems).
type MoveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	Overwrite   bool   `json:"overwrite"` // replace an existing destination
}

// MoveResult is empty: moved.
type MoveResult struct{}

// DownloadRequest asks for a tar of a file or tree, sent as 'D' frames.
type DownloadRequest struct {
	Path   string `json:"path"`
	Follow bool   `json:"follow"` // archive a final symlink's target instead
}

// DownloadResult is empty: the archive is complete.
type DownloadResult struct{}

// UploadRequest extracts a tar stream from stdin into a directory (created when missing).
type UploadRequest struct {
	Path string `json:"path"`
}

// UploadResult counts what was extracted.
type UploadResult struct {
	Entries int   `json:"entries"` // members extracted (devices and FIFOs are not)
	Size    int64 `json:"size"`    // bytes of regular files written
}

// FetchRequest GETs an http(s) URL; the body is sent as 'D' frames.
type FetchRequest struct {
	URL      string  `json:"url"`
	MaxBytes number  `json:"max_bytes"` // a larger body is refused with too_large
	TimeoutS float64 `json:"timeout_s"` // the whole request, in seconds; 30 when not above 0
}

// FetchResult describes the body sent.
type FetchResult struct {
	ContentType string `json:"content_type"` // the response's Content-Type header
	Size        int64  `json:"size"`         // bytes sent
}

// number is an integer field that also reads a JSON string of digits (and a fraction,
// truncated), and reads anything else as 0, as the operations always have.
type number int64

func (n *number) UnmarshalJSON(body []byte) error {
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return err
	}
	*n = 0
	switch v := v.(type) {
	case float64:
		*n = number(v)
	case string:
		var parsed int64
		_, _ = fmt.Sscan(v, &parsed)
		*n = number(parsed)
	}
	return nil
}

// head is what every request has: the operation's name, and the path its errors name.
type head struct {
	Op   string `json:"op"`
	Path string `json:"path"`
}

// decode reads a request into v. A field of the wrong type reads as its zero value, as
// fields always have (encoding/json fills the rest and reports the first such field).
func decode(request []byte, v any) error {
	err := json.Unmarshal(request, v)
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return nil
	}
	return err
}

// handler performs one operation from its request's JSON and returns its result.
type handler func(request []byte, o *out) (any, error)

// typed makes a handler of an operation that takes Req and gives Res.
func typed[Req, Res any](op func(Req, *out) (Res, error)) handler {
	return func(request []byte, o *out) (any, error) {
		var req Req
		if err := decode(request, &req); err != nil {
			return nil, opErr("invalid", "the file operation is not JSON")
		}
		return op(req, o)
	}
}
