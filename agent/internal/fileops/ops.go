package fileops

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"sandboxd/agent/internal/users"
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

func opRead(req ReadRequest, o *out) (ReadResult, error) {
	path, maxBytes := req.Path, int64(req.MaxBytes)
	f, info, err := openRegular(path)
	if err != nil {
		return ReadResult{}, err
	}
	defer f.Close()
	if info.Size() > maxBytes {
		return ReadResult{}, opErr("too_large", "%s is %d bytes; the limit is %d", path, info.Size(), maxBytes)
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
				return ReadResult{}, opErr("too_large", "%s grew past the %d-byte limit while being read", path, maxBytes)
			}
			digest.Write(buf[:n])
			o.send('D', buf[:n])
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return ReadResult{}, fromOS(err, path)
		}
	}
	return ReadResult{Size: total, Sha256: hex.EncodeToString(digest.Sum(nil)), Mode: int(info.Mode().Perm() | setBits(info))}, nil
}

func setBits(info os.FileInfo) os.FileMode {
	var bits os.FileMode
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		bits = os.FileMode(st.Mode & 0o7000)
	}
	return bits
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

func describe(path, name string, follow bool, owners users.Names) (Entry, error) {
	var info os.FileInfo
	var err error
	if follow {
		info, err = os.Stat(path)
	} else {
		info, err = os.Lstat(path)
	}
	if err != nil {
		return Entry{}, err
	}
	if name == "" {
		name = filepath.Base(strings.TrimRight(path, "/"))
		if name == "." || name == "/" || name == "" {
			name = "/"
		}
	}
	entry := Entry{
		Name:  name,
		Path:  path,
		Type:  fileType(info.Mode()),
		Size:  info.Size(),
		Mode:  int(info.Mode().Perm() | setBits(info)),
		Mtime: float64(info.ModTime().UnixNano()) / 1e9,
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		entry.Owner, entry.Group = owners.User(st.Uid), owners.Group(st.Gid)
	}
	if info.Mode()&os.ModeSymlink != 0 {
		if target, err := os.Readlink(path); err == nil {
			entry.Target = target
		}
	}
	return entry, nil
}

func opStat(req StatRequest, _ *out) (Entry, error) {
	entry, err := describe(req.Path, "", req.Follow, users.NamesOf(""))
	if err != nil {
		return Entry{}, fromOS(err, req.Path)
	}
	return entry, nil
}

func opList(req ListRequest, o *out) (ListResult, error) {
	path := req.Path
	dir, err := os.Open(path)
	if err != nil {
		return ListResult{}, fromOS(err, path)
	}
	names, err := dir.Readdirnames(-1)
	dir.Close()
	if err != nil {
		return ListResult{}, fromOS(err, path)
	}
	sort.Strings(names)
	w := &dataWriter{o: o}
	count := 0
	owners := users.NamesOf("")
	for _, name := range names {
		entry, err := describe(filepath.Join(path, name), name, false, owners)
		if err != nil {
			continue // removed while listing
		}
		line, _ := json.Marshal(entry)
		_, _ = w.Write(append(line, '\n')) // one per line, in data frames
		count++
	}
	w.flush()
	return ListResult{Count: count}, nil
}

func opRemove(req RemoveRequest, _ *out) (RemoveResult, error) {
	path := req.Path
	info, err := os.Lstat(path)
	if err != nil {
		return RemoveResult{}, fromOS(err, path)
	}
	if info.IsDir() {
		// The daemon refuses "/" by name; this is "/" reached another way ("/proc/self/root/",
		// a link to it with a slash after). Emptying it would end the workspace.
		if root, rootErr := os.Stat("/"); rootErr == nil && os.SameFile(info, root) {
			return RemoveResult{}, &OpError{Code: "invalid", Message: "refusing to remove " + path + ": it is the workspace's root directory"}
		}
		if req.Recursive {
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
		return RemoveResult{}, e
	}
	return RemoveResult{}, nil
}

func opMove(req MoveRequest, _ *out) (MoveResult, error) {
	source, destination := req.Source, req.Destination
	if !req.Overwrite {
		if _, err := os.Lstat(destination); err == nil {
			return MoveResult{}, &OpError{Code: "exists", Errno: int(syscall.EEXIST), Message: destination + " already exists"}
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
			return MoveResult{}, &OpError{Code: "invalid", Errno: int(syscall.EINVAL), Message: "cannot move " + source + " into itself (" + destination + ")"}
		}
		return MoveResult{}, fromOS(err, source)
	}
	return MoveResult{}, nil
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
