package proto

import "encoding/json"

// HelloMsg opens a connection (daemon -> agent).
type HelloMsg struct {
	Protocol int `json:"protocol"`
}

// WelcomeMsg answers Hello (agent -> daemon).
type WelcomeMsg struct {
	Protocol int            `json:"protocol"`
	Agent    string         `json:"agent"`
	PID      int            `json:"pid"`
	Features []string       `json:"features"`
	Sessions []SessionState `json:"sessions"`
	Frozen   bool           `json:"frozen"`
}

// Features are what this agent does beyond protocol 1 as first released (PROTOCOL.md).
var Features = []string{FeatureTail, FeatureFreeze, FeatureForward, FeatureResume, FeatureInputTaken, FeatureCheckpoint}

// FeatureTail: a Pull may ask for the end of the held output (Tail answers it).
const FeatureTail = "tail"

// FeatureFreeze: Freeze stops the sessions' timers around a pause (Frozen answers it).
const FeatureFreeze = "freeze"

// FeatureResume: a Pull may ask to send again from its Ack (Resend); a session a daemon was
// reading when its connection broke keeps back-pressure for ReaderGrace (its output is not
// dropped while the daemon comes back), and its state says so (SessionState.Reading).
const FeatureResume = "resume"

// FeatureInputTaken: a session says how much of its input its stdin took (FileTook on the
// session's channel, a running total), and its state how much it received: a daemon sends no
// more than a window ahead, so nothing past MaxPendingInput is dropped.
const FeatureInputTaken = "input_taken"

// FeatureCheckpoint: a Freeze may ask the agent to let go of the host (Checkpoint): it stops
// listening and closes the connection once Frozen is sent, so that the runtime can save the
// sandbox's memory, and listens again on SIGUSR1; Rename gives a restored copy's sessions
// their own ids.
const FeatureCheckpoint = "checkpoint"

// FeatureForward: Connect opens a TCP connection to a port on the workspace's loopback.
const FeatureForward = "forward"

// ConnectMsg opens a forwarded connection to 127.0.0.1:Port (or [::1]:Port) in the
// workspace (daemon -> agent); Connected answers it, or an ErrorReply.
type ConnectMsg struct {
	Port int `json:"port"`
}

// FreezeMsg stops (true) or restarts (false) every timeout and kill grace (daemon -> agent);
// Frozen echoes it once applied (agent -> daemon).
type FreezeMsg struct {
	Frozen bool `json:"frozen"`
	// Checkpoint (with Frozen): once Frozen is sent, stop listening and close the connection
	// (a socket bound or connected to the host cannot be saved), until SIGUSR1.
	Checkpoint bool `json:"checkpoint,omitempty"`
}

// RenameMsg gives a session a new process id and daemon state (daemon -> agent): a copy of
// the workspace restored from a checkpoint has sessions of its own.
type RenameMsg struct {
	ProcessID   string          `json:"process_id"`
	DaemonState json.RawMessage `json:"daemon_state,omitempty"`
}

// SessionState describes a session the agent holds, for a daemon that (re)connects.
type SessionState struct {
	Channel     uint32          `json:"channel"`
	ProcessID   string          `json:"process_id"`
	PID         int             `json:"pid"`
	Running     bool            `json:"running"`
	Ack         uint64          `json:"ack"`
	AckGap      uint64          `json:"ack_gap"`
	End         uint64          `json:"end"`
	Exit        *ExitedMsg      `json:"exit,omitempty"`
	Failed      *FailedMsg      `json:"failed,omitempty"`
	Interrupted bool            `json:"interrupted"`
	DaemonState json.RawMessage `json:"daemon_state,omitempty"`
	// Reading: a caller was reading the output when the last connection broke, and its
	// back-pressure still holds (FeatureResume): the caller may come back for it.
	Reading bool `json:"reading,omitempty"`
	// InputReceived and InputTaken: bytes of input the session took from daemons, and of
	// those the bytes its stdin took (or that went with a stdin the command closed).
	InputReceived uint64 `json:"input_received"`
	InputTaken    uint64 `json:"input_taken"`
}

