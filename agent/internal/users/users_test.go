package users

import (
	"os"
	"path/filepath"
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
