//go:build linux

package agent

import (
	"net"
	"sync"
)

// conn is one daemon connection: frames in, a bounded queue of frames out.
type conn struct {
	raw    *net.UnixConn
	agent  *Agent
	mu     sync.Mutex
	queue  [][]byte
	queued int
	ready  *sync.Cond
	closed bool
	// greeted is set once the Welcome is queued: session frames wait for it.
	greeted bool
	// last is set once the queue's last frame is queued: the connection closes once it is sent.
	last bool
}

func newConn(raw *net.UnixConn, a *Agent) *conn {
	c := &conn{raw: raw, agent: a}
	c.ready = sync.NewCond(&c.mu)
	return c
}

// enqueueAfterWelcome queues a session's frame; false before the Welcome.
func (c *conn) enqueueAfterWelcome(frame []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.greeted {
		return false
	}
	return c.enqueueLocked(frame)
}

func (c *conn) enqueue(frame []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.enqueueLocked(frame)
}

func (c *conn) enqueueLocked(frame []byte) bool {
	if c.closed || c.last {
		return false
	}
	if c.queued+len(frame) > maxQueuedBytes {
		// The daemon does not read: drop it; nothing is lost that a new one cannot pull again.
		c.closed = true
		c.ready.Broadcast()
		go c.raw.Close()
		return false
	}
	c.queue = append(c.queue, frame)
	c.queued += len(frame)
	c.ready.Signal()
	return true
}

func (c *conn) writeLoop() {
	for {
		c.mu.Lock()
		for len(c.queue) == 0 && !c.closed {
			if c.last {
				c.mu.Unlock()
				c.close()
				return
			}
			c.ready.Wait()
		}
		if c.closed {
			c.mu.Unlock()
			return
		}
		batch := c.queue
		c.queue, c.queued = nil, 0
		c.mu.Unlock()
		buffers := net.Buffers(batch)
		if _, err := buffers.WriteTo(c.raw); err != nil {
			c.agent.drop(c)
			return
		}
	}
}

// closeWhenSent closes the connection once what is queued is sent; nothing more is queued.
func (c *conn) closeWhenSent() {
	c.mu.Lock()
	c.last = true
	c.ready.Signal()
	c.mu.Unlock()
}

func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *conn) close() {
	c.mu.Lock()
	already := c.closed
	c.closed = true
	c.ready.Broadcast()
	c.mu.Unlock()
	if !already {
		c.raw.Close()
	}
}
