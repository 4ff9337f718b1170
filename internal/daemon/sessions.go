package daemon

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/lock"
	"github.com/vigil-dev/vigil/internal/proc"
	"github.com/vigil-dev/vigil/internal/registry"
)

// Sessions: external processes that register what they own. Registering
// and ending are journaled (and the answer waits until they are durable);
// heartbeats are kept in memory and checkpointed; a cleanup every
// sessions.cleanup_period removes dead owners' sessions and terminates
// what they owned.

// journaled returns once the session changes published so far are written
// to the journal (bounded like an operator command's wait): then they
// survive the daemon's death, which is what the registry must survive.
// Their fsync comes within a second, off the caller's path (the sink
// appends registrations and ends lazily): a loss of power or a kernel
// crash takes every session's processes with it, and what was registered
// in an earlier boot is dropped on restore (see restoreSessions), so a
// session needs no more.
func (d *daemon) journaled() { d.sup.Await(d.mem.journal.Written) }

// sessionsConfig is the config's [sessions].
func (d *daemon) sessionsConfig() config.Sessions { return d.cfg.Load().Sessions }

func (d *daemon) RegisterSession(req apitype.SessionRequest) (apitype.Session, error) {
	if strings.TrimSpace(req.Name) == "" {
		return apitype.Session{}, apitype.Errorf(apitype.CodeInvalidArgument, "a session needs a name")
	}
	s := registry.Session{Name: req.Name, Type: req.Type, PID: req.PID, StartTime: req.StartTime,
		Boot: proc.Boot(), Heartbeat: req.Heartbeat, StaleAfter: req.StaleAfter}
	if s.PID > 0 && s.StartTime == 0 {
		id, err := proc.ReadIdentity(s.PID)
		if err != nil {
			return apitype.Session{}, apitype.Errorf(apitype.CodeInvalidArgument, "session owner pid %d: not a running process", s.PID)
		}
		s.StartTime = id.StartTime
	}
	for _, pgid := range req.Groups {
		g := registry.Group{PGID: pgid}
		if id, err := proc.ReadIdentity(pgid); err == nil {
			g.LeaderStart = id.StartTime
		}
		s.Groups = append(s.Groups, g)
	}
	sc := d.sessionsConfig()
	s, err := d.reg.Register(s, time.Now(), sc.Heartbeat, sc.StaleAfter)
	if err != nil {
		return apitype.Session{}, apitype.Errorf(apitype.CodeInvalidArgument, "%v", err)
	}
	d.mem.bus.Publish(event.Event{Time: s.RegisteredAt, Topic: event.SessionRegistered, PID: s.PID,
		Message: s.Name, Session: &s})
	d.journaled()
	return s, nil
}

func (d *daemon) HeartbeatSession(id string) error {
	if err := d.reg.Heartbeat(id, time.Now()); err != nil {
		return apitype.Errorf(apitype.CodeNotFound, "%v", err)
	}
	return nil
}

func (d *daemon) EndSession(id string) error {
	s, err := d.reg.Remove(id)
	if err != nil {
		return apitype.Errorf(apitype.CodeNotFound, "%v", err)
	}
	d.mem.bus.Publish(event.Event{Time: time.Now(), Topic: event.SessionEnded, PID: s.PID, Message: s.Name, Session: &s})
	d.journaled()
	return nil
}

func (d *daemon) Sessions() []apitype.Session { return d.reg.List() }

// Cleanup is `vigil gc`, and what runs every cleanup period.
func (d *daemon) Cleanup(ctx context.Context) (apitype.Cleanup, error) {
	return d.cleanupSessions(), nil
}

