//go:build linux

// Command sandboxd-agent is the in-container agent of a sandboxd workspace.
//
//	sandboxd-agent [serve]   the container's main process: serves the daemon (PROTOCOL.md)
//	sandboxd-agent bridge    stdin/stdout to the agent's socket (what the daemon execs)
//	sandboxd-agent version   prints the version
//
// "spawn" and "fileop" are the agent's own helpers, started by it.
package main

import (
	"fmt"
	"os"

	"sandboxd/agent/internal/agent"
	"sandboxd/agent/internal/fileops"
	"sandboxd/agent/internal/spawn"
)

var version = "dev"

func main() {
	mode := "serve"
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	switch mode {
	case "serve":
		agent.Version = version
		self, err := os.Executable()
		if err != nil {
			self = "/proc/self/exe"
		}
		if err := agent.New(self).Serve(); err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd-agent:", err)
			os.Exit(1)
		}
	case "spawn":
		spawn.Child()
	case "fileop":
		os.Exit(fileops.Main())
	case "bridge":
		if err := agent.Bridge(); err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd-agent:", err)
			os.Exit(1)
		}
	case "version":
		fmt.Println(version)
	default:
		fmt.Fprintf(os.Stderr, "sandboxd-agent: unknown mode %q (serve, bridge, version)\n", mode)
		os.Exit(2)
	}
}
