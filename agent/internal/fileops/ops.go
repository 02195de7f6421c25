package fileops

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// openRegular opens path for reading, refusing directories and special files. It opens
// non-blocking first, so a FIFO cannot hang the call before it is refused.
func openRegular(path string) (*os.File, os.FileInfo, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fromOS(err, path)
	}
	f := os.NewFile(uintptr(fd), path)
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fromOS(err, path)
	}
	if info.IsDir() {
		f.Close()
		return nil, nil, &OpError{Code: "is_directory", Errno: int(syscall.EISDIR), Message: path + " is a directory"}
	}
	if !info.Mode().IsRegular() {
		f.Close()
		return nil, nil, opErr("invalid", "%s is not a regular file", path)
	}
	_ = syscall.SetNonblock(fd, false)
	return f, info, nil
}

// readLimit is how much to read: the size when opened (a file that keeps growing cannot
// hold the call), or up to cap for files that report no size (/proc).
func readLimit(info os.FileInfo, cap int64) int64 {
	if info.Size() > 0 {
		return info.Size()
	}
	return cap
}

func opRead(req map[string]any, o *out) (any, error) {
	path := str(req, "path")
	maxBytes := num(req, "max_bytes")
	f, info, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if info.Size() > maxBytes {
		return nil, opErr("too_large", "%s is %d bytes; the limit is %d", path, info.Size(), maxBytes)
	}
	digest := sha256.New()
	var total int64
	remaining := readLimit(info, maxBytes+1)
	buf := make([]byte, chunk)
	for remaining > 0 {
		want := int64(len(buf))
		if want > remaining {
			want = remaining
		}
		n, err := f.Read(buf[:want])
		remaining -= int64(n)
		if n > 0 {
			total += int64(n)
			if total > maxBytes {
				return nil, opErr("too_large", "%s grew past the %d-byte limit while being read", path, maxBytes)
			}
			digest.Write(buf[:n])
			o.send('D', buf[:n])
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fromOS(err, path)
		}
	}
	return map[string]any{"size": total, "sha256": hex.EncodeToString(digest.Sum(nil)), "mode": int(info.Mode().Perm() | setBits(info))}, nil
}

func setBits(info os.FileInfo) os.FileMode {
	var bits os.FileMode
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		bits = os.FileMode(st.Mode & 0o7000)
	}
	return bits
}

// utf8Chars counts the characters of b decoded as UTF-8 with invalid bytes as U+FFFD,
// continuing from the undecoded tail of the previous piece (carried in, returned out).
func utf8Chars(carry, b []byte, final bool) (int, []byte) {
	data := append(carry, b...)
	count := 0
	for len(data) > 0 {
		if !final && !utf8.FullRune(data) {
			break // may finish in the next piece
		}
		_, size := utf8.DecodeRune(data)
		data = data[size:]
		count++
	}
	return count, append([]byte(nil), data...)
}

// opReadText scans a file once: counts its lines, looks for NUL, keeps the lines of one page.
func opReadText(req map[string]any, o *out) (any, error) {
	path := str(req, "path")
	first, limit, keep := num(req, "offset"), num(req, "limit"), int(num(req, "keep_bytes"))
	last := first + limit - 1
	f, info, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type line struct {
		chars int
		kept  []byte
	}
	var lines []line
	var current, carry []byte
	chars, lineNo := 0, int64(1)
	endsCR := false
	var size int64
	var lastByte byte
	remaining := readLimit(info, procFileCap)
	buf := make([]byte, 1<<20)
	inPage := func() bool { return first <= lineNo && lineNo <= last }
	for remaining > 0 {
		want := int64(len(buf))
		if want > remaining {
			want = remaining
		}
		n, err := f.Read(buf[:want])
		if n == 0 && err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fromOS(err, path)
		}
		data := buf[:n]
		remaining -= int64(n)
		size += int64(n)
		lastByte = data[n-1]
		if bytes.IndexByte(data, 0) >= 0 {
			return nil, opErr("binary", "%s contains NUL bytes", path)
		}
		start := 0
		for {
			end := bytes.IndexByte(data[start:], '\n')
			var piece []byte
			if end < 0 {
				piece = data[start:]
			} else {
				piece = data[start : start+end]
			}
			if inPage() {
				if len(current) < keep {
					room := keep - len(current)
					if room > len(piece) {
						room = len(piece)
					}
					current = append(current, piece[:room]...)
				}
				var c int
				c, carry = utf8Chars(carry, piece, false)
				chars += c
				if len(piece) > 0 {
					endsCR = piece[len(piece)-1] == '\r'
				}
			}
			if end < 0 {
				break
			}
			if inPage() {
				c, _ := utf8Chars(carry, nil, true)
				chars += c
				carry = nil
				if endsCR {
					chars-- // a CR before the newline is a line ending, not shown and not counted
				}
				lines = append(lines, line{chars: chars, kept: current})
				current, chars, endsCR = nil, 0, false
			}
			lineNo++
			start += end + 1
		}
	}
	total := lineNo - 1
	if size > 0 && lastByte != '\n' {
		total++
		if inPage() {
			c, _ := utf8Chars(carry, nil, true)
			lines = append(lines, line{chars: chars + c, kept: current})
		}
	}
	for _, l := range lines {
		record := make([]byte, 8+len(l.kept))
		binary.BigEndian.PutUint64(record, uint64(l.chars))
		copy(record[8:], l.kept)
		o.send('L', record)
	}
	return map[string]any{"total_lines": total, "size": size}, nil
}

