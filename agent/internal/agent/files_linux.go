//go:build linux

package agent

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"sandboxd/agent/internal/fileops"
	"sandboxd/agent/internal/proto"
	"sandboxd/agent/internal/session"
	"sandboxd/agent/internal/spawn"
	"sandboxd/agent/internal/users"
)

// fileWindow is the most file-operation output sent beyond the daemon's last ack.
const fileWindow = 256 << 10

// fileInputWindow is the most file-operation input the agent holds for its helper; the
// daemon sends no more than this beyond the agent's last FileTook report.
const fileInputWindow = 1 << 20

// fileKillGrace is how long an abandoned helper has to clean up after SIGTERM.
const fileKillGrace = 500 * time.Millisecond

// tookStep is how much taken input makes a FileTook report worth a frame.
const tookStep = 256 << 10

// FileRequest opens a file operation: who runs it, and the operation itself, which the
// helper reads (see internal/fileops).
type FileRequest struct {
	User      string          `json:"user"`
	Operation json.RawMessage `json:"operation"`
}

// fileOp relays one file operation: the daemon's data to the helper's stdin (as the
// helper's 'I' and 'C' frames), the helper's stdout to the daemon within a window, and
// the helper's exit.
type fileOp struct {
	channel uint32
	agent   *Agent
	win     *window // its mutex guards the fields below

	stdin   *os.File
	pid     int
	server  *fileServer // the user's file server doing it, if one is
	exited  bool
	started bool
}

func (a *Agent) dispatchFile(c *conn, f proto.Frame) {
	a.mu.Lock()
	op := a.files[f.Channel]
	taken := a.channelInUse(f.Channel)
	a.mu.Unlock()
	if f.Kind == proto.FileOp {
		if taken {
			a.protocolError(c, f.Channel, "channel %d is in use", f.Channel)
			return
		}
		var req FileRequest
		if err := decode(f.Payload, &req); err != nil {
			a.protocolError(c, f.Channel, "file operation: %v", err)
			return
		}
		op = &fileOp{channel: f.Channel, agent: a, win: newWindow(fileWindow, fileInputWindow, tookStep)}
		a.mu.Lock()
		a.files[f.Channel] = op
		a.mu.Unlock()
		go op.run(req)
		return
	}
	if op == nil {
		a.protocolError(c, f.Channel, "no file operation on channel %d", f.Channel)
		return
	}
	switch f.Kind {
	case proto.FileData:
		if !op.win.push(f.Payload) {
			a.finishFile(op, "the daemon sent more file data than the agent's window")
		}
	case proto.FileEnd:
		op.win.end()
	case proto.FileAck:
		var msg proto.FileAckMsg
		if err := decode(f.Payload, &msg); err != nil {
			a.protocolError(c, f.Channel, "file ack: %v", err)
			return
		}
		op.win.ack(msg.Ack)
	}
}

// run has the operation done as its user: by the user's file server when it is one of the
// short operations and the server is idle, else by a helper of its own, started with no
// privileges left (the spawn helper drops them as for a command, then runs the operation
// itself, fileops.Main, rather than executing anything, so it is never dumpable). It
// relays input and output.
func (op *fileOp) run(req FileRequest) {
	u, err := users.Resolve(req.User, "")
	if err != nil {
		op.agent.finishFile(op, fmt.Sprintf("the file operation could not start: %v", err))
		return
	}
	if fileops.ServedByServer(req.Operation) {
		if s := op.agent.fileServerFor(u); s != nil && op.runIn(s, req) {
			return
		}
	}
	files, err := pipes(3)
	if err != nil {
		op.agent.finishFile(op, fmt.Sprintf("the file operation could not start: %v", err))
		return
	}
	inR, inW, outR, outW, reqR, reqW := files[0], files[1], files[2], files[3], files[4], files[5]
	request := spawn.Request{
		Run:         "fileop",
		Dir:         "/",
		UID:         u.UID,
		GID:         u.GID,
		Groups:      u.Groups,
		OOMScoreAdj: session.OOMScoreAdj,
	}
	proc, failure, err := op.agent.Spawn(request, [3]*os.File{inR, outW, nil}, []*os.File{reqR}, false)
	inR.Close()
	outW.Close()
	reqR.Close()
	if err == nil && failure != nil {
		err = fmt.Errorf("%s", failure.Message)
	}
	if err == nil {
		if failure := proc.Go(); failure != nil {
			err = fmt.Errorf("%s", failure.Message)
		}
	}
	if err != nil {
		inW.Close()
		outR.Close()
		reqW.Close()
		op.agent.finishFile(op, fmt.Sprintf("the file operation could not start: %v", err))
		return
	}
	status := op.agent.Expect(proc.PID)
	op.win.mu.Lock()
	op.stdin, op.pid, op.started = inW, proc.PID, true
	abandoned := op.win.done
	op.win.mu.Unlock()
	if abandoned {
		_ = syscall.Kill(proc.PID, syscall.SIGKILL)
	}
	_, _ = reqW.Write(req.Operation)
	reqW.Close()
	go op.feed()
	op.relay(outR, func() int {
		ws := <-status
		if ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	})
}

