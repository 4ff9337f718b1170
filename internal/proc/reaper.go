package proc

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Exit is how a child ended.
type Exit struct {
	PID    int
	Status syscall.WaitStatus
	At     time.Time
	// Lost: the process was adopted, not our child, so its status is
	// unknown here; Status is zero.
	Lost bool
}

// ReaperOptions configures NewReaper; the zero value waits only for the
// children it started and uses no cgroups.
type ReaperOptions struct {
	// ReapAll waits for any child (wait4(-1) until nothing is left), as PID 1
	// or a child subreaper must. Without it only pids started through the
	// reaper are waited for, which keeps it safe inside a program that also
	// waits for children of its own (a test binary using os/exec).
	ReapAll bool
	// Orphan receives the exits of children nobody started through the
	// reaper: orphans reparented to a subreaper. May be nil.
	Orphan func(Exit)
	// Cgroups puts each instance in a cgroup of its own, where a writable
	// cgroup v2 hierarchy exists, so strays are found exactly. Without one
	// it silently falls back to the /proc process tree.
	Cgroups bool
	// Now stamps exits; default time.Now.
	Now func() time.Time
	// Project names the project in every instance token
	// ("<project>.<pid>.<n>"), so that a later daemon of the same project
	// finds the instances a dead one started but never recorded (Strays).
	// It must not contain a dot.
	Project string
}

// Reaper is the one component that waits for children. It reacts to
// SIGCHLD; it never polls.
type Reaper struct {
	opts    ReaperOptions
	cg      *cgroupRoot // nil: no cgroups
	sig     chan os.Signal
	done    chan struct{}
	stopped chan struct{}

	mu      sync.Mutex // held across fork+register and by dispatch
	waiting map[int]func(Exit)
}

// instanceSeq numbers instances process-wide, so tokens never repeat even
// across several reapers in one process.
var instanceSeq atomic.Uint64

// NewReaper starts the reaper's goroutine.
func NewReaper(opts ReaperOptions) (*Reaper, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	r := &Reaper{
		opts:    opts,
		sig:     make(chan os.Signal, 1),
		done:    make(chan struct{}),
		stopped: make(chan struct{}),
		waiting: make(map[int]func(Exit)),
	}
	if opts.Cgroups {
		r.cg = newCgroupRoot() // nil when none is usable
	}
	if err := cloexecInherited(); err != nil {
		return nil, err
	}
	signal.Notify(r.sig, syscall.SIGCHLD)
	go r.loop()
	return r, nil
}

// UsesCgroups reports whether instances get a cgroup of their own.
func (r *Reaper) UsesCgroups() bool { return r.cg != nil }

// Close stops the reaper. Children still running are not touched.
func (r *Reaper) Close() error {
	signal.Stop(r.sig)
	close(r.done)
	<-r.stopped
	if r.cg != nil {
		r.cg.remove()
	}
	return nil
}

func (r *Reaper) loop() {
	defer close(r.stopped)
	for {
		select {
		case <-r.sig:
			r.reap()
		case <-r.done:
			return
		}
	}
}

func (r *Reaper) reap() {
	var ws syscall.WaitStatus
	if r.opts.ReapAll {
		for {
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if pid <= 0 || err != nil {
				return
			}
			r.dispatch(pid, ws)
		}
	}
	r.mu.Lock()
	pids := make([]int, 0, len(r.waiting))
	for pid := range r.waiting {
		pids = append(pids, pid)
	}
	r.mu.Unlock()
	for _, pid := range pids {
		for {
			got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if got == pid {
				r.dispatch(pid, ws)
			}
			break
		}
	}
}

// dispatch hands an exit to whoever started pid. It takes the spawn lock, so
// an exit reaped between fork and registration waits for the registration.
func (r *Reaper) dispatch(pid int, ws syscall.WaitStatus) {
	e := Exit{PID: pid, Status: ws, At: r.opts.Now()}
	spawned.Delete(pid)
	r.mu.Lock()
	f := r.waiting[pid]
	delete(r.waiting, pid)
	r.mu.Unlock()
	switch {
	case f != nil:
		f(e)
	case r.opts.Orphan != nil:
		r.opts.Orphan(e)
	}
}

// Spec is what to start.
type Spec struct {
	// Service names the cgroup and marks descendants (VIGIL_SERVICE).
	Service string
	// Path is the program; without a slash it is looked up in the PATH of
	// Env (or of this process when Env has none).
	Path string
	Args []string // argv, including argv[0]
	Env  []string
	Dir  string
	// Stdin, Stdout and Stderr default to /dev/null.
	Stdin, Stdout, Stderr *os.File
	// ExtraFiles become descriptors 3, 4, … in the child.
	ExtraFiles []*os.File
	// Credential runs the child as another user; nil keeps ours.
	Credential *syscall.Credential
}

