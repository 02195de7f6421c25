//go:build linux

package owner

import (
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
)

const uid, gid = 4321, 4322

func ownerOf(t *testing.T, path string) [2]uint32 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return [2]uint32{st.Uid, st.Gid}
}

func rootOnly(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("changing a directory's owner needs root")
	}
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	return base
}

func TestAMissingDirectoryIsMadeAsTheEngineMakesItAndGiven(t *testing.T) {
	base := rootOnly(t)
	dir := filepath.Join(base, "a", "b")
	res, err := Own(dir, uid, gid)
	if err != nil || !res.Given {
		t.Fatalf("%+v %v", res, err)
	}
	if want := []string{base + "/a", dir}; !reflect.DeepEqual(res.Created, want) {
		t.Fatalf("created %v, want %v", res.Created, want)
	}
	for p, want := range map[string][2]uint32{dir: {uid, gid}, base + "/a": {0, 0}, base: {0, 0}} {
		if got := ownerOf(t, p); got != want {
			t.Fatalf("%s belongs to %v, want %v", p, got, want)
		}
		if info, err := os.Stat(p); err != nil || info.Mode().Perm() != 0o755 {
			t.Fatalf("%s: %v %v", p, info.Mode(), err)
		}
	}
}

func TestTheEnginesEmptyRootDirectoryIsGiven(t *testing.T) {
	base := rootOnly(t)
	res, err := Own(base, uid, gid)
	if err != nil || !res.Given || res.Left != "" {
		t.Fatalf("%+v %v", res, err)
	}
	if got := ownerOf(t, base); got != [2]uint32{uid, gid} {
		t.Fatalf("belongs to %v", got)
	}
}

func TestTheImagesDirectoriesAreLeft(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(dir string) error
		left  string
		owner [2]uint32
	}{
		{"content", func(dir string) error { return os.WriteFile(dir+"/x", nil, 0o644) }, "it has content", [2]uint32{0, 0}},
		{"another user's", func(dir string) error { return os.Chown(dir, 2000, 2000) }, "it belongs to uid 2000", [2]uint32{2000, 2000}},
		{"open to all", func(dir string) error { return os.Chmod(dir, 0o1777) }, "others may write to it", [2]uint32{0, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := rootOnly(t)
			if err := c.setup(dir); err != nil {
				t.Fatal(err)
			}
			res, err := Own(dir, uid, gid)
			if err != nil || res.Given || res.Left != c.left {
				t.Fatalf("%+v %v, want left for %q", res, err, c.left)
			}
			if got := ownerOf(t, dir); got != c.owner {
				t.Fatalf("belongs to %v, want %v", got, c.owner)
			}
		})
	}
}

func TestASymlinkOnThePathIsNeverFollowed(t *testing.T) {
	base := rootOnly(t)
	target := filepath.Join(base, "target")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, base+"/link"); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{base + "/link", base + "/link/new"} {
		if res, err := Own(dir, uid, gid); err == nil {
			t.Fatalf("%s: followed the link: %+v", dir, res)
		}
	}
	if got := ownerOf(t, target); got != [2]uint32{0, 0} {
		t.Fatalf("the link's target was given away: %v", got)
	}
	if _, err := os.Stat(target + "/new"); !os.IsNotExist(err) {
		t.Fatalf("a directory was made through the link: %v", err)
	}
}

func TestTheAgentsAndKernelsTreesAreNeverGiven(t *testing.T) {
	for _, dir := range []string{"/proc", "/proc/self", "/run/sandboxd", "/.sandboxd/x", "/dev/shm"} {
		res, err := Own(dir, uid, gid)
		if err != nil || res.Given || len(res.Created) > 0 || res.Left == "" {
			t.Fatalf("%s: %+v %v", dir, res, err)
		}
	}
	if _, err := Own("relative/dir", uid, gid); err == nil {
		t.Fatal("a relative path was taken")
	}
	for _, dir := range []string{"/a/../b", "//dev/x", "/dev//x", "/workspace/"} {
		if _, err := Own(dir, uid, gid); err == nil {
			t.Fatalf("%q, not a clean path, was taken", dir)
		}
	}
}
