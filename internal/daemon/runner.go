package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"github.com/vigil-dev/vigil/internal/checkpoint"
	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/logs"
	"github.com/vigil-dev/vigil/internal/probe"
	"github.com/vigil-dev/vigil/internal/proc"
	"github.com/vigil-dev/vigil/internal/supervisor"
)

// runner starts real processes for the supervisor: output goes to the
// service's log file, inherited directly by the child.
type runner struct {
	reaper   *proc.Reaper
	rotator  *logs.Rotator
	stateDir string
	notify   string // the sd_notify socket every child is told about
	// userNotify, if set, gives a service that runs as another user the
	// socket that user may write to.
	userNotify func(uid, gid uint32) (string, error)
	log        *slog.Logger
	// orphanStatus, when set, finds the exit status of an adopted process
	// that the guardian reaped; without it such an exit is lost.
	orphanStatus func(pid int) (syscall.WaitStatus, bool)
}

func (r *runner) Start(svc *config.Service, onExit func(supervisor.Exit)) (supervisor.Instance, error) {
	if _, err := r.rotator.RotateIfNeeded(svc.Name); err != nil {
		r.log.Warn("log rotation", "service", svc.Name, "err", err)
	}
	out, err := logs.OpenForChild(r.stateDir, svc.Name)
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child has its own copy
	if err := r.rotator.Watch(svc.Name); err != nil {
		r.log.Warn("log rotation watch", "service", svc.Name, "err", err)
	}
	cred, err := credential(svc.User, svc.Group)
	if err != nil {
		return nil, err
	}
	spec := proc.Spec{
		Service:    svc.Name,
		Path:       svc.Command[0],
		Args:       svc.Command,
		Env:        childEnv(os.Environ(), svc, r.notifySocket(svc, cred)),
		Dir:        svc.Dir,
		Stdout:     out,
		Stderr:     out,
		Credential: cred,
	}
	p, err := r.reaper.Spawn(spec, func(e proc.Exit) {
		onExit(supervisor.Exit{Status: e.Status, At: e.At})
	})
	if err != nil {
		return nil, err
	}
	return instance{p}, nil
}

// Adopt takes over an instance the previous daemon started. Its output
// already goes to the service's log file (the child holds it open), so
// only the rotation watch is set up again.
func (r *runner) Adopt(svc *config.Service, ref checkpoint.Instance, onExit func(supervisor.Exit)) (supervisor.Instance, error) {
	if err := r.rotator.Watch(svc.Name); err != nil {
		r.log.Warn("log rotation watch", "service", svc.Name, "err", err)
	}
	if cred, err := credential(svc.User, svc.Group); err == nil {
		r.notifySocket(svc, cred) // its socket, at the path it was given, listens again
	}
	a := proc.Adoptee{Service: svc.Name, Identity: proc.Identity{PID: ref.PID, StartTime: ref.StartTime, Boot: ref.Boot},
		PGID: ref.PGID, Cgroup: ref.Cgroup, Token: ref.Token}
	p, err := r.reaper.Adopt(a, func(e proc.Exit) {
		x := supervisor.Exit{Status: e.Status, At: e.At, Lost: e.Lost}
		if e.Lost && r.orphanStatus != nil {
			if ws, ok := r.orphanStatus(e.PID); ok {
				x.Status, x.Lost = ws, false
			}
		}
		onExit(x)
	})
	if err != nil {
		return nil, err
	}
	return instance{p}, nil
}

// notifySocket is the sd_notify socket for a service running with cred:
// the state dir's, or its user's own when it runs as another user (the
// state dir is the daemon user's alone). Without one the service gets no
// NOTIFY_SOCKET, as a program run outside a notify-aware supervisor.
func (r *runner) notifySocket(svc *config.Service, cred *syscall.Credential) string {
	if cred == nil || int(cred.Uid) == os.Geteuid() {
		return r.notify
	}
	if r.userNotify == nil {
		return ""
	}
	path, err := r.userNotify(cred.Uid, cred.Gid)
	if err != nil {
		r.log.Warn("no sd_notify socket for a service of another user", "service", svc.Name, "user", svc.User, "err", err)
		return ""
	}
	return path
}