func sha256Of(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	digest := sha256.New()
	if _, err := io.Copy(digest, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(digest.Sum(nil)), nil
}

func statOrNil(path string) (os.FileInfo, error) {
	info, err := os.Stat(path)
	if err == nil {
		return info, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return nil, fromOS(err, path)
}

func checkTarget(info os.FileInfo, path, target string) error {
	if info == nil {
		return nil
	}
	if info.IsDir() {
		return &OpError{Code: "is_directory", Errno: int(syscall.EISDIR), Message: path + " is a directory"}
	}
	if !info.Mode().IsRegular() {
		return opErr("invalid", "%s is not a regular file", path)
	}
	if syscall.Access(target, 2) != nil {
		return &OpError{Code: "permission", Errno: int(syscall.EACCES), Message: path + ": Permission denied"}
	}
	return nil
}

// lockDir takes an flock on a directory: writers through file operations (EditFile's
// compare-and-swap among them) take turns, whatever name or link they reached the file by.
func lockDir(dir string) func() {
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return func() {} // an unreadable directory cannot be locked; the write still happens
	}
	_ = syscall.Flock(fd, syscall.LOCK_EX)
	return func() { syscall.Close(fd) }
}

func umask() os.FileMode {
	old := syscall.Umask(0)
	syscall.Umask(old)
	return os.FileMode(old)
}

// opWrite writes stdin's bytes to path: atomically (temporary file and rename) where the
// directory allows it. The data is received in full before the file is touched, so a
// cancelled call changes nothing; the compare-and-swap check (expect_sha256) and the
// commit happen together under a lock on the directory.
func opWrite(req map[string]any, o *out) (any, error) {
	path := str(req, "path")
	if strings.HasSuffix(path, "/") {
		return nil, &OpError{Code: "is_directory", Errno: int(syscall.EISDIR), Message: path + " names a directory, not a file"}
	}
	target := path
	if link, err := os.Lstat(path); err == nil && link.Mode()&os.ModeSymlink != 0 {
		if resolved, err := filepath.EvalSymlinks(path); err == nil {
			target = resolved
		} else if dest, err := os.Readlink(path); err == nil {
			// A dangling link: its target is created, as the shell's `>` would.
			if !filepath.IsAbs(dest) {
				dest = filepath.Join(filepath.Dir(path), dest)
			}
			target = dest
		}
	}
	parent := filepath.Dir(target)
	if flag(req, "mkdirs") {
		if err := os.MkdirAll(parent, 0o777); err != nil {
			var errno syscall.Errno
			if errors.As(err, &errno) && (errno == syscall.ENOTDIR || errno == syscall.EEXIST) {
				return nil, &OpError{Code: "not_directory", Errno: int(syscall.ENOTDIR), Message: path + ": a parent of this path is not a directory"}
			}
			return nil, fromOS(err, parent)
		}
	}
	info, err := statOrNil(target)
	if err != nil {
		return nil, err
	}
	if err := checkTarget(info, path, target); err != nil {
		return nil, err
	}
	source := &in{r: o.input}
	atomic := syscall.Access(parent, 2|1) == nil && (info == nil || ownerOf(info) == uint32(os.Getuid()))
	var spool *os.File
	staged := ""
	if atomic {
		// ".NAME.XXXXXXXX.tmp" beside the target, cut to fit NAME_MAX whatever NAME is.
		stem := filepath.Base(target)
		if len(stem) > 200 {
			stem = strings.ToValidUTF8(stem[:200], "")
		}
		spool, err = os.CreateTemp(parent, "."+stem+".*.tmp")
		if err != nil {
			return nil, fromOS(err, parent)
		}
		staged = spool.Name()
		stage(staged)
	} else {
		// The directory is not ours to create files in, but the file is writable: it is
		// written in place, as the shell's `>` would; the data waits in a spool until then.
		spool, err = os.CreateTemp("", ".sandboxd-spool-*")
		if err != nil {
			spool, err = os.CreateTemp(parent, ".sandboxd-spool-*")
		}
		if err != nil {
			return nil, fromOS(err, parent)
		}
		_ = os.Remove(spool.Name())
	}
	defer func() {
		spool.Close()
		if staged != "" {
			_ = os.Remove(staged)
			stage("")
		}
	}()
	size, err := io.Copy(spool, source)
	if err != nil {
		return nil, fromOS(err, path)
	}
	unlock := lockDir(parent)
	defer unlock()
	info, err = statOrNil(target)
	if err != nil {
		return nil, err
	}
	if err := checkTarget(info, path, target); err != nil {
		return nil, err
	}
	if expect, ok := req["expect_sha256"].(string); ok {
		current := "absent"
		if info != nil {
			if current, err = sha256Of(target); err != nil {
				return nil, fromOS(err, path)
			}
		}
		if current != expect {
			return nil, opErr("conflict", "%s changed since it was read", path)
		}
	}
	oldSize := int64(-1)
	if info != nil {
		oldSize = info.Size()
		if oldSize <= num(req, "return_old_max") {
			if old, err := os.Open(target); err == nil {
				w := &dataWriter{o: o}
				_, _ = io.Copy(w, old)
				w.flush()
				old.Close()
			}
		}
	}
	if staged != "" {
		if err := spool.Sync(); err != nil {
			return nil, fromOS(err, path)
		}
		mode := 0o666 &^ umask()
		if info != nil {
			mode = info.Mode().Perm() | setBits(info)
		}
		if err := spool.Chmod(mode); err != nil {
			return nil, fromOS(err, path)
		}
		if err := os.Rename(staged, target); err != nil {
			return nil, fromOS(err, path)
		}
		staged = ""
		if dir, err := os.Open(parent); err == nil {
			_ = dir.Sync()
			dir.Close()
		}
	} else {
		flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
		dst, err := os.OpenFile(target, flags, 0o666)
		if err != nil {
			return nil, fromOS(err, path)
		}
		if _, err := spool.Seek(0, io.SeekStart); err == nil {
			_, err = io.Copy(dst, spool)
		}
		if err == nil {
			err = dst.Sync()
		}
		if cerr := dst.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fromOS(err, path)
		}
	}
	if info != nil {
		bumpMtime(target, info)
	}
	return map[string]any{"created": info == nil, "size": size, "old_size": oldSize, "atomic": atomic}, nil
}

