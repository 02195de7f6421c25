package users

import (
	"strconv"
	"sync"
)

// Names tells the names of uids and gids, as ls -l does: the image's, else the number.
type Names struct {
	users  map[uint32]string
	groups map[uint32]string
}

// User is the name of uid, or uid in decimal when the image's /etc/passwd has none.
func (n Names) User(uid uint32) string {
	if name, ok := n.users[uid]; ok {
		return name
	}
	return strconv.FormatUint(uint64(uid), 10)
}

// Group is the name of gid, or gid in decimal when the image's /etc/group has none.
func (n Names) Group(gid uint32) string {
	if name, ok := n.groups[gid]; ok {
		return name
	}
	return strconv.FormatUint(uint64(gid), 10)
}

var names = struct {
	sync.Mutex
	stamp string
	table Names
}{}

// NamesOf reads root+"/etc/passwd" and root+"/etc/group" (root is "" in a container) into a
// table, kept while a stat of both says they are the same: a listing names every entry's owner.
func NamesOf(root string) Names {
	stamp := root + "\x00" + stampOf(root+"/etc/passwd") + "|" + stampOf(root+"/etc/group")
	names.Lock()
	defer names.Unlock()
	if names.stamp == stamp {
		return names.table
	}
	table := Names{users: map[uint32]string{}, groups: map[uint32]string{}}
	for _, entry := range readPasswd(root + "/etc/passwd") {
		if _, seen := table.users[entry.uid]; !seen { // the first line for a uid names it, as getpwuid
			table.users[entry.uid] = entry.name
		}
	}
	eachLine(root+"/etc/group", func(fields []string) {
		if len(fields) < 3 {
			return
		}
		if gid, err := strconv.ParseUint(fields[2], 10, 32); err == nil {
			if _, seen := table.groups[uint32(gid)]; !seen {
				table.groups[uint32(gid)] = fields[0]
			}
		}
	})
	names.stamp, names.table = stamp, table
	return table
}
