//go:build linux

package agent

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestTheSocketsNameAppearsListening(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	if err := os.WriteFile(path, []byte("stale"), 0o600); err != nil { // a previous run's leftover
		t.Fatal(err)
	}
	listener, err := listenAtOnce(path)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	info, err := os.Lstat(path)
	if err != nil || info.Mode()&os.ModeSocket == 0 || info.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v", path, info.Mode(), err)
	}
	if _, err := os.Lstat(path + ".new"); !os.IsNotExist(err) {
		t.Fatalf("the name it listened under is left: %v", err)
	}
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the socket at its name does not take a connection: %v", err)
	}
	conn.Close()
	if _, err := listener.Accept(); err != nil {
		t.Fatal(err)
	}
	listener.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("closing removed the socket's name (a successor's): %v", err)
	}
}
