//go:build linux

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"sandboxd/agent/internal/proto"
)

// ForwardWindow is the most bytes of a forwarded connection in flight each way: what the
// agent sends beyond the daemon's last ForwardAck, and what the daemon sends beyond the
// agent's last ForwardTook. A hundred connections at full speed hold 100 windows, no more.
const ForwardWindow = 512 << 10

// forwardDialTimeout bounds the connect to the workspace's port (loopback: an answer is
// immediate unless the listener's backlog is full).
const forwardDialTimeout = 10 * time.Second

// forwardReadBytes is the largest piece read from the connection at once (one frame).
const forwardReadBytes = 256 << 10

// forwardTookStep is how much written data makes a ForwardTook report worth a frame.
const forwardTookStep = 64 << 10

// forward relays one TCP connection to a port on the workspace's loopback: the daemon's
// bytes to it within the window, its bytes to the daemon within the window, each side's end.
type forward struct {
	channel uint32
	port    int
	agent   *Agent
	win     *window // its mutex guards tcp

	tcp *net.TCPConn // nil until connected
}

func (a *Agent) forwardOn(channel uint32) *forward {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.forwards[channel]
}

// channelInUse says whether a session, file operation or forward has the channel (a.mu held).
func (a *Agent) channelInUse(channel uint32) bool {
	_, session := a.sessions[channel]
	_, file := a.files[channel]
	_, fw := a.forwards[channel]
	return session || file || fw
}

func (a *Agent) dispatchForward(c *conn, f proto.Frame, fw *forward) {
	if f.Kind == proto.Connect {
		var msg proto.ConnectMsg
		if err := decode(f.Payload, &msg); err != nil {
			a.protocolError(c, f.Channel, "connect: %v", err)
			return
		}
		if msg.Port < 1 || msg.Port > 65535 {
			a.protocolError(c, f.Channel, "connect: port %d is not a TCP port", msg.Port)
			return
		}
		a.mu.Lock()
		inUse := a.channelInUse(f.Channel)
		if !inUse {
			fw = &forward{channel: f.Channel, port: msg.Port, agent: a, win: newWindow(ForwardWindow, ForwardWindow, forwardTookStep)}
			a.forwards[f.Channel] = fw
		}
		a.mu.Unlock()
		if inUse {
			a.protocolError(c, f.Channel, "channel %d is in use", f.Channel)
			return
		}
		go fw.run()
		return
	}
	switch f.Kind {
	case proto.FileData:
		if !fw.win.push(f.Payload) {
			a.failForward(fw, "protocol", "the daemon sent more data than the forward's window")
		}
	case proto.FileEnd:
		fw.win.end()
	case proto.FileAck:
		var msg proto.FileAckMsg
		if err := decode(f.Payload, &msg); err != nil {
			a.protocolError(c, f.Channel, "forward ack: %v", err)
			return
		}
		fw.win.ack(msg.Ack)
	case proto.Discard:
		a.forgetForward(fw)
	default:
		a.protocolError(c, f.Channel, "frame %q on a forwarded connection", f.Kind)
	}
}

// dialLoopback connects to the port on the workspace's loopback, IPv4 first, then IPv6 (a
// server that listens on "::1" or "localhost" only).
func dialLoopback(port int) (*net.TCPConn, error) {
	var first error
	for _, host := range []string{"127.0.0.1", "::1"} {
		raw, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), forwardDialTimeout)
		if err == nil {
			return raw.(*net.TCPConn), nil
		}
		if first == nil {
			first = err
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.Is(err, syscall.ENETUNREACH) {
			break
		}
	}
	return nil, first
}

// run connects, says so, and relays both ways until the daemon discards the channel.
func (fw *forward) run() {
	tcp, err := dialLoopback(fw.port)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			fw.agent.failForward(fw, "refused", fmt.Sprintf("nothing listens on port %d in the workspace (connection refused)", fw.port))
		} else {
			fw.agent.failForward(fw, "io", fmt.Sprintf("cannot connect to port %d in the workspace: %v", fw.port, err))
		}
		return
	}
	fw.win.mu.Lock()
	gone := fw.win.done
	if !gone {
		fw.tcp = tcp
	}
	fw.win.mu.Unlock()
	if gone {
		tcp.Close()
		return
	}
	if !fw.agent.Send(proto.Connected, fw.channel, []byte("{}")) {
		fw.agent.forgetForward(fw)
		return
	}
	go fw.write(tcp)
	fw.read(tcp)
}

