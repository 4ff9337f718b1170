package session

import (
	"context"
	"os"
	"time"

	"github.com/vigil-dev/vigil/internal/proc"
)

// Registrar tells someone — a running daemon's registry — about a session.
// Run calls Register once CMD has started, Heartbeat every
// Config.Heartbeat after a successful Register, and End once the session
// is over. Each call gets a context with a deadline. Errors are logged and
// otherwise ignored: the session goes on without the registrar (a failed
// Register means no Heartbeat and no End). Calls come from one goroutine,
// never concurrently.
type Registrar interface {
	Register(ctx context.Context, info Info) (id string, err error)
	Heartbeat(ctx context.Context, id string) error
	End(ctx context.Context, id string, exit Exit) error
}

// Info describes a started session to a Registrar.
type Info struct {
	Name string   // the session's name (NameEnv)
	Args []string // CMD and its arguments
	// CMD is CMD's main process. Its pid is also its process group's id:
	// a registry that finds the session stale (the guard gone) stops the
	// group by it.
	CMD      proc.Identity
	PGID     int
	Guard    proc.Identity // the guard: while it lives, it watches CMD
	OwnerPID int           // the owner whose death ends the session
	// Heartbeat is the interval between heartbeats.
	Heartbeat time.Duration
	Started   time.Time
}

// registration runs the registrar's side of a session.
type registration struct {
	ends chan Exit
	done chan struct{}
}

// register starts telling g's registrar about the session, in the
// background, so a slow registrar delays nothing.
func (g *guard) register(ctx context.Context) *registration {
	r := g.cfg.Registrar
	if r == nil {
		return nil
	}
	reg := &registration{ends: make(chan Exit, 1), done: make(chan struct{})}
	info := Info{
		Name:      g.cfg.Name,
		Args:      g.cfg.Args,
		CMD:       proc.Identity{PID: g.child.pid},
		PGID:      g.child.pid,
		OwnerPID:  ownerAtInit,
		Heartbeat: g.cfg.Heartbeat,
		Started:   time.Now(),
	}
	// CMD is not reaped before the session ends, so its stat is there.
	if id, err := proc.ReadIdentity(g.child.pid); err == nil {
		info.CMD = id
	}
	info.Guard, _ = proc.ReadIdentity(os.Getpid())
	log := g.cfg.Log
	ctx = context.WithoutCancel(ctx)
	call := func(f func(context.Context) error) error {
		c, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		return f(c)
	}
	go func() {
		defer close(reg.done)
		var id string
		err := call(func(c context.Context) (err error) { id, err = r.Register(c, info); return })
		if err != nil {
			log.Warn("session: register", "session", info.Name, "err", err)
			return
		}
		t := time.NewTicker(g.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if err := call(func(c context.Context) error { return r.Heartbeat(c, id) }); err != nil {
					log.Warn("session: heartbeat", "session", info.Name, "id", id, "err", err)
				}
			case e := <-reg.ends:
				if err := call(func(c context.Context) error { return r.End(c, id, e) }); err != nil {
					log.Warn("session: end", "session", info.Name, "id", id, "err", err)
				}
				return
			}
		}
	}()
	return reg
}

// end tells the registrar how the session ended and waits, within bounds,
// until it has been told.
func (reg *registration) end(exit Exit) {
	if reg == nil {
		return
	}
	reg.ends <- exit
	t := time.NewTimer(2 * callTimeout) // a Register and an End
	defer t.Stop()
	select {
	case <-reg.done:
	case <-t.C:
	}
}