// cleanupSessions sweeps the registry and terminates what the dead owned.
func (d *daemon) cleanupSessions() apitype.Cleanup {
	began := time.Now()
	sc := d.sessionsConfig()
	out := apitype.Cleanup{Removed: []apitype.CleanedSession{}, Stale: []apitype.Session{}}
	alive := func(pid int, start uint64) bool { return proc.Identity{PID: pid, StartTime: start}.Alive() }
	for _, dec := range d.reg.Sweep(began, alive, sc.StaleAction == config.StaleKill) {
		s := dec.Session
		if !dec.Kill {
			out.Stale = append(out.Stale, s)
			d.mem.bus.Publish(event.Event{Time: began, Topic: event.SessionStale, PID: s.PID, Session: &s,
				Message: fmt.Sprintf("%s: no heartbeat for %s", s.Name, began.Sub(s.LastSeen).Round(time.Second))})
			continue
		}
		killed := terminateGroups(s.Groups, sc.KillGrace)
		out.Killed += len(killed)
		out.Removed = append(out.Removed, apitype.CleanedSession{Session: s, Verdict: string(dec.Verdict), Killed: killed})
		d.mem.bus.Publish(event.Event{Time: began, Topic: event.SessionRemoved, PID: s.PID, Reason: string(dec.Verdict), Session: &s,
			Message: fmt.Sprintf("%s (%s): killed %d processes %v", s.Name, dec.Verdict, len(killed), killed)})
	}
	if out.Killed > 3 {
		d.mem.bus.Publish(event.Event{Time: began, Topic: event.CleanupBulk,
			Message: fmt.Sprintf("%d processes of %d sessions killed in one cleanup", out.Killed, len(out.Removed))})
	}
	if len(out.Removed)+len(out.Stale) > 0 {
		d.journaled()
	}
	out.Locks = []string{}
	if removed, err := lock.Sweep(lock.Dir(d.cfg.Load().StateDir)); err != nil {
		d.log.Warn("gc: lock files", "err", err)
	} else if removed != nil {
		out.Locks = removed
	}
	out.TookMS = float64(time.Since(began).Microseconds()) / 1000
	return out
}

// terminateGroups sends SIGTERM to every process of groups, and SIGKILL to
// what is left after grace, and returns the pids it found. A group whose
// id now names another leader (the group emptied and its id was reused:
// that leader's start time differs) is left alone.
func terminateGroups(groups []registry.Group, grace time.Duration) []int {
	var found []int
	var mine []int
	for _, g := range groups {
		if leader, err := proc.ReadIdentity(g.PGID); err == nil && leader.StartTime != g.LeaderStart {
			if pgid, ok := proc.ProcessGroup(g.PGID); ok && pgid == g.PGID {
				continue // a new group with a reused id, not the session's
			}
		}
		members := proc.GroupMembers(g.PGID)
		if len(members) == 0 {
			continue
		}
		found = append(found, members...)
		mine = append(mine, g.PGID)
		_ = syscall.Kill(-g.PGID, syscall.SIGTERM)
	}
	if len(mine) > 0 {
		time.AfterFunc(grace, func() {
			for _, pgid := range mine {
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
		})
	}
	return found
}

// restoreSessions puts back the sessions the last checkpoint kept and
// those the journal registered or ended since. A session of an earlier
// boot died with it: it is removed, and nothing is signalled for it, since
// its pids and process groups may name unrelated processes now.
func (d *daemon) restoreSessions() error {
	var since time.Time
	byID := map[string]registry.Session{}
	if prev := d.mem.previous; prev != nil {
		since = replayFrom(prev.WrittenAt)
		for _, s := range prev.State.Sessions {
			byID[s.ID] = s
		}
	}
	events, err := d.mem.eventsBefore(since)
	if err != nil {
		return err
	}
	for _, e := range events {
		if e.Session == nil {
			continue
		}
		switch e.Topic {
		case event.SessionRegistered:
			byID[e.Session.ID] = *e.Session
		case event.SessionEnded, event.SessionRemoved:
			delete(byID, e.Session.ID)
		}
	}
	restored := make([]registry.Session, 0, len(byID))
	for _, s := range byID {
		if proc.OtherBoot(s.Boot) {
			d.mem.bus.Publish(event.Event{Time: time.Now(), Topic: event.SessionRemoved, PID: s.PID, Reason: "rebooted",
				Message: s.Name + ": its owner ended with the machine's previous boot", Session: &s})
			continue
		}
		restored = append(restored, s)
	}
	d.reg.Restore(restored, time.Now())
	return nil
}

// sweepSessions cleans up every cleanup period until ctx is done.
func (d *daemon) sweepSessions(ctx context.Context) {
	for {
		select {
		case <-time.After(d.sessionsConfig().CleanupPeriod):
			d.cleanupSessions()
		case <-ctx.Done():
			return
		}
	}
}