// childEnv is the daemon's environment, the sd_notify variables, then the
// service's own overrides. WATCHDOG_PID is not set: the child's pid is not
// known before the fork, and sd_watchdog_enabled(3) accepts any pid when
// it is unset.
//
// A key the service sets replaces the inherited one rather than following
// it: getenv(3) and Go's os.Getenv return the first of duplicates.
func childEnv(base []string, svc *config.Service, notifySocket string) []string {
	own := make(map[string]bool, len(svc.Env))
	for _, kv := range svc.Env {
		k, _, _ := strings.Cut(kv, "=")
		own[k] = true
	}
	env := make([]string, 0, len(base)+len(svc.Env)+2)
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if !own[k] && k != "NOTIFY_SOCKET" && k != "WATCHDOG_USEC" && k != "WATCHDOG_PID" && k != "LISTEN_FDS" && k != "LISTEN_PID" {
			env = append(env, kv)
		}
	}
	if notifySocket != "" {
		env = append(env, "NOTIFY_SOCKET="+notifySocket)
	}
	if svc.Watchdog > 0 {
		env = append(env, "WATCHDOG_USEC="+strconv.FormatInt(svc.Watchdog.Microseconds(), 10))
	}
	return append(env, svc.Env...)
}

type instance struct{ p *proc.Process }

func (i instance) PID() int                        { return i.p.PID }
func (i instance) Signal(sig syscall.Signal) error { return i.p.Signal(sig) }
func (i instance) KillAll() int                    { return i.p.KillAll() }
func (i instance) Release()                        { i.p.Release() }
func (i instance) Alive(pid int) bool              { return proc.Running(pid) }
func (i instance) Owns(pid int) bool               { return i.p.Owns(pid) }
func (i instance) StartTime() uint64               { return i.p.StartTime }
func (i instance) PGID() int                       { return i.p.PGID }
func (i instance) Cgroup() string                  { return i.p.Cgroup() }
func (i instance) Token() string                   { return i.p.Token() }
func (i instance) SignalMain(pid int, sig syscall.Signal) error {
	if err := syscall.Kill(pid, sig); err != nil && err != syscall.ESRCH {
		return err
	}
	return nil
}

// credential resolves a service's user and group; empty means our own.
func credential(userName, groupName string) (*syscall.Credential, error) {
	if userName == "" && groupName == "" {
		return nil, nil
	}
	cred := &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}
	if userName != "" {
		u, err := user.Lookup(userName)
		if err != nil {
			if u, err = user.LookupId(userName); err != nil {
				return nil, fmt.Errorf("daemon: user %q: %w", userName, err)
			}
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		cred.Uid, cred.Gid = uint32(uid), uint32(gid)
		if ids, err := u.GroupIds(); err == nil {
			for _, g := range ids {
				if n, err := strconv.ParseUint(g, 10, 32); err == nil {
					cred.Groups = append(cred.Groups, uint32(n))
				}
			}
		}
	}
	if groupName != "" {
		g, err := user.LookupGroup(groupName)
		if err != nil {
			if g, err = user.LookupGroupId(groupName); err != nil {
				return nil, fmt.Errorf("daemon: group %q: %w", groupName, err)
			}
		}
		gid, _ := strconv.ParseUint(g.Gid, 10, 32)
		cred.Gid = uint32(gid)
	}
	if int(cred.Uid) != os.Geteuid() && os.Geteuid() != 0 {
		return nil, fmt.Errorf("daemon: running as user %q needs root", userName)
	}
	return cred, nil
}

// reaperSpawner runs exec checks through the daemon's reaper, the only
// component that waits for children (os/exec's Wait would race with it).
func reaperSpawner(r *proc.Reaper) probe.Spawner {
	return func(argv []string) (int, func() (syscall.WaitStatus, error), error) {
		exited := make(chan proc.Exit, 1)
		p, err := r.Spawn(proc.Spec{Service: ".checks", Path: argv[0], Args: argv, Env: os.Environ()},
			func(e proc.Exit) { exited <- e })
		if err != nil {
			return 0, nil, err
		}
		return p.PID, func() (syscall.WaitStatus, error) { return (<-exited).Status, nil }, nil
	}
}