// Spawn starts spec in a process group of its own. onExit is called exactly
// once, from the reaper's goroutine, when the process has been reaped; it
// must not block. A failure to start wraps the errno, so
// errors.Is(err, fs.ErrNotExist) and fs.ErrPermission work.
func (r *Reaper) Spawn(spec Spec, onExit func(Exit)) (*Process, error) {
	path, err := lookPath(spec.Path, spec.Env)
	if err != nil {
		return nil, err
	}
	var devnull *os.File
	std := func(f *os.File) (uintptr, error) {
		if f != nil {
			return f.Fd(), nil
		}
		if devnull == nil {
			if devnull, err = os.OpenFile(os.DevNull, os.O_RDWR, 0); err != nil {
				return 0, err
			}
		}
		return devnull.Fd(), nil
	}
	files := make([]uintptr, 3, 3+len(spec.ExtraFiles))
	for i, f := range []*os.File{spec.Stdin, spec.Stdout, spec.Stderr} {
		if files[i], err = std(f); err != nil {
			return nil, fmt.Errorf("proc: spawn %s: %w", spec.Path, err)
		}
	}
	if devnull != nil {
		defer devnull.Close()
	}
	for _, f := range spec.ExtraFiles {
		files = append(files, f.Fd())
	}
	token := fmt.Sprintf("%d.%d", os.Getpid(), instanceSeq.Add(1))
	if r.opts.Project != "" {
		token = r.opts.Project + "." + token
	}
	env := append(spec.Env[:len(spec.Env):len(spec.Env)], instanceEnv+"="+token)
	if !slices.ContainsFunc(spec.Env, func(kv string) bool { return strings.HasPrefix(kv, "VIGIL_SERVICE=") }) {
		env = append(env, "VIGIL_SERVICE="+spec.Service) // a hook says which service it is about itself
	}
	sys := &syscall.SysProcAttr{Setpgid: true, Credential: spec.Credential}

	var cg *cgroup
	cgfd := -1
	if r.cg != nil {
		if cg, err = r.cg.service(spec.Service); err == nil {
			if cgfd, err = cg.open(); err == nil {
				sys.UseCgroupFD, sys.CgroupFD = true, cgfd
			} else {
				cg = nil
			}
		} else {
			cg = nil
		}
	}
	r.mu.Lock()
	pid, err := syscall.ForkExec(path, spec.Args, &syscall.ProcAttr{Dir: spec.Dir, Env: env, Files: files, Sys: sys})
	if err == nil {
		r.waiting[pid] = onExit
	}
	r.mu.Unlock()
	if cgfd >= 0 {
		unix.Close(cgfd)
	}
	if err != nil {
		where := ""
		if spec.Dir != "" {
			where = " in " + spec.Dir
		}
		if c := spec.Credential; c != nil {
			where += fmt.Sprintf(" as uid %d gid %d", c.Uid, c.Gid)
		}
		return nil, fmt.Errorf("proc: spawn %s%s: %w", path, where, err)
	}
	p := &Process{PGID: pid, Service: spec.Service, token: token, cg: cg, since: time.Now()}
	p.Identity.PID, p.Identity.Boot = pid, Boot()
	if s, err := readStat(pid); err == nil {
		p.StartTime = s.startTime
		spawned.Store(pid, spawnedMain{token: token, start: s.startTime})
	}
	return p, nil
}

// cloexecInherited marks every descriptor above stderr close-on-exec. Go
// opens its own descriptors that way, but one inherited from whoever
// started us (a shell, a CI runner) is not, and would leak into every
// service.
func cloexecInherited() error {
	err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	ents, rerr := os.ReadDir("/proc/self/fd")
	if rerr != nil {
		return fmt.Errorf("proc: marking inherited descriptors close-on-exec: %w", err)
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
		}
	}
	return nil
}

// instanceEnv marks every process of an instance, even one that left the
// process group, so the /proc fallback can still find it.
const instanceEnv = "VIGIL_INSTANCE"

func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	pathEnv, found := "", false
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			pathEnv, found = v, true
			break
		}
	}
	if !found {
		pathEnv = os.Getenv("PATH")
	}
	var firstErr error
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		err := unix.Access(p, unix.X_OK)
		if err == nil {
			if fi, serr := os.Stat(p); serr == nil && fi.Mode().IsRegular() {
				return p, nil
			}
			continue
		}
		if firstErr == nil && !errors.Is(err, unix.ENOENT) {
			firstErr = err
		}
	}
	if firstErr == nil {
		firstErr = syscall.ENOENT
	}
	return "", fmt.Errorf("proc: spawn %s: not found in PATH: %w", file, firstErr)
}

// Process is a started instance.
type Process struct {
	Identity
	PGID      int
	Service   string
	token     string
	cg        *cgroup
	foreignCg bool // cg is a dead daemon's (the instance was adopted)
	released  bool
	since     time.Time // its main process ran by then: a later reading of /proc shows it if alive
}

