//go:build linux

// Package proctree finds every process a command started, and ends them all.
//
// A command's tree is every process in its session or process group, every
// descendant of its leader, and every process carrying its marker in the
// environment (SANDBOXD_PROCESS_ID=p-...): processes that called setsid and
// double-forked are orphans of the agent, their subreaper, but keep the marker.
package proctree

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"

	"sandboxd/agent/internal/creds"
)

type info struct {
	state           byte
	ppid, pgid, sid int
	start           uint64 // clock ticks after boot
}

func scan() map[int]info {
	table := map[int]info{}
	dir, err := os.Open("/proc")
	if err != nil {
		return table
	}
	defer dir.Close()
	names, _ := dir.Readdirnames(-1)
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
		end := bytes.LastIndexByte(data, ')')
		if end < 0 || end+2 >= len(data) {
			continue
		}
		p, ok := parse(data)
		if ok {
			table[pid] = p
		}
	}
	return table
}

// parse reads a /proc/PID/stat line: "pid (comm) state ppid pgrp session ... starttime ...";
// comm may hold spaces and parentheses.
func parse(data []byte) (info, bool) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 || end+2 >= len(data) {
		return info{}, false
	}
	fields := bytes.Fields(data[end+2:])
	if len(fields) < 20 {
		return info{}, false
	}
	ppid, _ := strconv.Atoi(string(fields[1]))
	pgid, _ := strconv.Atoi(string(fields[2]))
	sid, _ := strconv.Atoi(string(fields[3]))
	start, _ := strconv.ParseUint(string(fields[19]), 10, 64)
	return info{state: fields[0][0], ppid: ppid, pgid: pgid, sid: sid, start: start}, true
}

// Progress is process pid's state letter (R running or runnable, S sleeping...) and the CPU
// it has used, in clock ticks (user and system); ok is false once it is gone.
func Progress(pid int) (state byte, cpu uint64, ok bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	end := bytes.LastIndexByte(data, ')')
	if end < 0 || end+2 >= len(data) {
		return 0, 0, false
	}
	fields := bytes.Fields(data[end+2:])
	if len(fields) < 13 {
		return 0, 0, false
	}
	user, _ := strconv.ParseUint(string(fields[11]), 10, 64)
	system, _ := strconv.ParseUint(string(fields[12]), 10, 64)
	return fields[0][0], user + system, true
}

// StartTime is when process pid started, in clock ticks after boot; 0 if it is gone.
func StartTime(pid int) uint64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	p, _ := parse(data)
	return p.start
}

func hasMarker(env, marker []byte) bool {
	if len(env) == 0 {
		return false
	}
	needle := append(append([]byte{0}, marker...), 0)
	return bytes.Contains(append(append([]byte{0}, env...), 0), needle)
}

// Tree returns the live processes of the command whose session leader is leader, or
// that carry marker; never the agent itself or pid 1.
func Tree(leader int, marker []byte, u creds.User) []int {
	return TreeSince(leader, marker, u, 0)
}

// TreeSince is Tree for a command whose leader started at tick since (StartTime): a
// process that started before it cannot carry its marker, and its environment is not
// read (under gVisor, reading every process's is what an exit's report cost).
func TreeSince(leader int, marker []byte, u creds.User, since uint64) []int {
	table := scan()
	children := map[int][]int{}
	for pid, p := range table {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	found := map[int]bool{}
	if leader > 0 {
		stack := []int{leader}
		if _, alive := table[leader]; alive {
			found[leader] = true
		}
		for len(stack) > 0 {
			top := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for _, child := range children[top] {
				if !found[child] {
					found[child] = true
					stack = append(stack, child)
				}
			}
		}
	}
	self := os.Getpid()
	var out, unsure []int
	for pid, p := range table {
		if pid == self || pid == 1 || p.state == 'Z' {
			continue
		}
		if found[pid] || (leader > 0 && (p.pgid == leader || p.sid == leader)) {
			out = append(out, pid)
		} else if len(marker) > 0 && p.start >= since {
			unsure = append(unsure, pid)
		}
	}
	if len(unsure) > 0 {
		// Environments read with the user's rights: a process of the user's is readable to
		// the user (root without CAP_SYS_PTRACE could not), in one switch of credentials.
		_ = creds.As(u, func() error {
			for _, pid := range unsure {
				if env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ"); err == nil && hasMarker(env, marker) {
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

// SignalAll sends sig to every pid, ignoring those already gone.
func SignalAll(pids []int, sig syscall.Signal) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, sig)
	}
}

// HardKill stops and kills the tree until nothing of it is left (fork bombs included),
// for at most about a second; it reports whether the tree is gone.
func HardKill(leader int, marker []byte, u creds.User) bool {
	for i := 0; i < 200; i++ {
		pids := Tree(leader, marker, u)
		if len(pids) == 0 {
			return true
		}
		SignalAll(pids, syscall.SIGSTOP)
		SignalAll(pids, syscall.SIGKILL)
		time.Sleep(5 * time.Millisecond)
	}
	return len(Tree(leader, marker, u)) == 0
}
