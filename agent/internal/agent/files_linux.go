//go:build linux

package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"syscall"

	"sandboxd/agent/internal/proto"
	"sandboxd/agent/internal/users"
)

// fileWindow is the most file-operation output sent beyond the daemon's last ack.
const fileWindow = 256 << 10

// FileRequest opens a file operation: who runs it, and the operation itself, which the
// helper reads (see internal/fileops).
type FileRequest struct {
	User      string          `json:"user"`
	Operation json.RawMessage `json:"operation"`
}

// fileOp relays one file operation: the daemon's data to the helper's stdin, the
// helper's stdout to the daemon within a window, and the helper's exit.
type fileOp struct {
	channel uint32
	agent   *Agent
	stdin   *os.File
	pid     int

	mu     sync.Mutex
	sent   uint64
	acked  uint64
	room   *sync.Cond
	done   bool
	exited bool
}

func (a *Agent) dispatchFile(c *conn, f proto.Frame) {
	a.mu.Lock()
	op := a.files[f.Channel]
	_, taken := a.sessions[f.Channel]
	a.mu.Unlock()
	switch f.Kind {
	case proto.FileOp:
		if op != nil || taken {
			a.protocolError(c, f.Channel, "channel %d is in use", f.Channel)
			return
		}
		var req FileRequest
		if err := decode(f.Payload, &req); err != nil {
			a.protocolError(c, f.Channel, "file operation: %v", err)
			return
		}
		op = &fileOp{channel: f.Channel, agent: a}
		op.room = sync.NewCond(&op.mu)
		a.mu.Lock()
		a.files[f.Channel] = op
		a.mu.Unlock()
		if err := op.start(req); err != nil {
			a.finishFile(op, fmt.Sprintf("the file operation could not start: %v", err))
		}
		return
	}
	if op == nil {
		a.protocolError(c, f.Channel, "no file operation on channel %d", f.Channel)
		return
	}
	switch f.Kind {
	case proto.FileData:
		if _, err := op.stdin.Write(f.Payload); err != nil {
			op.stdin.Close() // the helper stopped reading (it failed early): its error follows
		}
	case proto.FileEnd:
		op.stdin.Close()
	case proto.FileAck:
		var msg proto.FileAckMsg
		if err := decode(f.Payload, &msg); err != nil {
			a.protocolError(c, f.Channel, "file ack: %v", err)
			return
		}
		op.mu.Lock()
		if msg.Ack > op.acked {
			op.acked = msg.Ack
		}
		op.room.Broadcast()
		op.mu.Unlock()
	}
}

// start runs the helper as the operation's user and relays its output.
func (op *fileOp) start(req FileRequest) error {
	u, err := users.Resolve(req.User, "")
	if err != nil {
		return err
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return err
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return err
	}
	groups := make([]uint32, len(u.Groups))
	copy(groups, u.Groups)
	attr := &os.ProcAttr{
		Dir:   "/",
		Env:   []string{"HOME=" + u.Home, "PATH=/usr/local/bin:/usr/bin:/bin"},
		Files: []*os.File{inR, outW, nil, reqR},
		Sys: &syscall.SysProcAttr{
			Setsid:     true,
			Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: groups},
		},
	}
	proc, err := os.StartProcess(op.agent.self, []string{"sandboxd-agent", "fileop"}, attr)
	inR.Close()
	outW.Close()
	reqR.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		reqW.Close()
		return err
	}
	status := op.agent.Expect(proc.Pid)
	op.stdin, op.pid = inW, proc.Pid
	_, _ = reqW.Write(req.Operation)
	reqW.Close()
	go op.relay(outR, status)
	return nil
}

func (op *fileOp) relay(out *os.File, status <-chan syscall.WaitStatus) {
	defer out.Close()
	chunk := make([]byte, 64<<10)
	for {
		n, err := out.Read(chunk)
		if n > 0 {
			op.mu.Lock()
			for op.sent-op.acked >= fileWindow && !op.done {
				op.room.Wait()
			}
			stop := op.done
			op.sent += uint64(n)
			op.mu.Unlock()
			if stop || !op.agent.Send(proto.FileOut, op.channel, chunk[:n]) {
				break // no daemon to tell: the operation is abandoned
			}
		}
		if err != nil {
			break
		}
	}
	ws := <-status
	op.mu.Lock()
	op.exited = true
	op.mu.Unlock()
	code := ws.ExitStatus()
	if ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	body, _ := json.Marshal(map[string]int{"exit_code": code})
	op.agent.Send(proto.Result, op.channel, body)
	op.agent.forgetFile(op)
}

func (a *Agent) finishFile(op *fileOp, message string) {
	body, _ := json.Marshal(proto.ErrorReply{Code: "io", Message: message})
	a.Send(proto.ErrorMsg, op.channel, body)
	a.forgetFile(op)
}

func (a *Agent) forgetFile(op *fileOp) {
	a.mu.Lock()
	if a.files[op.channel] == op {
		delete(a.files, op.channel)
	}
	a.mu.Unlock()
	op.mu.Lock()
	op.done = true
	exited := op.exited
	op.room.Broadcast()
	op.mu.Unlock()
	if op.stdin != nil {
		op.stdin.Close()
	}
	if !exited && op.pid > 0 {
		_ = syscall.Kill(op.pid, syscall.SIGKILL) // abandoned: it must not wait for data for ever
	}
}

// abandonFiles ends every file operation: their daemon is gone, a new one will not ask.
func (a *Agent) abandonFiles() {
	a.mu.Lock()
	ops := make([]*fileOp, 0, len(a.files))
	for _, op := range a.files {
		ops = append(ops, op)
	}
	a.mu.Unlock()
	for _, op := range ops {
		a.forgetFile(op)
	}
}
