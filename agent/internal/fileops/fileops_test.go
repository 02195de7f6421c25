package fileops

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// reply is what one operation wrote: its 'D' bytes, its 'L' lines, and its last frame.
type reply struct {
	data  []byte
	lines []pageLine
	kind  byte   // 'R' or 'E'
	last  []byte // the result's or error's JSON
}

// input frames data as the daemon does: 'I' frames, then 'C' unless cut.
func input(data []byte, cut bool) []byte {
	var b bytes.Buffer
	frame := func(kind byte, payload []byte) {
		var hdr [5]byte
		hdr[0] = kind
		binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
		b.Write(hdr[:])
		b.Write(payload)
	}
	if len(data) > 0 {
		frame('I', data)
	}
	if !cut {
		frame('C', nil)
	}
	return b.Bytes()
}

// do runs one operation with allOps and reads back its frames.
func do(t *testing.T, request string, stdin []byte) reply {
	t.Helper()
	var output bytes.Buffer
	run([]byte(request), bytes.NewReader(stdin), &output, allOps)
	var r reply
	b := output.Bytes()
	for len(b) > 0 {
		if len(b) < 5 {
			t.Fatalf("a frame header cut short: %q", b)
		}
		kind, size := b[0], binary.BigEndian.Uint32(b[1:5])
		payload := b[5 : 5+size]
		b = b[5+size:]
		if r.kind != 0 {
			t.Fatalf("a %q frame after the last one", kind)
		}
		switch kind {
		case 'D':
			r.data = append(r.data, payload...)
		case 'L':
			r.lines = append(r.lines, pageLine{chars: int(binary.BigEndian.Uint64(payload)), kept: payload[8:]})
		case 'R', 'E':
			r.kind, r.last = kind, payload
		default:
			t.Fatalf("a frame of kind %q", kind)
		}
	}
	if r.kind == 0 {
		t.Fatalf("no result or error for %s", request)
	}
	return r
}

func request(op string, fields map[string]any) string {
	fields["op"] = op
	body, _ := json.Marshal(fields)
	return string(body)
}

func ok(t *testing.T, r reply) string {
	t.Helper()
	if r.kind != 'R' {
		t.Fatalf("want a result, got the error %s", r.last)
	}
	return string(r.last)
}

func failed(t *testing.T, r reply, code string) OpError {
	t.Helper()
	var e OpError
	if r.kind != 'E' || json.Unmarshal(r.last, &e) != nil {
		t.Fatalf("want an error, got %c %s", r.kind, r.last)
	}
	if e.Code != code {
		t.Fatalf("want code %s, got %+v", code, e)
	}
	return e
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestRequests(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a")
	writeFile(t, path, "abc")
	tests := []struct {
		name, request, code, message string
	}{
		{"not JSON", "{", "invalid", "the file operation is not JSON"},
		{"not an object", `["read"]`, "invalid", "the file operation is not JSON"},
		{"unknown op", `{"op": "chmod"}`, "invalid", `unknown file operation "chmod"`},
		{"no op", `{"path": "/"}`, "invalid", `unknown file operation ""`},
		{"a limit as a string of digits", `{"op": "read", "path": "` + path + `", "max_bytes": "2"}`, "too_large", path + " is 3 bytes; the limit is 2"},
		{"a limit of the wrong type reads as 0", `{"op": "read", "path": "` + path + `", "max_bytes": true}`, "too_large", path + " is 3 bytes; the limit is 0"},
		{"errors name the path", `{"op": "stat", "path": "` + dir + `/none"}`, "not_found", dir + "/none: No such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := failed(t, do(t, tt.request, nil), tt.code)
			if e.Message != tt.message {
				t.Fatalf("message %q, want %q", e.Message, tt.message)
			}
		})
	}
}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a")
	content := strings.Repeat("x", chunk+10)
	writeFile(t, path, content)
	r := do(t, request("read", map[string]any{"path": path, "max_bytes": 1 << 20}), nil)
	// The bytes on the wire, keys in order, exactly as the daemon has always read them.
	want := `{"mode":420,"sha256":"` + digest(content) + `","size":65546}`
	if got := ok(t, r); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	if string(r.data) != content {
		t.Fatal("the data differs from the file")
	}
	failed(t, do(t, request("read", map[string]any{"path": dir, "max_bytes": 10}), nil), "is_directory")
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A FIFO is refused at once, never opened for a read that would wait for a writer.
	failed(t, do(t, request("read", map[string]any{"path": filepath.Join(dir, "fifo"), "max_bytes": 10}), nil), "invalid")
}

