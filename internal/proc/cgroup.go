package proc

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cgroupRoot is the directory under which this process creates one cgroup
// per instance: <our cgroup v2>/vigil.<pid>. No controller is enabled, so
// cgroup v2's no-internal-process rule does not apply and we may stay in
// our own cgroup beside the children.
type cgroupRoot struct{ dir string }

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
	dir := filepath.Join(mount, self, fmt.Sprintf("vigil.%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil
	}
	// A cgroup.kill file means the kernel can kill a whole cgroup (5.14+).
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		os.Remove(dir)
		return nil
	}
	return &cgroupRoot{dir: dir}
}

func (r *cgroupRoot) remove() { os.Remove(r.dir) }

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

// cgroup is one instance's cgroup.
type cgroup struct {
	dir string
	fd  int // open only between create and the fork
}

func (r *cgroupRoot) create(service, token string) (*cgroup, error) {
	dir := filepath.Join(r.dir, service+"."+token)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(dir)
		return nil, err
	}
	return &cgroup{dir: dir, fd: fd}, nil
}

func (c *cgroup) closeFD() {
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
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

func (c *cgroup) kill() error {
	return os.WriteFile(filepath.Join(c.dir, "cgroup.kill"), []byte("1"), 0)
}

// remove deletes the cgroup; the kernel refuses while a process is in it,
// which is then left for the next Release or a later clean-up.
func (c *cgroup) remove() {
	c.closeFD()
	os.Remove(c.dir)
}
