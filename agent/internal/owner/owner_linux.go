// Package owner gives the directories a workspace is made with (its /workspace, its working
// directory) to the user its commands run as, whatever the image says.
//
// The engine makes a missing mount point or working directory as root, mode 0755, while
// commands run as the image's USER or the spec's user: without this, an image with USER 1000
// and no /workspace could not write to its own workspace.
package owner

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Never are the trees no directory is given away in: the kernel's, and the agent's own
// (its socket directory and its binary's mount), whatever a spec names as its working
// directory.
var Never = []string{"/proc", "/sys", "/dev", "/run/sandboxd", "/.sandboxd"}

// Result says what Own did with one directory.
type Result struct {
	Path    string
	Created []string // the directories it made, outermost first
	Given   bool     // the directory itself was root's, empty and closed to others: now it is the user's
	Left    string   // why the directory itself was left as it was, when it was
}

// Own makes dir exist, as the engine makes a working directory (each missing directory
// root's, mode 0755), and gives it to the user uid:gid when it is root's, empty and writable
// by no one else: what the engine or Own made for a mount point or a working directory the
// image lacks. A directory with content, one owned by anyone but root, or one others may
// write to (/tmp) is the image's and is left as it is. The directories above dir are left as
// whatever made them made them, so that a working directory reads the same whether the
// engine made it at the container's start or Own at a warm pool member's claim.
//
// dir must be absolute and clean. The walk opens each component with O_NOFOLLOW and changes
// ownership through the open descriptor, so a symbolic link anywhere on the path is refused
// (ELOOP or ENOTDIR), never followed.
func Own(dir string, uid, gid int) (Result, error) {
	res := Result{Path: dir}
	if !strings.HasPrefix(dir, "/") || strings.Contains(dir, "\x00") {
		return res, fmt.Errorf("%q is not an absolute path", dir)
	}
	if filepath.Clean(dir) != dir {
		// "//dev/x" is /dev/x to the kernel, not to the prefix check below.
		return res, fmt.Errorf("%q is not a clean path", dir)
	}
	for _, never := range Never {
		if dir == never || strings.HasPrefix(dir, never+"/") {
			res.Left = "it is under " + never
			return res, nil
		}
	}
	fd, err := syscall.Open("/", syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return res, err
	}
	parts := strings.FieldsFunc(dir, func(r rune) bool { return r == '/' })
	for i, name := range parts {
		if name == "." || name == ".." {
			syscall.Close(fd)
			return res, fmt.Errorf("%q is not a clean path", dir)
		}
		at := "/" + strings.Join(parts[:i+1], "/")
		created := false
		next, err := openDir(fd, name)
		if errors.Is(err, syscall.ENOENT) {
			if err = syscall.Mkdirat(fd, name, 0o755); err != nil && !errors.Is(err, syscall.EEXIST) {
				syscall.Close(fd)
				return res, fmt.Errorf("%s: %w", at, err)
			}
			created = err == nil
			next, err = openDir(fd, name)
		}
		syscall.Close(fd)
		if err != nil {
			return res, fmt.Errorf("%s: %w", at, err)
		}
		fd = next
		if created {
			res.Created = append(res.Created, at)
		}
	}
	defer syscall.Close(fd)
	res.Left, err = leave(fd, uid, gid)
	if err != nil || res.Left != "" {
		return res, err
	}
	if err := syscall.Fchown(fd, uid, gid); err != nil {
		return res, fmt.Errorf("%s: %w", dir, err)
	}
	res.Given = true
	return res, nil
}

// leave says why the open directory fd is not to be given away ("" when it is).
func leave(fd, uid, gid int) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return "", err
	}
	switch {
	case int(st.Uid) == uid && int(st.Gid) == gid:
		return "it is the user's already", nil
	case st.Uid != 0:
		return fmt.Sprintf("it belongs to uid %d", st.Uid), nil
	case st.Mode&0o022 != 0:
		return "others may write to it", nil
	}
	empty, err := isEmpty(fd)
	if err != nil {
		return "", err
	}
	if !empty {
		return "it has content", nil
	}
	return "", nil
}

func openDir(at int, name string) (int, error) {
	return syscall.Openat(at, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
}

// isEmpty reads one entry of the directory open at fd, through a duplicate so fd's offset
// stays where it was.
func isEmpty(fd int) (bool, error) {
	dup, err := syscall.Dup(fd)
	if err != nil {
		return false, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	names, err := f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return len(names) == 0, err
}
