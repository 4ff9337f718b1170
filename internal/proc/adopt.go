package proc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrGone is returned by Adopt when the process to adopt has ended, or
// its pid now belongs to another process.
var ErrGone = errors.New("proc: process is gone or its pid was reused")

// Adoptee names a live instance another daemon started: after that
// daemon's death its processes are no longer our children.
type Adoptee struct {
	Service string
	// Identity is the main process: pid plus start time.
	Identity
	// PGID is the instance's process group.
	PGID int
	// Cgroup is the cgroup directory the instance runs in; "" when it has none.
	Cgroup string
	// Token is the instance's VIGIL_INSTANCE value, which finds its strays
	// in /proc when it has no cgroup.
	Token string
}

// Adopt watches a's main process and returns its Process. A process that
// is not our child cannot be waited for: its end is seen through a pidfd
// in the Go runtime's poller (no thread, no polling loop), and onExit gets
// an Exit with Lost set, since only whoever reaps it learns its status.
func (r *Reaper) Adopt(a Adoptee, onExit func(Exit)) (*Process, error) {
	if !a.Identity.Alive() {
		return nil, fmt.Errorf("%w: pid %d", ErrGone, a.PID)
	}
	fd, err := unix.PidfdOpen(a.PID, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil, fmt.Errorf("%w: pid %d", ErrGone, a.PID)
		}
		return nil, fmt.Errorf("proc: adopt pid %d: pidfd_open: %w", a.PID, err)
	}
	// The pid may have been reused between the check and the open; the
	// pidfd pins whatever it opened, so a second check settles it.
	if !a.Identity.Alive() {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: pid %d", ErrGone, a.PID)
	}
	p := &Process{Identity: a.Identity, PGID: a.PGID, Service: a.Service, token: a.Token, since: time.Now()}
	if a.Cgroup != "" {
		p.cg, p.foreignCg = &cgroup{dir: a.Cgroup}, true
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	go func() {
		defer f.Close()
		waitPidfd(f)
		onExit(Exit{PID: a.PID, At: r.opts.Now(), Lost: true})
	}()
	return p, nil
}

// waitPidfd returns once the process behind the pidfd f has ended.
func waitPidfd(f *os.File) {
	ended := func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return n > 0 || (err != nil && err != unix.EINTR)
	}
	if rc, err := f.SyscallConn(); err == nil {
		if rc.Read(ended) == nil {
			return
		}
	}
	// Not in the poller (it should always be): block a thread instead.
	fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != unix.EINTR {
			return
		}
	}
}

// Cgroup is the instance's cgroup directory; "" when it has none.
func (p *Process) Cgroup() string {
	if p.cg == nil {
		return ""
	}
	return p.cg.dir
}

// Token is the instance's VIGIL_INSTANCE value.
func (p *Process) Token() string { return p.token }

// KillLeftovers SIGKILLs what is left of a dead instance another daemon
// started, and reports how many processes it found: the members of its
// cgroup, or, without one, the processes that carry its token. Processes
// that merely share its old process group are left alone, since that pid
// may belong to an unrelated process by now.
func KillLeftovers(a Adoptee) int {
	var pids []int
	if a.Cgroup != "" {
		if got, err := (&cgroup{dir: a.Cgroup}).procs(); err == nil {
			pids = got
		}
	}
	if pids == nil && a.Token != "" {
		pids = withToken(a.Token)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return len(pids)
}

// Stray is a live process with an instance token of the project that no
// record names.
type Stray struct {
	PID     int
	Token   string
	Service string // its VIGIL_SERVICE
}

// Strays lists the live processes whose instance token is of project
// (ReaperOptions.Project) but neither the calling process's own nor one
// that known accepts: what is left of instances a dead daemon of the
// project started and died before recording. Recovery must end them, or
// they would run forever beside the instances started in their place.
// It reads every process's environment, so it is for recovery, not for a
// loop.
func Strays(project string, known func(token string) bool) []Stray {
	if project == "" {
		return nil
	}
	self := os.Getpid()
	prefix, own := project+".", project+"."+strconv.Itoa(self)+"."
	found := map[int]Stray{}
	pids := livePIDs(func(pid int) bool {
		if pid == self {
			return false
		}
		tokens, service := readInstanceEnv(pid)
		for tokens != "" {
			var token string
			token, tokens, _ = strings.Cut(tokens, "\x00")
			if strings.HasPrefix(token, prefix) && !strings.HasPrefix(token, own) && !known(token) {
				found[pid] = Stray{PID: pid, Token: token, Service: service}
				return true
			}
		}
		return false
	})
	out := make([]Stray, 0, len(pids))
	for _, pid := range pids {
		out = append(out, found[pid])
	}
	return out
}

// withToken lists the live processes whose environment carries token.
func withToken(token string) []int {
	self := os.Getpid()
	return livePIDs(func(pid int) bool { return pid != self && hasToken(pid, token) })
}

// GroupMembers lists the live (not zombie) processes of process group pgid.
func GroupMembers(pgid int) []int {
	return livePIDs(func(pid int) bool {
		pg, ok := ProcessGroup(pid)
		return ok && pg == pgid
	})
}

// livePIDs lists the running processes that match accepts.
func livePIDs(match func(pid int) bool) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && match(pid) && Running(pid) {
			out = append(out, pid)
		}
	}
	return out
}