func ownerOf(info os.FileInfo) uint32 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return ^uint32(0)
}

// bumpMtime makes a rewrite move the modification time to a later whole second:
// timestamp caches (Python's .pyc) compare whole seconds and size, and would keep
// serving old code after a same-size edit within the second. Best effort.
func bumpMtime(path string, old os.FileInfo) {
	now, err := os.Stat(path)
	if err != nil || now.ModTime().Unix() > old.ModTime().Unix() {
		return
	}
	later := time.Unix(old.ModTime().Unix()+1, 0)
	atime := later
	if st, ok := now.Sys().(*syscall.Stat_t); ok {
		atime = time.Unix(st.Atim.Sec, st.Atim.Nsec)
	}
	_ = os.Chtimes(path, atime, later)
}

func fileType(mode os.FileMode) string {
	switch {
	case mode&os.ModeSymlink != 0:
		return "symlink"
	case mode.IsDir():
		return "directory"
	case mode.IsRegular():
		return "file"
	}
	return "other"
}

func describe(path, name string, follow bool) (map[string]any, error) {
	var info os.FileInfo
	var err error
	if follow {
		info, err = os.Stat(path)
	} else {
		info, err = os.Lstat(path)
	}
	if err != nil {
		return nil, err
	}
	if name == "" {
		name = filepath.Base(strings.TrimRight(path, "/"))
		if name == "." || name == "/" || name == "" {
			name = "/"
		}
	}
	entry := map[string]any{
		"name":   name,
		"path":   path,
		"type":   fileType(info.Mode()),
		"size":   info.Size(),
		"mode":   int(info.Mode().Perm() | setBits(info)),
		"mtime":  float64(info.ModTime().UnixNano()) / 1e9,
		"target": "",
	}
	if info.Mode()&os.ModeSymlink != 0 {
		if target, err := os.Readlink(path); err == nil {
			entry["target"] = target
		}
	}
	return entry, nil
}

