// Package users resolves a workspace user ("sandbox", "1000", "1000:1000") from the
// image's /etc/passwd and /etc/group, as docker exec --user does.
package users

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// User is a resolved user.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32
	Home   string
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

// Resolve turns spec ("name", "uid", "name:group", "uid:gid") into a user, reading
// root+"/etc/passwd" and root+"/etc/group" (root is "" in a container). An answer is
// kept while a stat of both files says they are the same: each command and file operation
// resolves its user, and reading the two files cost milliseconds under gVisor.
func Resolve(spec, root string) (User, error) {
	stamp := stampOf(root+"/etc/passwd") + "|" + stampOf(root+"/etc/group")
	cache.Lock()
	hit, ok := cache.entries[root+"\x00"+spec]
	cache.Unlock()
	if ok && hit.stamp == stamp {
		u := hit.user
		u.Groups = append([]uint32(nil), hit.user.Groups...) // the caller's to change
		return u, hit.err
	}
	u, err := resolve(spec, root)
	cache.Lock()
	if len(cache.entries) >= maxCached {
		cache.entries = map[string]cached{} // specs are few; a flood of new ones only restarts it
	}
	kept := u
	kept.Groups = append([]uint32(nil), u.Groups...) // the caller's copy is theirs to change
	cache.entries[root+"\x00"+spec] = cached{stamp: stamp, user: kept, err: err}
	cache.Unlock()
	return u, err
}

// maxCached bounds the cache: a caller may name any number of users.
const maxCached = 256

type cached struct {
	stamp string
	user  User
	err   error
}

var cache = struct {
	sync.Mutex
	entries map[string]cached
}{entries: map[string]cached{}}

// stampOf tells a file's version by stat: device, inode, size, modification and change times.
func stampOf(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "-"
	}
	return fmt.Sprintf("%d.%d.%d.%d.%d.%d.%d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
}

func resolve(spec, root string) (User, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" {
		return User{}, fmt.Errorf("no user in %q", spec)
	}
	entries := readPasswd(root + "/etc/passwd")
	var u User
	if id, err := strconv.ParseUint(userPart, 10, 32); err == nil {
		u = User{UID: uint32(id), GID: uint32(id), Home: "/"}
		for _, e := range entries {
			if e.uid == u.UID {
				u.Name, u.GID, u.Home = e.name, e.gid, e.home
				break
			}
		}
	} else {
		found := false
		for _, e := range entries {
			if e.name == userPart {
				u = User{Name: e.name, UID: e.uid, GID: e.gid, Home: e.home}
				found = true
				break
			}
		}
		if !found {
			return User{}, fmt.Errorf("user %q is not in the image's /etc/passwd", userPart)
		}
	}
	groups := readGroups(root + "/etc/group")
	if hasGroup {
		if id, err := strconv.ParseUint(groupPart, 10, 32); err == nil {
			u.GID = uint32(id)
		} else if g, ok := groups.byName[groupPart]; ok {
			u.GID = g
		} else {
			return User{}, fmt.Errorf("group %q is not in the image's /etc/group", groupPart)
		}
	}
	u.Groups = []uint32{u.GID}
	if u.Name != "" && !hasGroup {
		for _, g := range groups.of[u.Name] {
			if g != u.GID {
				u.Groups = append(u.Groups, g)
			}
		}
	}
	if u.Home == "" {
		u.Home = "/"
	}
	return u, nil
}

func readPasswd(path string) []passwdEntry {
	var out []passwdEntry
	eachLine(path, func(fields []string) {
		if len(fields) < 6 {
			return
		}
		uid, err1 := strconv.ParseUint(fields[2], 10, 32)
		gid, err2 := strconv.ParseUint(fields[3], 10, 32)
		if err1 == nil && err2 == nil {
			out = append(out, passwdEntry{name: fields[0], uid: uint32(uid), gid: uint32(gid), home: fields[5]})
		}
	})
	return out
}

type groupTable struct {
	byName map[string]uint32
	of     map[string][]uint32 // member name -> gids
}

func readGroups(path string) groupTable {
	t := groupTable{byName: map[string]uint32{}, of: map[string][]uint32{}}
	eachLine(path, func(fields []string) {
		if len(fields) < 4 {
			return
		}
		gid, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			return
		}
		t.byName[fields[0]] = uint32(gid)
		for _, member := range strings.Split(fields[3], ",") {
			if member != "" {
				t.of[member] = append(t.of[member], uint32(gid))
			}
		}
	})
	return t
}

func eachLine(path string, fn func([]string)) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		line := scanner.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fn(strings.Split(line, ":"))
	}
}