func TestReadText(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.txt")
	writeFile(t, path, "one\r\ntwo\nthré\n"+strings.Repeat("é", 10)+"\nlast")
	tests := []struct {
		name          string
		offset, limit int
		keep          int
		want          []pageLine
	}{
		{"all", 1, 10, 100, []pageLine{{3, []byte("one\r")}, {3, []byte("two")}, {4, []byte("thré")}, {10, []byte(strings.Repeat("é", 10))}, {4, []byte("last")}}},
		{"a page", 2, 2, 100, []pageLine{{3, []byte("two")}, {4, []byte("thré")}}},
		{"lines cut to their first bytes, counted whole", 4, 1, 3, []pageLine{{10, []byte("é\xc3")}}},
		{"past the end", 9, 5, 100, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, request("read_text", map[string]any{"path": path, "offset": tt.offset, "limit": tt.limit, "keep_bytes": tt.keep}), nil)
			if got := ok(t, r); got != `{"size":40,"total_lines":5}` {
				t.Fatalf("result %s", got)
			}
			if len(r.lines) != len(tt.want) {
				t.Fatalf("lines %q, want %q", r.lines, tt.want)
			}
			for i := range tt.want {
				if r.lines[i].chars != tt.want[i].chars || !bytes.Equal(r.lines[i].kept, tt.want[i].kept) {
					t.Fatalf("line %d is %d %q, want %d %q", i, r.lines[i].chars, r.lines[i].kept, tt.want[i].chars, tt.want[i].kept)
				}
			}
		})
	}
	writeFile(t, path, "text\x00more")
	failed(t, do(t, request("read_text", map[string]any{"path": path, "offset": 1, "limit": 1}), nil), "binary")
	writeFile(t, path, "")
	if got := ok(t, do(t, request("read_text", map[string]any{"path": path, "offset": 1, "limit": 1}), nil)); got != `{"size":0,"total_lines":0}` {
		t.Fatalf("an empty file: %s", got)
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "new", "a")
	write := func(fields map[string]any, data string) reply {
		fields["path"] = path
		return do(t, request("write", fields), input([]byte(data), false))
	}
	if got := ok(t, write(map[string]any{"mkdirs": true}, "first")); got != `{"atomic":true,"created":true,"old_size":-1,"size":5}` {
		t.Fatalf("created: %s", got)
	}
	r := write(map[string]any{"return_old_max": 100, "expect_sha256": digest("first")}, "second!")
	if got := ok(t, r); got != `{"atomic":true,"created":false,"old_size":5,"size":7}` || string(r.data) != "first" {
		t.Fatalf("overwritten: %s, old content %q", got, r.data)
	}
	if readFile(t, path) != "second!" {
		t.Fatal("not written")
	}
	// Compare-and-swap: a stale digest, or "absent" for a file that exists, changes nothing.
	failed(t, write(map[string]any{"expect_sha256": digest("first")}, "third"), "conflict")
	failed(t, write(map[string]any{"expect_sha256": "absent"}, "third"), "conflict")
	// The old content is sent only when small enough.
	if r := write(map[string]any{"return_old_max": 3}, "fourth"); len(r.data) != 0 {
		t.Fatalf("old content sent over the limit: %q", r.data)
	}
	// A stream cut off before its end writes nothing.
	failed(t, do(t, request("write", map[string]any{"path": path}), input([]byte("partial"), true)), "aborted")
	if readFile(t, path) != "fourth" {
		t.Fatal("a cut-off write changed the file")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("a staging file was left behind: %v", entries)
	}
}

func TestWriteRefusals(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "file"), "x")
	tests := []struct {
		name, path string
		mkdirs     bool
		code       string
	}{
		{"a trailing slash", dir + "/b/", false, "is_directory"},
		{"a directory", dir, false, "is_directory"},
		{"a parent that is a file", dir + "/file/b", true, "not_directory"},
		{"a missing parent", dir + "/none/b", false, "not_found"},
		{"a device", "/dev/null", false, "invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			failed(t, do(t, request("write", map[string]any{"path": tt.path, "mkdirs": tt.mkdirs}), input([]byte("y"), false)), tt.code)
		})
	}
}

