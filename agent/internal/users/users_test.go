package users

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFiles(t *testing.T, root, passwd, group string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/group"), []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResolveSeesAnEditOfPasswdAtOnce(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, "sandbox:x:1000:1000::/home/sandbox:/bin/bash\n", "sandbox:x:1000:\ndocker:x:999:sandbox\n")
	u, err := Resolve("sandbox", root)
	if err != nil || u.UID != 1000 || u.Home != "/home/sandbox" || len(u.Groups) != 2 || u.Groups[1] != 999 {
		t.Fatalf("first: %+v %v", u, err)
	}
	u.Groups[0] = 7 // the caller's copy: the cache must not see it
	again, _ := Resolve("sandbox", root)
	if again.Groups[0] != 1000 {
		t.Fatalf("a caller's change reached the cache: %+v", again)
	}
	// Same size, so only the times and the inode tell the edit (a rename makes a new inode).
	edited := filepath.Join(root, "etc/passwd.new")
	if err := os.WriteFile(edited, []byte("sandbox:x:1001:1000::/home/sandbox:/bin/bash\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(edited, filepath.Join(root, "etc/passwd")); err != nil {
		t.Fatal(err)
	}
	u, err = Resolve("sandbox", root)
	if err != nil || u.UID != 1001 {
		t.Fatalf("after the edit: %+v %v", u, err)
	}
	if _, err := Resolve("nobody-here", root); err == nil {
		t.Fatal("an unknown user resolved")
	}
	writeFiles(t, root, "sandbox:x:1001:1000::/home/sandbox:/bin/bash\nnobody-here:x:5:5::/:/bin/sh\n", "sandbox:x:1000:\n")
	if u, err := Resolve("nobody-here", root); err != nil || u.UID != 5 {
		t.Fatalf("a user added after a miss: %+v %v", u, err)
	}
}

func TestNamesOfUidsAndGidsAsLsSaysThem(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(root+"/etc", 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nalias:x:1000:1000::/x:/bin/sh\n"
	group := "root:x:0:\nuser:x:1000:\n"
	if err := os.WriteFile(root+"/etc/passwd", []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(root+"/etc/group", []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
	names := NamesOf(root)
	if got := []string{names.User(0), names.User(1000), names.User(4242), names.Group(1000), names.Group(7)}; strings.Join(got, " ") != "root user 4242 user 7" {
		t.Fatalf("names %v", got)
	}
	if err := os.WriteFile(root+"/etc/group", []byte("root:x:0:\ncrew:x:1000:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := NamesOf(root).Group(1000); got != "crew" {
		t.Fatalf("a changed /etc/group is read again: %s", got)
	}
}