// runIn has the idle file server s do the operation; false (s let go) if s did not take
// it, and the operation is to be done by a helper.
func (op *fileOp) runIn(s *fileServer, req FileRequest) bool {
	files, err := op.agent.pipesFor(s)
	if err != nil {
		op.agent.release(s)
		return false
	}
	inR, inW, outR, outW := files[0], files[1], files[2], files[3]
	err = s.hand(req.Operation, inR, outW)
	inR.Close()
	outW.Close()
	if err == nil {
		err = s.taken()
	}
	if errors.Is(err, errTookAndDied) {
		err = nil // it began the operation: what it wrote is relayed, then its death (137)
	}
	if err != nil {
		// It died (a process of its user killed it), if only just, before it took the
		// operation: nothing of it was done.
		inW.Close()
		outR.Close()
		op.agent.abandon(s)
		return false
	}
	op.win.mu.Lock()
	op.stdin, op.pid, op.server, op.started = inW, s.pid, s, true
	abandoned := op.win.done
	op.win.mu.Unlock()
	if abandoned {
		op.agent.abandon(s)
	}
	go op.feed()
	op.relay(outR, func() int {
		// Done, the server is idle: it is released before the result goes, so that the
		// caller's next operation finds it free. Without its 'D' it died in the operation.
		if s.expect('D') != nil {
			op.agent.abandon(s)
			return 128 + int(syscall.SIGKILL)
		}
		op.agent.release(s)
		return 0
	})
	return true
}

func pipes(n int) ([]*os.File, error) {
	var files []*os.File
	for i := 0; i < n; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			closeFiles(files)
			return nil, err
		}
		files = append(files, r, w)
	}
	return files, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// feed writes the daemon's data to the helper as 'I' frames, then 'C'; it reports what the
// helper took so that the daemon may send more.
func (op *fileOp) feed() {
	defer op.stdin.Close()
	header := make([]byte, 5)
	for {
		chunk, ok := op.win.next()
		if !ok {
			return
		}
		if chunk == nil { // ended
			header[0] = 'C'
			binary.BigEndian.PutUint32(header[1:], 0)
			_, _ = op.stdin.Write(header)
			return
		}
		header[0] = 'I'
		binary.BigEndian.PutUint32(header[1:], uint32(len(chunk)))
		if _, err := op.stdin.Write(append(header, chunk...)); err != nil {
			return // the helper stopped reading (it failed early): its error follows
		}
		took, report := op.win.took(len(chunk))
		if report {
			body, _ := json.Marshal(proto.FileTookMsg{Bytes: took})
			op.agent.Send(proto.FileTook, op.channel, body)
		}
	}
}

// relay sends the operation's output to the daemon within its window, then its exit code
// (exit, once the output has ended).
func (op *fileOp) relay(out *os.File, exit func() int) {
	defer out.Close()
	chunk := make([]byte, 64<<10)
	abandoned := false
	for !abandoned {
		n, err := out.Read(chunk)
		if n > 0 {
			_, open := op.win.waitRoom()
			op.win.count(n)
			abandoned = !open || !op.agent.Send(proto.FileOut, op.channel, chunk[:n])
		}
		if err != nil {
			break
		}
	}
	if abandoned {
		op.agent.forgetFile(op) // nobody to tell: the helper is killed, not left waiting
	}
	code := exit()
	op.win.mu.Lock()
	op.exited = true
	op.win.mu.Unlock()
	body, _ := json.Marshal(map[string]int{"exit_code": code})
	op.agent.Send(proto.Result, op.channel, body)
	op.agent.forgetFile(op)
}

func (a *Agent) finishFile(op *fileOp, message string) {
	body, _ := json.Marshal(proto.ErrorReply{Code: "io", Message: message})
	a.Send(proto.ErrorMsg, op.channel, body)
	a.forgetFile(op)
}

// forgetFile ends an operation: its channel goes, its helper is killed if still running
// (an abandoned helper must not wait for data for ever).
func (a *Agent) forgetFile(op *fileOp) {
	a.mu.Lock()
	if a.files[op.channel] == op {
		delete(a.files, op.channel)
	}
	a.mu.Unlock()
	op.win.mu.Lock()
	already := op.win.closeLocked()
	pid, exited, server := op.pid, op.exited, op.server
	op.win.mu.Unlock()
	if !already && server != nil && !exited {
		a.abandon(server)
	}
	if !already && pid > 0 && !exited {
		// SIGTERM lets the helper remove a half-written temporary file; SIGKILL follows.
		_ = syscall.Kill(pid, syscall.SIGTERM)
		time.AfterFunc(fileKillGrace, func() {
			op.win.mu.Lock()
			gone := op.exited
			op.win.mu.Unlock()
			if !gone {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		})
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
