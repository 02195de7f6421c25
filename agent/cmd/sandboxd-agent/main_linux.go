//go:build linux

// Command sandboxd-agent is the in-container agent of a sandboxd workspace.
//
//	sandboxd-agent [serve [--own USER DIR...]]
//	                         the container's main process: serves the daemon (PROTOCOL.md),
//	                         once each DIR is made and given to USER as "own" does
//	sandboxd-agent own USER DIR...  makes each DIR and gives USER what it made, and each DIR
//	                         the engine made for it (internal/owner); the image's are left
//	sandboxd-agent bridge    stdin/stdout to the agent's socket (what the daemon execs)
//	sandboxd-agent hold      reads stdin to its end: a daemon's lease on its instance label
//	sandboxd-agent install PATH  copies itself to PATH, mode 0755 (a Kubernetes init container's step)
//	sandboxd-agent version   prints the version
//
// "spawn" is the agent's own helper, started by it for every command and file operation.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"

	"sandboxd/agent/internal/agent"
	"sandboxd/agent/internal/fileops"
	"sandboxd/agent/internal/owner"
	"sandboxd/agent/internal/spawn"
	"sandboxd/agent/internal/users"
)

var version = "dev"

func init() {
	// main runs on the main thread alone, the thread-group leader, whose credentials decide
	// who may open /proc/<agent>: no goroutine that switches credentials ever runs there.
	runtime.LockOSThread()
}

func main() {
	mode := "serve"
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	switch mode {
	case "serve":
		if len(os.Args) > 3 && os.Args[2] == "--own" {
			// Not fatal: a directory that cannot be made shows in the first call that needs it.
			_ = own(os.Args[3], os.Args[4:])
		}
		agent.Version = version
		// Output passes through in short-lived buffers: collecting less often costs a little
		// memory (counted in the workspace's limit) and saves much of a stream's CPU.
		debug.SetGCPercent(400)
		self, err := os.Executable()
		if err != nil {
			self = "/proc/self/exe"
		}
		if err := agent.New(self).Serve(); err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd-agent:", err)
			os.Exit(1)
		}
	case "spawn":
		spawn.Child(fileops.Helpers)
	case "bridge":
		if err := agent.Bridge(); err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd-agent:", err)
			os.Exit(1)
		}
	case "hold":
		// A daemon's lease on its instance label: the container lives while the daemon holds
		// its stdin open, and ends when the daemon goes, however it goes (kill -9 included).
		_, _ = io.Copy(io.Discard, os.Stdin)
	case "install":
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "sandboxd-agent: install takes one path")
			os.Exit(2)
		}
		if err := install(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd-agent:", err)
			os.Exit(1)
		}
	case "own":
		if len(os.Args) < 4 {
			fmt.Fprintln(os.Stderr, "sandboxd-agent: own takes a user and at least one directory")
			os.Exit(2)
		}
		if err := own(os.Args[2], os.Args[3:]); err != nil {
			os.Exit(1)
		}
	case "version":
		fmt.Println(version)
	default:
		fmt.Fprintf(os.Stderr, "sandboxd-agent: unknown mode %q (serve, own, bridge, hold, install, version)\n", mode)
		os.Exit(2)
	}
}

// own resolves spec as a command's user is resolved and gives it each of dirs (owner.Own).
// What it could not do is printed, and the first such error returned.
func own(spec string, dirs []string) error {
	u, err := users.Resolve(spec, "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd-agent: own:", err)
		return err
	}
	var first error
	for _, dir := range dirs {
		if _, err := owner.Own(dir, int(u.UID), int(u.GID)); err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd-agent: own:", err)
			if first == nil {
				first = err
			}
		}
	}
	return first
}

// install copies the running binary to dest, whole or not at all: it is written beside dest
// and renamed over it, so a Pod whose init container is cut short never runs half an agent.
func install(dest string) error {
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer self.Close()
	out, err := os.CreateTemp(filepath.Dir(dest), ".sandboxd-agent-*")
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			_ = os.Remove(out.Name())
		}
	}()
	if _, err := io.Copy(out, self); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(0o755); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Rename(out.Name(), dest); err != nil {
		return err
	}
	done = true
	return nil
}