// Signal sends sig to the instance's process group and to every member that
// left it. A process that is already gone is not an error.
func (p *Process) Signal(sig syscall.Signal) error {
	err := syscall.Kill(-p.PGID, sig)
	if err == syscall.ESRCH {
		err = nil
	}
	for _, m := range p.strays() {
		_ = syscall.Kill(m, sig)
	}
	if err != nil {
		return fmt.Errorf("proc: signal %s to group %d: %w", sig, p.PGID, err)
	}
	return nil
}

// Members returns every live process of the instance.
func (p *Process) Members() []Identity {
	var out []Identity
	for _, pid := range p.memberPIDs(time.Now()) {
		if s, err := readStat(pid); err == nil && s.state != 'Z' && s.state != 'X' {
			out = append(out, Identity{PID: pid, StartTime: s.startTime, Boot: Boot()})
		}
	}
	return out
}

// KillAll sends SIGKILL to every process of the instance and reports how
// many there were. It signals the pids it finds rather than writing
// cgroup.kill: on the kernels we run on, a cgroup once killed that way
// SIGKILLs every later child cloned straight into it (CLONE_INTO_CGROUP),
// and a service's cgroup lives on to hold its next instance. A few rounds
// catch a process forked while the first round ran.
//
// Without a cgroup, the first round may use the last reading of /proc if
// the main process had ended when it was taken: no process of the
// instance it did not show can have been started after it (by the time
// nothing of the instance ran, or by one it shows, which are killed and
// looked for again in a reading taken after that).
func (p *Process) KillAll() int {
	seen := map[int]bool{}
	since := time.Now()
	if t := lastTable(); t != nil && p.cg == nil && !t.taken.Before(p.since) && !t.alive(p.Identity) {
		since = t.taken
	}
	for round := 0; round < 3; round++ {
		pids := p.memberPIDs(since)
		since = time.Now() // what the next round reads must follow these kills
		fresh := 0
		for _, pid := range pids {
			if !seen[pid] {
				seen[pid], fresh = true, fresh+1
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if round == 0 {
			_ = syscall.Kill(-p.PGID, syscall.SIGKILL)
		}
		if fresh == 0 {
			break
		}
	}
	return len(seen)
}

// Owns reports whether pid is one of the instance's live processes.
func (p *Process) Owns(pid int) bool {
	for _, m := range p.memberPIDs(time.Now()) {
		if m == pid {
			return true
		}
	}
	return false
}

// ProcessGroup returns the process group of pid, read from /proc.
func ProcessGroup(pid int) (int, bool) {
	s, err := readStat(pid)
	return s.pgid, err == nil
}

// Running reports whether pid exists and is not a zombie.
func Running(pid int) bool {
	s, err := readStat(pid)
	return err == nil && s.state != 'Z' && s.state != 'X'
}

// Release forgets the instance once its exit is seen and its strays are
// dealt with; after it, Members and KillAll no longer look at the service's
// cgroup, which by then may hold the next instance.
//
// The cgroup of an adopted instance belonged to the daemon that died; it
// is removed, with that daemon's root when nothing else is left in it.
func (p *Process) Release() {
	if p.foreignCg && p.cg != nil {
		os.Remove(p.cg.dir)
		os.Remove(filepath.Dir(p.cg.dir))
	}
	p.cg = nil
	p.released = true
}

// strays are members outside the process group (they would miss a group signal).
//
// Without a cgroup they come from a reading of /proc read less than
// tableStale ago (and taken after the instance began: one from before
// knows nothing of it), shared by the stop signals of a mass stop.
func (p *Process) strays() []int {
	var pids []int
	switch {
	case p.released:
	case p.cg != nil:
		pids = p.memberPIDs(time.Now())
	default:
		pids = recentTable(p.since, tableStale).members(p.PID, p.PGID, p.token)
	}
	var out []int
	for _, pid := range pids {
		if pgid, err := syscall.Getpgid(pid); err == nil && pgid != p.PGID {
			out = append(out, pid)
		}
	}
	return out
}

// memberPIDs lists the instance's processes: its cgroup's, or those of a
// reading of /proc taken at or after since.
func (p *Process) memberPIDs(since time.Time) []int {
	if p.released {
		return nil
	}
	if p.cg != nil {
		if pids, err := p.cg.procs(); err == nil {
			return pids
		}
	}
	return p.scan(since)
}

// tableStale is how long after it was read a reading of /proc may serve
// a stop signal's strays: a process that left the group in the last few
// milliseconds gets the SIGKILL that follows the stop instead of the stop
// signal.
const tableStale = 50 * time.Millisecond

// scan finds the instance's processes in a reading of /proc taken at or
// after since (see table.members).
func (p *Process) scan(since time.Time) []int {
	return tableSince(since).members(p.PID, p.PGID, p.token)
}

func hasToken(pid int, token string) bool { return tokenIn(readToken(pid), token) }

// SetChildSubreaper makes orphaned descendants reparent to this process
// instead of init, so it can reap them and find them.
func SetChildSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("proc: PR_SET_CHILD_SUBREAPER: %w", err)
	}
	return nil
}