func opStat(req map[string]any, _ *out) (any, error) {
	entry, err := describe(str(req, "path"), "", flag(req, "follow"))
	if err != nil {
		return nil, fromOS(err, str(req, "path"))
	}
	return entry, nil
}

func opList(req map[string]any, o *out) (any, error) {
	path := str(req, "path")
	dir, err := os.Open(path)
	if err != nil {
		return nil, fromOS(err, path)
	}
	names, err := dir.Readdirnames(-1)
	dir.Close()
	if err != nil {
		return nil, fromOS(err, path)
	}
	sort.Strings(names)
	w := &dataWriter{o: o}
	count := 0
	for _, name := range names {
		entry, err := describe(filepath.Join(path, name), name, false)
		if err != nil {
			continue // removed while listing
		}
		line, _ := json.Marshal(entry)
		_, _ = w.Write(append(line, '\n')) // one per line, in data frames
		count++
	}
	w.flush()
	return map[string]any{"count": count}, nil
}

func opRemove(req map[string]any, _ *out) (any, error) {
	path := str(req, "path")
	info, err := os.Lstat(path)
	if err != nil {
		return nil, fromOS(err, path)
	}
	if info.IsDir() {
		// The daemon refuses "/" by name; this is "/" reached another way ("/proc/self/root/",
		// a link to it with a slash after). Emptying it would end the workspace.
		if root, rootErr := os.Stat("/"); rootErr == nil && os.SameFile(info, root) {
			return nil, &OpError{Code: "invalid", Message: "refusing to remove " + path + ": it is the workspace's root directory"}
		}
		if flag(req, "recursive") {
			err = os.RemoveAll(path)
		} else {
			err = syscall.Rmdir(path)
		}
	} else {
		err = syscall.Unlink(path)
	}
	if err != nil {
		failed := path
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			err, failed = pathErr.Err, pathErr.Path
		}
		e := fromOS(err, failed)
		if errors.Is(err, syscall.EBUSY) {
			e.Message += " (a mount point cannot be removed)"
		}
		return nil, e
	}
	return map[string]any{}, nil
}

func opMove(req map[string]any, _ *out) (any, error) {
	source, destination := str(req, "source"), str(req, "destination")
	if !flag(req, "overwrite") {
		if _, err := os.Lstat(destination); err == nil {
			return nil, &OpError{Code: "exists", Errno: int(syscall.EEXIST), Message: destination + " already exists"}
		}
	}
	err := syscall.Rename(source, destination)
	if errors.Is(err, syscall.EXDEV) {
		// Another filesystem (say /workspace to /tmp): copy, then remove, as mv does.
		if err = copyTree(source, destination); err == nil {
			err = os.RemoveAll(source)
		}
	}
	if err != nil {
		if errors.Is(err, syscall.EINVAL) {
			return nil, &OpError{Code: "invalid", Errno: int(syscall.EINVAL), Message: "cannot move " + source + " into itself (" + destination + ")"}
		}
		return nil, fromOS(err, source)
	}
	return map[string]any{}, nil
}

// copyTree copies a file, link or directory tree, keeping links as links and modes.
func copyTree(source, destination string) error {
	info, err := os.Lstat(source)
	if err != nil {
		return err
	}
	switch {
	case info.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(source)
		if err != nil {
			return err
		}
		return os.Symlink(target, destination)
	case info.IsDir():
		if err := os.Mkdir(destination, info.Mode().Perm()|0o700); err != nil {
			return err
		}
		entries, err := os.ReadDir(source)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := copyTree(filepath.Join(source, e.Name()), filepath.Join(destination, e.Name())); err != nil {
				return err
			}
		}
		return os.Chmod(destination, info.Mode().Perm())
	case info.Mode().IsRegular():
		src, err := os.Open(source)
		if err != nil {
			return err
		}
		defer src.Close()
		dst, err := os.OpenFile(destination, os.O_WRONLY|os.O_CREATE|os.O_EXCL, info.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(dst, src); err != nil {
			dst.Close()
			return err
		}
		if err := dst.Close(); err != nil {
			return err
		}
		return os.Chtimes(destination, info.ModTime(), info.ModTime())
	}
	return nil // devices and fifos are not copied
}
