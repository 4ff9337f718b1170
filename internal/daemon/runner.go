package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strconv"
	"syscall"

	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/logs"
	"github.com/vigil-dev/vigil/internal/proc"
	"github.com/vigil-dev/vigil/internal/supervisor"
)

// runner starts real processes for the supervisor: output goes to the
// service's log file, inherited directly by the child.
type runner struct {
	reaper   *proc.Reaper
	rotator  *logs.Rotator
	stateDir string
	log      *slog.Logger
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
		Env:        append(os.Environ(), svc.Env...),
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

type instance struct{ p *proc.Process }

func (i instance) PID() int                        { return i.p.PID }
func (i instance) Signal(sig syscall.Signal) error { return i.p.Signal(sig) }
func (i instance) KillAll() int                    { return i.p.KillAll() }
func (i instance) Release()                        { i.p.Release() }

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
