//go:build linux

package session

import (
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sandboxd/agent/internal/creds"
	"sandboxd/agent/internal/proctree"
)

// spareDelay is how long a command runs before the spare it leaves behind is made anyway:
// most commands end sooner, and a spare made after them is in no `ps` of theirs and takes no
// CPU from them.
const spareDelay = time.Second

// spareMisses is how many spares of a user may go unused in a row (each call brings another
// environment, working directory...) before spares for that user wait for a call that
// repeats the last one's.
const spareMisses = 2

// Spares keeps, for each workspace user, at most one login shell started ahead of need in
// alias mode (see package shell): bash with its profile read, its pipes open, waiting for a
// command. A command whose shell would start the same way (Take) runs in it at once.
type Spares struct {
	host Host

	mu      sync.Mutex
	byUID   map[uint32]*spare
	wanted  map[uint32]shellSpec // the last spec asked for, per user: what a thaw makes again
	pending map[uint32]bool      // a make is scheduled or running
	making  map[uint32]*making   // the spare being started now, per user
	misses  map[uint32]int
	frozen  bool
	serial  int
}

// making is a spare on its way: its key, and a channel closed once it is there (or not).
type making struct {
	key  string
	done chan struct{}
}

// makingWait bounds how long a command waits for a spare on its way rather than start cold:
// more than a login shell takes to start under gVisor (140 ms), less than a stalled helper.
const makingWait = time.Second

// spare is one waiting shell.
type spare struct {
	spec   shellSpec
	key    string
	l      *launched
	marker []byte
	stamps []stamp
	dead   chan struct{} // closed once the shell has exited (ws is its status)
	ws     syscall.WaitStatus
}

// NewSpares returns an empty set of spares whose shells host starts.
func NewSpares(host Host) *Spares {
	return &Spares{host: host, byUID: map[uint32]*spare{}, wanted: map[uint32]shellSpec{}, pending: map[uint32]bool{}, making: map[uint32]*making{}, misses: map[uint32]int{}}
}

// Take returns the spare started for spec, ready to be handed its command, or nil: none,
// another user's key (environment, working directory...), a shell that has died, or one
// that something its login shell reads (or its working directory) has changed under since
// it started. A spare that does not fit is let go. A spare on its way for spec is waited
// for: it is further along than a cold start would be (calls back to back).
func (p *Spares) Take(spec shellSpec) *launched {
	uid := spec.user.UID
	p.mu.Lock()
	if m := p.making[uid]; m != nil && p.byUID[uid] == nil && m.key == spec.key() {
		p.mu.Unlock()
		timer := time.NewTimer(makingWait)
		select {
		case <-m.done:
		case <-timer.C:
		}
		timer.Stop()
		p.mu.Lock()
	}
	sp := p.byUID[uid]
	delete(p.byUID, uid)
	p.mu.Unlock()
	if sp == nil {
		return nil
	}
	fits := sp.key == spec.key()
	if !fits {
		p.mu.Lock()
		p.misses[uid]++
		p.mu.Unlock()
	}
	if fits {
		select {
		case <-sp.dead:
			fits = false
		default:
			fits = sameStamps(sp.stamps, stampsOf(spec))
		}
	}
	if !fits {
		p.discard(sp)
		return nil
	}
	p.mu.Lock()
	p.misses[uid] = 0
	p.mu.Unlock()
	status := make(chan syscall.WaitStatus, 1)
	go func() {
		<-sp.dead
		status <- sp.ws
	}()
	sp.l.status = status
	return sp.l
}

// Want asks for a spare like spec once after has closed (the end of the command that asked is reported)
// or spareDelay has passed, whichever comes first.
func (p *Spares) Want(spec shellSpec, after <-chan struct{}) {
	spec.tty = false // a spare's stdio are pipes
	uid := spec.user.UID
	p.mu.Lock()
	previous, had := p.wanted[uid]
	p.wanted[uid] = spec
	repeated := had && previous.key() == spec.key()
	if p.misses[uid] >= spareMisses && !repeated {
		p.mu.Unlock()
		return // calls vary more than spares can follow: wait for one that repeats
	}
	if p.pending[uid] {
		p.mu.Unlock()
		return // the make already scheduled takes the latest spec
	}
	p.pending[uid] = true
	p.mu.Unlock()
	go func() {
		timer := time.NewTimer(spareDelay)
		select {
		case <-after:
		case <-timer.C:
		}
		timer.Stop()
		p.make(uid)
	}()
}

// make starts the spare of the spec last wanted for uid, unless one like it waits already.
func (p *Spares) make(uid uint32) {
	p.mu.Lock()
	spec, ok := p.wanted[uid]
	old := p.byUID[uid]
	if !ok || p.frozen || (old != nil && old.key == spec.key()) {
		p.pending[uid] = false
		p.mu.Unlock()
		return
	}
	delete(p.byUID, uid)
	p.serial++
	marker := []byte(MarkerName + "=spare-" + strconv.Itoa(p.serial))
	m := &making{key: spec.key(), done: make(chan struct{})}
	p.making[uid] = m
	p.mu.Unlock()
	if old != nil {
		p.discard(old)
	}
	sp := p.start(spec, marker)
	p.mu.Lock()
	p.pending[uid] = false
	delete(p.making, uid)
	defer close(m.done)
	if sp != nil && !p.frozen && p.byUID[uid] == nil {
		p.byUID[uid], sp = sp, nil
	}
	p.mu.Unlock()
	if sp != nil {
		p.discard(sp) // frozen, or another came first, meanwhile
	}
}

