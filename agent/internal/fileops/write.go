package fileops

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

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
		return denied(path)
	}
	return nil
}

// writableTarget is the target's current state (nil when there is none), refused when it
// is no regular file the user may write.
func writableTarget(path, target string) (os.FileInfo, error) {
	info, err := statOrNil(target)
	if err != nil {
		return nil, err
	}
	if err := checkTarget(info, path, target); err != nil {
		return nil, err
	}
	return info, nil
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

// writeTarget is the file a write to path changes: a symlink's target, or for a dangling
// link the path it names (created, as the shell's `>` would).
func writeTarget(path string) string {
	link, err := os.Lstat(path)
	if err != nil || link.Mode()&os.ModeSymlink == 0 {
		return path
	}
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		return resolved
	}
	if dest, err := os.Readlink(path); err == nil {
		if !filepath.IsAbs(dest) {
			dest = filepath.Join(filepath.Dir(path), dest)
		}
		return dest
	}
	return path
}

// makeParents creates the directory parent (the target's) and its missing parents.
func makeParents(path, parent string) error {
	err := os.MkdirAll(parent, 0o777)
	if err == nil {
		return nil
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && (errno == syscall.ENOTDIR || errno == syscall.EEXIST) {
		return &OpError{Code: "not_directory", Errno: int(syscall.ENOTDIR), Message: path + ": a parent of this path is not a directory"}
	}
	return fromOS(err, parent)
}

// spool holds a write's data until it is committed: a temporary file beside the target
// (staged, renamed over it), or for an in-place write an unnamed one anywhere.
type spool struct {
	file   *os.File
	staged string // the temporary file's path, "" once renamed (or when in place)
}

func openSpool(parent, target string, atomic bool) (*spool, error) {
	if !atomic {
		// The directory is not ours to create files in, but the file is writable: it is
		// written in place, as the shell's `>` would; the data waits in a spool until then.
		file, err := os.CreateTemp("", ".sandboxd-spool-*")
		if err != nil {
			file, err = os.CreateTemp(parent, ".sandboxd-spool-*")
		}
		if err != nil {
			return nil, fromOS(err, parent)
		}
		_ = os.Remove(file.Name())
		return &spool{file: file}, nil
	}
	// ".NAME.XXXXXXXX.tmp" beside the target, cut to fit NAME_MAX whatever NAME is.
	stem := filepath.Base(target)
	if len(stem) > 200 {
		stem = strings.ToValidUTF8(stem[:200], "")
	}
	file, err := os.CreateTemp(parent, "."+stem+".*.tmp")
	if err != nil {
		return nil, fromOS(err, parent)
	}
	stage(file.Name())
	return &spool{file: file, staged: file.Name()}, nil
}

// close lets the spool go, removing a staged file that was not committed.
func (s *spool) close() {
	s.file.Close()
	if s.staged != "" {
		_ = os.Remove(s.staged)
		stage("")
	}
}

// commit puts the spooled data in place of target (whose state before is info, nil when
// there was none); errors name path.
func (s *spool) commit(path, target string, info os.FileInfo) error {
	if s.staged == "" {
		return s.copyInto(path, target)
	}
	if err := s.file.Sync(); err != nil {
		return fromOS(err, path)
	}
	mode := 0o666 &^ umask()
	if info != nil {
		mode = info.Mode().Perm() | setBits(info)
	}
	if err := s.file.Chmod(mode); err != nil {
		return fromOS(err, path)
	}
	if err := os.Rename(s.staged, target); err != nil {
		return fromOS(err, path)
	}
	s.staged = ""
	if dir, err := os.Open(filepath.Dir(target)); err == nil {
		_ = dir.Sync()
		dir.Close()
	}
	return nil
}

// copyInto writes the spooled data over target in place (truncating it).
func (s *spool) copyInto(path, target string) error {
	dst, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return fromOS(err, path)
	}
	_, err = s.file.Seek(0, io.SeekStart)
	if err == nil {
		_, err = io.Copy(dst, s.file)
	}
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fromOS(err, path)
	}
	return nil
}

// checkExpected is the compare-and-swap check: target (state info) must still have the
// digest expected, "absent" when there should be no file.
func checkExpected(expect *string, info os.FileInfo, path, target string) error {
	if expect == nil {
		return nil
	}
	current := "absent"
	if info != nil {
		var err error
		if current, err = sha256Of(target); err != nil {
			return fromOS(err, path)
		}
	}
	if current != *expect {
		return opErr("conflict", "%s changed since it was read", path)
	}
	return nil
}

// sendFile sends a file's content as 'D' frames, best effort.
func sendFile(o *out, path string) {
	if old, err := os.Open(path); err == nil {
		w := &dataWriter{o: o}
		_, _ = io.Copy(w, old)
		w.flush()
		old.Close()
	}
}

// opWrite writes stdin's bytes to path: atomically (temporary file and rename) where the
// directory allows it. The data is received in full before the file is touched, so a
// cancelled call changes nothing; the compare-and-swap check (expect_sha256) and the
// commit happen together under a lock on the directory.
func opWrite(req WriteRequest, o *out) (WriteResult, error) {
	path := req.Path
	if strings.HasSuffix(path, "/") {
		return WriteResult{}, &OpError{Code: "is_directory", Errno: int(syscall.EISDIR), Message: path + " names a directory, not a file"}
	}
	target := writeTarget(path)
	parent := filepath.Dir(target)
	if req.Mkdirs {
		if err := makeParents(path, parent); err != nil {
			return WriteResult{}, err
		}
	}
	info, err := writableTarget(path, target)
	if err != nil {
		return WriteResult{}, err
	}
	atomic := syscall.Access(parent, 2|1) == nil && (info == nil || ownerOf(info) == uint32(os.Getuid()))
	data, err := openSpool(parent, target, atomic)
	if err != nil {
		return WriteResult{}, err
	}
	defer data.close()
	size, err := io.Copy(data.file, &in{r: o.input})
	if err != nil {
		return WriteResult{}, fromOS(err, path)
	}
	unlock := lockDir(parent)
	defer unlock()
	if info, err = writableTarget(path, target); err != nil {
		return WriteResult{}, err
	}
	if err := checkExpected(req.ExpectSha256, info, path, target); err != nil {
		return WriteResult{}, err
	}
	oldSize := int64(-1)
	if info != nil {
		oldSize = info.Size()
		if oldSize <= int64(req.ReturnOldMax) {
			sendFile(o, target)
		}
	}
	if err := data.commit(path, target, info); err != nil {
		return WriteResult{}, err
	}
	if info != nil {
		bumpMtime(target, info)
	}
	return WriteResult{Created: info == nil, Size: size, OldSize: oldSize, Atomic: atomic}, nil
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
