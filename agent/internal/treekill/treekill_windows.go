//go:build windows

// Package treekill is Ctrl-C for Windows: console signals cannot reach a process whose
// stdio are pipes, so interrupting a command ends its whole process tree instead.
package treekill

import (
	"fmt"
	"os/exec"
	"strconv"
)

// Command is the tree kill of pid: taskkill /T /F /PID pid.
func Command(pid int) []string {
	return []string{"taskkill", "/T", "/F", "/PID", strconv.Itoa(pid)}
}

// Kill ends pid and every process it started.
func Kill(pid int) error {
	argv := Command(pid)
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %w: %s", argv, err, out)
	}
	return nil
}
