package proc

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// table is one reading of the /proc process tree, for finding an
// instance's processes where no cgroup lists them. Reading /proc costs a
// stat read per process on the machine, so stopping many services one
// after another would cost the square of their number; a table is shared
// by the lookups it is fresh enough for (see KillAll and strays).
type table struct {
	taken time.Time // before the first entry was read
	done  time.Time // after the last
	nodes map[int]node
	self  int

	mu     sync.Mutex
	tokens map[int]string // the VIGIL_INSTANCE values of a pid (see readToken), read on first need
}

type node struct {
	ppid, pgid int
	start      uint64
	zombie     bool
}

var tables struct {
	sync.Mutex
	last *table
}

// tableReads counts readings of /proc, for tests.
var tableReads atomic.Int64

// readTable reads /proc now and keeps the result for later lookups.
func readTable() *table {
	tableReads.Add(1)
	t := &table{taken: time.Now(), self: os.Getpid(), tokens: map[int]string{}}
	entries, err := os.ReadDir("/proc")
	t.nodes = make(map[int]node, len(entries))
	if err == nil {
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if s, err := readStat(pid); err == nil {
				t.nodes[pid] = node{ppid: s.ppid, pgid: s.pgid, start: s.startTime, zombie: s.state == 'Z' || s.state == 'X'}
			}
		}
	}
	t.done = time.Now()
	tables.Lock()
	if tables.last == nil || tables.last.taken.Before(t.taken) {
		tables.last = t
	}
	tables.Unlock()
	return t
}

// tableSince returns the last table if it was taken at or after since,
// and reads a new one otherwise.
func tableSince(since time.Time) *table {
	tables.Lock()
	t := tables.last
	tables.Unlock()
	if t != nil && !t.taken.Before(since) {
		return t
	}
	return readTable()
}

// recentTable returns the last table if it was taken at or after since
// and read less than stale ago, and reads a new one otherwise.
func recentTable(since time.Time, stale time.Duration) *table {
	tables.Lock()
	t := tables.last
	tables.Unlock()
	if t != nil && !t.taken.Before(since) && time.Since(t.done) < stale {
		return t
	}
	return readTable()
}

// lastTable is the last table read, or nil.
func lastTable() *table {
	tables.Lock()
	defer tables.Unlock()
	return tables.last
}

// alive reports whether id ran, not a zombie, when t was taken.
func (t *table) alive(id Identity) bool {
	n, ok := t.nodes[id.PID]
	return ok && !n.zombie && n.start == id.StartTime && !OtherBoot(id.Boot)
}

func (t *table) token(pid int) string {
	if k, ok := spawned.Load(pid); ok && k.(spawnedMain).start == t.nodes[pid].start {
		return k.(spawnedMain).token // what Spawn gave it: no environ to read
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tok, ok := t.tokens[pid]
	if !ok {
		tok = readToken(pid)
		t.tokens[pid] = tok
	}
	return tok
}

// spawned maps the pid of every running main process this process
// spawned to its spawnedMain: a reading of /proc needs each child's token,
// and a daemon's children are mostly these.
var spawned sync.Map

type spawnedMain struct {
	token string
	start uint64
}

// members lists the live processes of the instance whose main process is
// main, in process group pgid, marked with token: its process group, the
// descendants of its main process, and orphans (parent 1 or this process)
// whose environment carries its token, with their descendants.
func (t *table) members(main, pgid int, token string) []int {
	member := make(map[int]bool)
	var isMember func(pid int, depth int) bool
	isMember = func(pid int, depth int) bool {
		if v, ok := member[pid]; ok {
			return v
		}
		n, ok := t.nodes[pid]
		v := false
		switch {
		case !ok || depth > 64:
		case pid == main || n.pgid == pgid:
			v = true
		case n.ppid == 1 || n.ppid == t.self:
			v = tokenIn(t.token(pid), token)
		default:
			v = isMember(n.ppid, depth+1) || tokenIn(t.token(pid), token)
		}
		member[pid] = v
		return v
	}
	var out []int
	for pid, n := range t.nodes {
		if pid != t.self && !n.zombie && isMember(pid, 0) {
			out = append(out, pid)
		}
	}
	return out
}

// readToken returns the VIGIL_INSTANCE values in pid's environment,
// joined by NULs (see tokenIn), or "".
func readToken(pid int) string {
	tokens, _ := readInstanceEnv(pid)
	return tokens
}

// readInstanceEnv returns every VIGIL_INSTANCE value in pid's
// environment, joined by NULs, and its last VIGIL_SERVICE value. A process
// of a vigil that itself runs as a service of another carries both
// instances' tokens (the outer one inherited first), and belongs to both.
func readInstanceEnv(pid int) (tokens, service string) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return "", ""
	}
	for kv := range strings.SplitSeq(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, instanceEnv+"="); ok {
			if tokens != "" {
				tokens += "\x00"
			}
			tokens += v
		} else if v, ok := strings.CutPrefix(kv, "VIGIL_SERVICE="); ok {
			service = v
		}
	}
	return tokens, service
}

// tokenIn reports whether token is one of the NUL-joined tokens.
func tokenIn(tokens, token string) bool {
	if token == "" {
		return false
	}
	for tokens != "" {
		var tok string
		tok, tokens, _ = strings.Cut(tokens, "\x00")
		if tok == token {
			return true
		}
	}
	return false
}