func TestWriteThroughSymlinks(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	writeFile(t, target, "old")
	link := filepath.Join(dir, "link")
	if err := os.Symlink("target", link); err != nil {
		t.Fatal(err)
	}
	ok(t, do(t, request("write", map[string]any{"path": link}), input([]byte("new"), false)))
	if info, err := os.Lstat(link); err != nil || info.Mode()&os.ModeSymlink == 0 {
		t.Fatal("the link was replaced, not followed")
	}
	if readFile(t, target) != "new" {
		t.Fatal("the link's target was not written")
	}
	// A dangling link: its target is created, as the shell's `>` would.
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink("made", dangling); err != nil {
		t.Fatal(err)
	}
	ok(t, do(t, request("write", map[string]any{"path": dangling}), input([]byte("made"), false)))
	if readFile(t, filepath.Join(dir, "made")) != "made" {
		t.Fatal("a dangling link's target was not created")
	}
	// A link to a device is refused: a write is of regular files only.
	full := filepath.Join(dir, "full")
	if err := os.Symlink("/dev/full", full); err != nil {
		t.Fatal(err)
	}
	failed(t, do(t, request("write", map[string]any{"path": full}), input([]byte("x"), false)), "invalid")
}

func TestWriteErrorsAreCoded(t *testing.T) {
	// /dev/full fails every write with ENOSPC: the code the daemon reports as a full disk.
	f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full here")
	}
	defer f.Close()
	_, err = f.Write([]byte("x"))
	e := fromOS(err, "/dev/full")
	if e.Code != "no_space" || e.Errno != int(syscall.ENOSPC) || e.Message != "/dev/full: No space left on device" {
		t.Fatalf("got %+v", e)
	}
	// An OpError passes through unchanged; an error without an errno is io.
	if fromOS(errCutOff, "x") != errCutOff {
		t.Fatal("an OpError was rewrapped")
	}
	if e := fromOS(errors.New("odd"), "p"); e.Code != "io" || e.Message != "p: odd" {
		t.Fatalf("got %+v", e)
	}
}

func TestInPlaceWriteReportsAFailedCopy(t *testing.T) {
	// A file size limit makes the copy into the target fail part way (EFBIG): the write
	// must say so, not report success over a cut file.
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	writeFile(t, target, "old")
	spooled, err := os.CreateTemp(dir, "spool")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spooled.WriteString(strings.Repeat("x", 8192)); err != nil {
		t.Fatal(err)
	}
	data := &spool{file: spooled}
	defer data.close()
	signal.Ignore(syscall.SIGXFSZ)
	defer signal.Reset(syscall.SIGXFSZ)
	var limit syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &limit); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: 4096, Max: limit.Max}); err != nil {
		t.Fatal(err)
	}
	err = data.commit(target, target, nil)
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &limit); err != nil {
		t.Fatal(err)
	}
	var op *OpError
	if !errors.As(err, &op) || op.Errno != int(syscall.EFBIG) {
		t.Fatalf("want EFBIG, got %v", err)
	}
}

func TestStatAndList(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "b"), "12345")
	if err := os.Symlink("b", filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "c"), 0o755); err != nil {
		t.Fatal(err)
	}
	var entry map[string]any
	_ = json.Unmarshal([]byte(ok(t, do(t, request("stat", map[string]any{"path": dir + "/a"}), nil))), &entry)
	if entry["type"] != "symlink" || entry["target"] != "b" || entry["name"] != "a" {
		t.Fatalf("a link: %v", entry)
	}
	_ = json.Unmarshal([]byte(ok(t, do(t, request("stat", map[string]any{"path": dir + "/a", "follow": true}), nil))), &entry)
	if entry["type"] != "file" || entry["size"] != 5.0 || entry["target"] != "" {
		t.Fatalf("a followed link: %v", entry)
	}
	r := do(t, request("list", map[string]any{"path": dir}), nil)
	if got := ok(t, r); got != `{"count":3}` {
		t.Fatalf("result %s", got)
	}
	lines := strings.Split(strings.TrimSuffix(string(r.data), "\n"), "\n")
	var names []string
	for _, line := range lines {
		if !strings.HasPrefix(line, `{"group":`) || !strings.Contains(line, `,"mode":`) || !strings.Contains(line, `,"owner":`) {
			t.Fatalf("an entry's keys are out of order: %s", line)
		}
		var e Entry
		_ = json.Unmarshal([]byte(line), &e)
		if os.Getuid() == 0 && (e.Owner != "root" || e.Group != "root") {
			t.Fatalf("an entry made by root is %s:%s, not root:root", e.Owner, e.Group)
		}
		names = append(names, e.Name+":"+e.Type)
	}
	if strings.Join(names, " ") != "a:symlink b:file c:directory" {
		t.Fatalf("entries %v", names)
	}
	failed(t, do(t, request("list", map[string]any{"path": dir + "/b"}), nil), "not_directory")
}

