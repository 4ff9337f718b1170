package proc

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// cgroupRoot is the directory under which a reaper keeps one cgroup per
// service: <our cgroup v2>/vigil.<pid>.<n>/<service>. No controller is
// enabled, so cgroup v2's no-internal-process rule does not apply and we may
// stay in our own cgroup beside the children.
//
// A service's cgroup is made at its first start and reused by every later
// instance: creating and removing cgroups costs tens of milliseconds at
// times (the kernel waits for RCU grace periods), which has no place
// between a crash and the restart. The supervisor kills what is left of an
// instance before it starts the next one, so at any moment a service's
// cgroup holds one instance's processes.
type cgroupRoot struct {
	dir string

	mu       sync.Mutex
	services map[string]*cgroup
}

// rootSeq tells apart the roots of several reapers in one process (tests).
var rootSeq atomic.Uint64

// newCgroupRoot returns nil when no writable cgroup v2 hierarchy exists.
func newCgroupRoot() *cgroupRoot {
	mount := cgroup2Mount()
	if mount == "" {
		return nil
	}
	self := ownCgroup()
	if self == "" {
		return nil
	}
	removeStaleRoots(filepath.Join(mount, self))
	dir := filepath.Join(mount, self, fmt.Sprintf("vigil.%d.%d", os.Getpid(), rootSeq.Add(1)))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil
	}
	// Processes can be cloned straight into a cgroup since Linux 5.7; the
	// cgroup.kill file (5.14) tells that the kernel is recent enough.
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		os.Remove(dir)
		return nil
	}
	return &cgroupRoot{dir: dir, services: make(map[string]*cgroup)}
}

// removeStaleRoots removes the empty cgroups that daemons which died left
// in parent: "vigil.<pid>.<n>" whose pid runs no more. rmdir refuses a
// cgroup that still holds a process, so instances that survived their
// daemon (adopted by the next one) keep theirs until they end.
func removeStaleRoots(parent string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		var pid, n int
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "vigil.") {
			continue
		}
		if _, err := fmt.Sscanf(e.Name(), "vigil.%d.%d", &pid, &n); err != nil || pid == os.Getpid() || Running(pid) {
			continue
		}
		removeEmptyTree(filepath.Join(parent, e.Name()))
	}
}

// removeEmptyTree removes dir's empty child cgroups, then dir if it is
// empty by then.
func removeEmptyTree(dir string) {
	if entries, err := os.ReadDir(dir); err == nil {
		for _, e := range entries {
			if e.IsDir() {
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
	os.Remove(dir)
}

// remove deletes every service cgroup that is empty, and the root.
func (r *cgroupRoot) remove() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.services {
		os.Remove(c.dir)
	}
	os.Remove(r.dir)
}

// service returns the cgroup of service, creating it on first use.
func (r *cgroupRoot) service(name string) (*cgroup, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.services[name]; c != nil {
		return c, nil
	}
	dir := filepath.Join(r.dir, name)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	c := &cgroup{dir: dir}
	r.services[name] = c
	return c, nil
}

// cgroup2Mount finds where the cgroup v2 hierarchy is mounted:
// /sys/fs/cgroup on a pure v2 host, /sys/fs/cgroup/unified on a hybrid one.
func cgroup2Mount() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ... mountpoint ... - fstype source options
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		if fs := strings.Fields(pre); len(fs) >= 5 && unix.Access(fs[4], unix.W_OK) == nil {
			return fs[4]
		}
	}
	return ""
}

// ownCgroup is this process's path in the v2 hierarchy ("0::/path").
func ownCgroup() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p
		}
	}
	return ""
}

// cgroup is one service's cgroup.
type cgroup struct{ dir string }

// open returns a descriptor of the cgroup for clone3's CLONE_INTO_CGROUP.
func (c *cgroup) open() (int, error) {
	return unix.Open(c.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

func (c *cgroup) procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
