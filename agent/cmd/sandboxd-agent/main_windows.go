//go:build windows

// Command sandboxd-agent on Windows: sandboxd creates only Linux workspaces today; this
// build carries the Windows Ctrl-C fallback (a tree kill) so that it stays compiled.
package main

import (
	"fmt"
	"os"
	"strconv"

	"sandboxd/agent/internal/treekill"
)

var version = "dev"

func main() {
	if len(os.Args) == 3 && os.Args[1] == "killtree" {
		pid, err := strconv.Atoi(os.Args[2])
		if err == nil {
			err = treekill.Kill(pid)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd-agent:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) == 2 && os.Args[1] == "version" {
		fmt.Println(version)
		return
	}
	fmt.Fprintln(os.Stderr, "sandboxd-agent: on Windows only `killtree PID` and `version` are served")
	os.Exit(2)
}