func TestRemoveAndMove(t *testing.T) {
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(tree, "sub", "f"), "x")
	failed(t, do(t, request("remove", map[string]any{"path": tree}), nil), "not_empty")
	failed(t, do(t, request("move", map[string]any{"source": tree, "destination": tree + "/sub/in"}), nil), "invalid")
	writeFile(t, filepath.Join(dir, "other"), "y")
	failed(t, do(t, request("move", map[string]any{"source": dir + "/other", "destination": tree}), nil), "exists")
	if got := ok(t, do(t, request("move", map[string]any{"source": tree, "destination": dir + "/moved"}), nil)); got != "{}" {
		t.Fatalf("move: %s", got)
	}
	if got := ok(t, do(t, request("remove", map[string]any{"path": dir + "/moved", "recursive": true}), nil)); got != "{}" {
		t.Fatalf("remove: %s", got)
	}
	if _, err := os.Lstat(dir + "/moved"); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("not removed")
	}
}

func tarOf(t *testing.T, members ...tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for i := range members {
		h := members[i]
		body := ""
		if h.Typeflag == tar.TypeReg {
			body = "data of " + h.Name
			h.Size = int64(len(body))
		}
		if err := w.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(w, body)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestUploadAndDownload(t *testing.T) {
	dir := t.TempDir()
	archive := tarOf(t,
		tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o640},
		tar.Header{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "f"},
		tar.Header{Name: "d/h", Typeflag: tar.TypeLink, Linkname: "d/f"},
	)
	root := filepath.Join(dir, "up")
	r := do(t, request("upload", map[string]any{"path": root}), input(archive, false))
	if got := ok(t, r); got != `{"entries":4,"size":11}` {
		t.Fatalf("upload: %s", got)
	}
	if readFile(t, root+"/d/l") != "data of d/f" {
		t.Fatal("the link does not lead to the file")
	}
	r = do(t, request("download", map[string]any{"path": root + "/d/"}), nil)
	if got := ok(t, r); got != "{}" {
		t.Fatalf("download: %s", got)
	}
	var names []string
	reader := tar.NewReader(bytes.NewReader(r.data))
	for {
		h, err := reader.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, " ") != "d/ d/f d/h d/l" {
		t.Fatalf("members %v", names)
	}
}

func TestUploadRefusesEscapes(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "up")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dir, filepath.Join(root, "out")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		archive []byte
		message string
	}{
		{"a climbing name", tarOf(t, tar.Header{Name: "../x", Typeflag: tar.TypeReg, Mode: 0o644}), "unsafe path in archive: '../x'"},
		{"an absolute name", tarOf(t, tar.Header{Name: "/x", Typeflag: tar.TypeReg, Mode: 0o644}), "unsafe path in archive: '/x'"},
		{"a link already there", tarOf(t, tar.Header{Name: "out/x", Typeflag: tar.TypeReg, Mode: 0o644}), "unsafe path in archive: 'out/x' goes through a symlink"},
		{"a link from the archive", tarOf(t,
			tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"},
			tar.Header{Name: "l/x", Typeflag: tar.TypeReg, Mode: 0o644},
		), "unsafe path in archive: 'l/x' goes through a symlink"},
		{"a hard link out", tarOf(t, tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../secret"}), "unsafe path in archive: '../secret'"},
		{"not a tar", []byte(strings.Repeat("garbage!", 100)), "not a valid tar stream: archive/tar: invalid tar header"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := failed(t, do(t, request("upload", map[string]any{"path": root}), input(tt.archive, false)), "invalid")
			if e.Message != tt.message {
				t.Fatalf("message %q, want %q", e.Message, tt.message)
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(dir, "x")); err == nil {
		t.Fatal("a member was written outside the directory")
	}
}

func TestAnUploadCutShortLeavesNoHalfFile(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "up")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "f"), "as it was")
	archive := tarOf(t, tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644})
	for _, cut := range []struct {
		name  string
		stdin []byte
	}{
		{"the sender went away", input(archive[:520], true)},
		{"the stream ends inside the member", input(archive[:520], false)},
	} {
		r := do(t, request("upload", map[string]any{"path": root}), cut.stdin)
		if r.kind == 'R' {
			t.Fatalf("%s: the upload succeeded: %s", cut.name, r.last)
		}
		if got := readFile(t, filepath.Join(root, "f")); got != "as it was" {
			t.Fatalf("%s: the file is %q", cut.name, got)
		}
		entries, err := os.ReadDir(root)
		if err != nil || len(entries) != 1 {
			t.Fatalf("%s: %v left in the directory (%v)", cut.name, entries, err)
		}
	}
}
