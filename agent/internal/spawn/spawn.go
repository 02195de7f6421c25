// Package spawn starts a command as the workspace user with no privileges left.
//
// The agent is root with a few capabilities; a command must run with none. Go's
// process start cannot drop the capability bounding set or set no_new_privs
// between fork and exec, so the agent starts itself again in "spawn" mode (this
// package's Child), which does that, reports that it is ready, waits for the
// agent to say go (the agent first reports the pid to the daemon, so a command
// that kills everything around it at once cannot beat that report), and then
// executes the command in its own place: the pid the agent reported is the
// command's, and no sandboxd process is left carrying its text.
//
// A Pool keeps one helper started ahead of need, still root and idle, which is
// handed the request and the command's files (over its control socket, as
// SCM_RIGHTS) when a command comes: the command then pays for no fork and exec of
// the helper, which under gVisor is most of what starting it costs.
package spawn

// Request is what the agent hands its spawn helper.
type Request struct {
	// Shell is tried first ("bash" looked up in PATH); Fallback (e.g. "/bin/sh") when it is not found.
	Shell        string   `json:"shell"`
	Fallback     string   `json:"fallback"`
	Args         []string `json:"args"` // after argv[0]: e.g. ["-lc", "--", COMMAND]
	FallbackArgs []string `json:"fallback_args"`
	Env          []string `json:"env"`
	Dir          string   `json:"dir"`
	UID          uint32   `json:"uid"`
	GID          uint32   `json:"gid"`
	Groups       []uint32 `json:"groups"`
	// Capabilities are kept (bounding, permitted, effective, inheritable and ambient):
	// only those a workspace added on purpose. Everything else is dropped.
	Capabilities []int `json:"capabilities"`
	OOMScoreAdj  int   `json:"oom_score_adj"`
	// Run names an in-process handler (Child's handlers) to run instead of executing a
	// program: the file-operation helper.
	Run string `json:"run"`
	// Files are the descriptors the files handed with the request become, in order (set
	// by Pool.Start); TTY makes fd 0 the controlling terminal.
	Files []int `json:"files"`
	TTY   bool  `json:"tty"`
}

// Failure is what the helper reports when it cannot start the command.
type Failure struct {
	Stage   string `json:"stage"`
	Message string `json:"message"`
}

// Ready is the helper's one-byte report that everything but the exec is done.
const Ready = 'R'

// Go is the agent's one-byte answer: exec now.
const Go = 'G'