// StartMsg starts a command (daemon -> agent).
type StartMsg struct {
	ProcessID       string      `json:"process_id"`
	Command         string      `json:"command"`
	Cwd             string      `json:"cwd"`
	Env             [][2]string `json:"env"`
	User            string      `json:"user"` // "name", "uid", "name:group" or "uid:gid"
	TTY             bool        `json:"tty"`
	Columns         int         `json:"columns"`
	Rows            int         `json:"rows"`
	TimeoutS        float64     `json:"timeout_s"`
	GraceS          float64     `json:"grace_s"`
	BufferBytes     int         `json:"buffer_bytes"`
	SpillPath       string      `json:"spill_path"`
	SpillAfterBytes int64       `json:"spill_after_bytes"`
	MergeStderr     bool        `json:"merge_stderr"`
	Capabilities    []string    `json:"capabilities"`
	// RootCapabilities are added to Capabilities when the user resolves to uid 0.
	RootCapabilities []string `json:"root_capabilities,omitempty"`
	// DaemonState is kept for the daemon and given back in Welcome: what a restarted daemon
	// needs to take the session over (its tenant, the command line...). Never secrets.
	DaemonState json.RawMessage `json:"daemon_state,omitempty"`
}

// StartedMsg says a command runs (agent -> daemon), sent before it can run a single instruction.
type StartedMsg struct {
	PID int `json:"pid"`
}

// FailedMsg says a command could not be started.
type FailedMsg struct {
	Stage   string `json:"stage"`
	Message string `json:"message"`
}

// SignalMsg sends a signal to a command's process group.
type SignalMsg struct {
	Signal    int  `json:"signal"`
	Interrupt bool `json:"interrupt"`
}

// KillMsg runs the kill ladder over a command's whole tree.
type KillMsg struct {
	GraceS float64 `json:"grace_s"`
}

// WindowMsg sets a terminal's size.
type WindowMsg struct {
	Columns int `json:"columns"`
	Rows    int `json:"rows"`
}

// PullMsg acknowledges output and allows more of it.
type PullMsg struct {
	Ack    uint64 `json:"ack"`
	AckGap uint64 `json:"ack_gap"` // bytes of a gap at Ack already reported
	Until  uint64 `json:"until"`
	Reader bool   `json:"reader"`
	Tail   bool   `json:"tail"` // answer with a TailMsg once this pull is applied
	// Resend sends the output again from Ack: a caller's stream broke with bytes in flight
	// (FeatureResume).
	Resend bool `json:"resend,omitempty"`
}

// TailMsg answers a Pull that asked for it: the offset just past the last output byte
// held once the pull was applied.
type TailMsg struct {
	End uint64 `json:"end"`
}

// DroppedMsg marks output lost because nobody read it.
type DroppedMsg struct {
	Offset uint64 `json:"offset"`
	Bytes  uint64 `json:"bytes"`
}

// ExitedMsg is a command's end (agent -> daemon).
type ExitedMsg struct {
	ExitCode  int    `json:"exit_code"`
	Signal    int    `json:"signal"`
	OOMKills  int    `json:"oom_kills"`
	TimedOut  bool   `json:"timed_out"`
	Leftovers int    `json:"leftovers"`
	SpillPath string `json:"spill_path"`
	End       uint64 `json:"end"`
	Dropped   uint64 `json:"dropped"`
	// Killed: a Kill was asked for, so a daemon that did not ask (a successor) reports the
	// command killed, not exited by its signal.
	Killed bool `json:"killed"`
}

// ErrorReply reports a failed operation or a protocol error.
type ErrorReply struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// FileAckMsg acknowledges a file operation's output.
type FileAckMsg struct {
	Ack uint64 `json:"ack"`
}

// FileTookMsg says how many bytes of a file operation's input the helper has taken, or (on a
// session's channel) how many bytes of its input the command's stdin has.
type FileTookMsg struct {
	Bytes uint64 `json:"bytes"`
}
