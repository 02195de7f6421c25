//go:build linux

package session

import (
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"sandboxd/agent/internal/creds"
)

// spill is a copy of the output in a file of the user's, started once it passes after bytes.
type spill struct {
	mu     sync.Mutex
	path   string
	after  int64
	size   int64
	head   [][]byte
	file   *os.File
	broken bool
	user   creds.User
}

func newSpill(path string, after int64, u creds.User) *spill {
	return &spill{path: path, after: after, broken: path == "" || after <= 0, user: u}
}

func (sp *spill) feed(data []byte) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.broken {
		return
	}
	sp.size += int64(len(data))
	if sp.file == nil {
		sp.head = append(sp.head, append([]byte(nil), data...))
		if sp.size <= sp.after {
			return
		}
		// Created with the user's rights, so that it is the user's file in the user's directory.
		err := creds.As(sp.user, func() error {
			if err := os.MkdirAll(filepath.Dir(sp.path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(sp.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o644)
			sp.file = f
			return err
		})
		if err != nil {
			sp.broken, sp.head = true, nil
			return
		}
		for _, chunk := range sp.head {
			if _, err := sp.file.Write(chunk); err != nil {
				sp.broken = true
				break
			}
		}
		sp.head = nil
		return
	}
	if _, err := sp.file.Write(data); err != nil {
		sp.broken = true
	}
}

func (sp *spill) close() string {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.file == nil {
		return ""
	}
	if err := sp.file.Close(); err != nil {
		sp.broken = true
	}
	if sp.broken {
		return ""
	}
	return sp.path
}