// read sends the connection's bytes to the daemon within the window, then HungUp at its end.
// It reads into one buffer and queues a frame of exactly what came: a frame cut from a large
// buffer would keep all of it alive while queued (a server trickling two bytes at a time
// then holds 256 KiB per frame, and the agent's memory grows until the OOM killer ends it).
func (fw *forward) read(tcp *net.TCPConn) {
	buf := make([]byte, forwardReadBytes)
	for {
		// Back-pressure: while the window is full nothing is read, and the server's writes
		// block once its socket buffer is full.
		room, open := fw.win.waitRoom()
		if !open {
			return
		}
		if room > forwardReadBytes {
			room = forwardReadBytes
		}
		n, err := tcp.Read(buf[:room])
		if n > 0 {
			frame := make([]byte, proto.HeaderSize+n)
			copy(frame[proto.HeaderSize:], buf[:n])
			fw.win.count(n)
			if !fw.agent.SendFrame(proto.InPlace(frame, proto.FileOut, fw.channel)) {
				fw.agent.forgetForward(fw)
				return
			}
		}
		if err != nil {
			if fw.isDone() {
				return
			}
			if errors.Is(err, io.EOF) {
				fw.agent.Send(proto.HungUp, fw.channel, []byte("{}"))
				return
			}
			fw.agent.failForward(fw, "io", fmt.Sprintf("the connection to port %d in the workspace failed: %v", fw.port, err))
			return
		}
	}
}

// write writes the daemon's bytes to the connection, reporting what it took, and closes the
// connection's writing half once the daemon's side ended.
func (fw *forward) write(tcp *net.TCPConn) {
	for {
		chunk, open := fw.win.next()
		if !open {
			return
		}
		if chunk == nil {
			_ = tcp.CloseWrite() // the server reads its end of input; its answer may still come
			return
		}
		if _, err := tcp.Write(chunk); err != nil {
			if !fw.isDone() {
				fw.agent.failForward(fw, "io", fmt.Sprintf("writing to port %d in the workspace failed: %v", fw.port, err))
			}
			return
		}
		took, report := fw.win.took(len(chunk))
		if report {
			body, _ := json.Marshal(proto.FileTookMsg{Bytes: took})
			fw.agent.Send(proto.FileTook, fw.channel, body)
		}
	}
}

func (fw *forward) isDone() bool { return fw.win.isDone() }

// failForward tells the daemon why the connection ended and forgets it.
func (a *Agent) failForward(fw *forward, code, message string) {
	if fw.isDone() {
		return
	}
	body, _ := json.Marshal(proto.ErrorReply{Code: code, Message: message})
	a.Send(proto.ErrorMsg, fw.channel, body)
	a.forgetForward(fw)
}

// forgetForward ends a forward: its channel goes and its connection is closed (which ends
// a read or write blocked on it).
func (a *Agent) forgetForward(fw *forward) {
	a.mu.Lock()
	if a.forwards[fw.channel] == fw {
		delete(a.forwards, fw.channel)
	}
	a.mu.Unlock()
	fw.win.mu.Lock()
	fw.win.closeLocked()
	tcp := fw.tcp
	fw.win.mu.Unlock()
	if tcp != nil {
		tcp.Close()
	}
}

// abandonForwards ends every forward: a forwarded connection does not outlive its daemon
// connection (its caller is gone).
func (a *Agent) abandonForwards() {
	a.mu.Lock()
	fws := a.forwardsLocked()
	a.mu.Unlock()
	for _, fw := range fws {
		a.forgetForward(fw)
	}
}

// forwardsLocked lists the open forwards (a.mu held).
func (a *Agent) forwardsLocked() []*forward {
	fws := make([]*forward, 0, len(a.forwards))
	for _, fw := range a.forwards {
		fws = append(fws, fw)
	}
	return fws
}
