package lock

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vigil-dev/vigil/internal/proc"
	"golang.org/x/sys/unix"
)

// Holder is who holds a lock, as far as the kernel tells.
type Holder struct {
	// PID is the process that took the lock, as /proc/locks reports it;
	// 0 when the kernel does not say (a holder in another pid namespace).
	PID int `json:"pid,omitzero"`
	// Exited is set when the process that took the lock is gone (or its
	// pid now names another process that does not have the file open):
	// the lock lives on in a process that inherited its descriptor, such
	// as the command `vigil lock` ran.
	Exited bool `json:"exited,omitzero"`
	// StartTime is the holder's start time, /proc/PID/stat field 22
	// (clock ticks since boot); StartedAt is the same as a time.
	StartTime uint64    `json:"start_time,omitzero"`
	StartedAt time.Time `json:"started_at,omitzero"`
	// Since is when the holder took the lock, as it recorded in the lock
	// file; StartedAt when that record is missing or belongs to another
	// process.
	Since time.Time `json:"since,omitzero"`
}

// Status is one lock as List shows it.
type Status struct {
	Name string `json:"name"`
	// State is "held" or "free".
	State string `json:"state"`
	Holder
	// AgeMS is how long the lock has been held (since Holder.Since).
	AgeMS int64  `json:"age_ms,omitzero"`
	Path  string `json:"path"`
}

// List returns every lock in dir, sorted by name, held or free, with
// its holder; now is the time ages are measured to. Whether a lock is held
// is read from /proc/locks, so listing never takes or disturbs a lock. A
// missing dir has no locks; symlinks and other strangers are skipped.
func List(dir string, now time.Time) ([]Status, error) {
	ns, err := names(dir)
	if err != nil || len(ns) == 0 {
		return nil, err
	}
	locks, err := readFlocks()
	if err != nil {
		return nil, err
	}
	out := make([]Status, 0, len(ns))
	for _, n := range ns {
		path := filepath.Join(dir, n+Suffix)
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() {
			continue // swept meanwhile, or not a lock file
		}
		st := fi.Sys().(*syscall.Stat_t)
		s := Status{Name: n, State: "free", Path: path}
		if pid, held := find(locks, st); held {
			s.State = "held"
			s.Holder = describe(pid, path, st)
			if !s.Since.IsZero() {
				s.AgeMS = max(now.Sub(s.Since).Milliseconds(), 0)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// holderOf describes who holds the lock file st (of path, when known).
func holderOf(path string, st *syscall.Stat_t) Holder {
	locks, err := readFlocks()
	if err != nil {
		return Holder{}
	}
	pid, ok := find(locks, st)
	if !ok {
		return Holder{} // released since: the kernel no longer says
	}
	return describe(pid, path, st)
}

// describe fills in a Holder for the pid /proc/locks gave. Outside the
// initial pid namespace the kernel gives 0 once the process that took the
// lock has exited (inside it, the dead pid); then the pid recorded in the
// file is the best guess at who that was.
func describe(pid int, path string, st *syscall.Stat_t) Holder {
	in := readInfo(path)
	if pid <= 0 {
		if in.PID <= 0 {
			return Holder{}
		}
		pid = in.PID
	}
	h := Holder{PID: pid}
	id, err := proc.ReadIdentity(pid)
	if err != nil || !id.Alive() {
		h.Exited = true
		return h
	}
	recorded := in.PID == pid && in.StartTime == id.StartTime
	if !recorded && hasOpen(pid, st) == no {
		// The pid was reused, or the process that took the lock handed it
		// on and closed its own descriptor.
		h.Exited = true
		return h
	}
	h.StartTime = id.StartTime
	h.StartedAt = startedAt(id.StartTime)
	h.Since = h.StartedAt
	if recorded && !in.AcquiredAt.IsZero() {
		h.Since = in.AcquiredAt
	}
	return h
}

type answer int

const (
	unknown answer = iota
	yes
	no
)

// hasOpen reports whether process pid has the file st open.
func hasOpen(pid int, st *syscall.Stat_t) answer {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return unknown // not ours to look at, or gone
	}
	for _, e := range ents {
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err == nil && sameFile(st, fi.Sys().(*syscall.Stat_t)) {
			return yes
		}
	}
	return no
}

// userHZ is the unit of /proc/PID/stat's start time: USER_HZ, which the
// kernel fixes at 100 for user space on every Linux architecture.
const userHZ = 100

var bootTime = sync.OnceValue(func() time.Time {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("btime ")); ok {
			if s, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64); err == nil {
				return time.Unix(s, 0)
			}
		}
	}
	return time.Time{}
})

// startedAt turns a start time in clock ticks since boot into a time.
func startedAt(ticks uint64) time.Time {
	bt := bootTime()
	if bt.IsZero() {
		return time.Time{}
	}
	return bt.Add(time.Duration(ticks) * time.Second / userHZ)
}

// flockEntry is one granted flock lock in /proc/locks.
type flockEntry struct {
	pid          int
	major, minor uint32
	ino          uint64
}

var errProcLocks = errors.New("lock: cannot read /proc/locks")

func readFlocks() ([]flockEntry, error) {
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %w (is /proc mounted?)", errProcLocks, err)
		}
		return nil, fmt.Errorf("%w: %w", errProcLocks, err)
	}
	return parseLocks(b), nil
}

// parseLocks reads the granted FLOCK lines of /proc/locks:
//
//	1: FLOCK  ADVISORY  WRITE 6782 fe:00:9978179 0 EOF
//
// (id, class, type, mode, pid, major:minor:inode in hex:hex:decimal,
// range). Waiters ("1: -> FLOCK …") and other classes (POSIX, OFDLCK,
// LEASE) are skipped, as is anything malformed.
func parseLocks(b []byte) []flockEntry {
	var out []flockEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] != "FLOCK" {
			continue
		}
		pid, err := strconv.Atoi(f[4])
		if err != nil {
			continue
		}
		parts := strings.Split(f[5], ":")
		if len(parts) != 3 {
			continue
		}
		major, err1 := strconv.ParseUint(parts[0], 16, 32)
		minor, err2 := strconv.ParseUint(parts[1], 16, 32)
		ino, err3 := strconv.ParseUint(parts[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		out = append(out, flockEntry{pid: pid, major: uint32(major), minor: uint32(minor), ino: ino})
	}
	return out
}

// find returns the pid holding a flock on st. The device /proc/locks
// prints is the inode's super block's, which is st_dev on ext4, xfs,
// tmpfs and most file systems but not on btrfs subvolumes or some
// overlays; when nothing matches exactly, a single lock on the same inode
// number is taken to be it.
func find(locks []flockEntry, st *syscall.Stat_t) (pid int, held bool) {
	major, minor := unix.Major(st.Dev), unix.Minor(st.Dev)
	var byIno []flockEntry
	for _, e := range locks {
		if e.ino != st.Ino {
			continue
		}
		if e.major == major && e.minor == minor {
			return e.pid, true
		}
		byIno = append(byIno, e)
	}
	if len(byIno) == 1 {
		return byIno[0].pid, true
	}
	return 0, false
}