// start launches a spare: its stamps are taken first, so that a change made while its
// profile runs is one Take sees.
func (p *Spares) start(spec shellSpec, marker []byte) *spare {
	stamps := stampsOf(spec)
	if stamps == nil {
		return nil
	}
	l, failure, err := launch(p.host, spec, bashAlias, "", marker)
	if err != nil || failure != nil {
		return nil // a workspace out of processes, say: commands start cold
	}
	proc := l.proc
	l.proc = nil // executed: a command that takes it has nothing left to let go
	if failure := proc.Go(); failure != nil {
		l.closeAll()
		return nil
	}
	sp := &spare{spec: spec, key: spec.key(), l: l, marker: marker, stamps: stamps, dead: make(chan struct{})}
	status := l.status // Take gives the command a channel of its own in its place
	go func() {
		sp.ws = <-status
		close(sp.dead)
	}()
	return sp
}

// discard ends a spare: its whole tree (what its profile started included) and its pipes.
func (p *Spares) discard(sp *spare) {
	sp.l.closeAll()
	cred := creds.User{UID: sp.spec.user.UID, GID: sp.spec.user.GID, Groups: sp.spec.user.Groups}
	go func() {
		select {
		case <-sp.dead:
			// Reaped: its pid may be another's by now. What its profile left is found by marker.
			proctree.HardKill(0, sp.marker, cred)
		default:
			proctree.HardKill(sp.l.pid, sp.marker, cred)
		}
	}()
}

// Freeze lets every spare go before the workspace is paused (frozen true), and makes those
// last wanted again once it runs (false).
func (p *Spares) Freeze(frozen bool) {
	p.mu.Lock()
	p.frozen = frozen
	var gone []*spare
	var again []uint32
	if frozen {
		for uid, sp := range p.byUID {
			gone = append(gone, sp)
			delete(p.byUID, uid)
		}
	} else {
		for uid := range p.wanted {
			if !p.pending[uid] {
				p.pending[uid] = true
				again = append(again, uid)
			}
		}
	}
	p.mu.Unlock()
	for _, sp := range gone {
		p.discard(sp)
	}
	for _, uid := range again {
		go p.make(uid)
	}
}

// Settled says whether no spare is being made or waits to be (for tests).
func (p *Spares) Settled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pending := range p.pending {
		if pending {
			return false
		}
	}
	return true
}

// stamp is what a stat says of one file a login shell reads, enough to tell any change.
type stamp struct {
	path     string
	missing  bool
	refused  bool // EACCES: the stat is to be made as the shell's user
	dev, ino uint64
	mode     uint32
	uid, gid uint32
	size     int64
	mtime    syscall.Timespec
	ctime    syscall.Timespec
}

// stampsOf stats every file a bash login shell reads (the profiles,
// the user's, the BASH_ENV file) and its working directory (which must be the same
// directory: one removed and made again is another). Nil if they cannot be told (a
// BASH_ENV that is expanded): no spare then. It stats as the agent; only where that is
// refused (a home of mode 0700, and the agent without CAP_DAC_OVERRIDE) as the shell's
// user, which costs a change of credentials (two under gVisor are milliseconds).
func stampsOf(spec shellSpec) []stamp {
	home := spec.home()
	paths := []string{"/etc/profile", "/etc/bash.bashrc", "/etc/profile.d",
		home + "/.bash_profile", home + "/.bash_login", home + "/.profile", home + "/.bashrc"}
	bashEnv, hasBashEnv := os.LookupEnv("BASH_ENV")
	for _, pair := range spec.env {
		if pair[0] == "BASH_ENV" {
			bashEnv, hasBashEnv = pair[1], true
		}
	}
	if hasBashEnv && bashEnv != "" {
		if strings.ContainsAny(bashEnv, "$`~") {
			return nil
		}
		paths = append(paths, bashEnv)
	}
	out := stampsAt(paths, spec.cwd)
	for _, st := range out {
		if st.refused {
			cred := creds.User{UID: spec.user.UID, GID: spec.user.GID, Groups: spec.user.Groups}
			_ = creds.As(cred, func() error {
				out = stampsAt(paths, spec.cwd)
				return nil
			})
			break
		}
	}
	return out
}

// stampsAt stamps paths, the files in /etc/profile.d, and the working directory cwd.
func stampsAt(paths []string, cwd string) []stamp {
	var out []stamp
	if entries, err := os.ReadDir("/etc/profile.d"); err == nil {
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			names = append(names, "/etc/profile.d/"+e.Name())
		}
		sort.Strings(names)
		paths = append(paths[:len(paths):len(paths)], names...)
	}
	for _, path := range paths {
		out = append(out, stampOf(path, false))
	}
	return append(out, stampOf(cwd, true))
}

func stampOf(path string, identity bool) stamp {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return stamp{path: path, missing: true, refused: err == syscall.EACCES}
	}
	s := stamp{path: path, dev: st.Dev, ino: st.Ino, mode: st.Mode, uid: st.Uid, gid: st.Gid}
	if !identity {
		s.size, s.mtime, s.ctime = st.Size, st.Mtim, st.Ctim
	}
	return s
}

func sameStamps(a, b []stamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
