package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/checkpoint"
	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/journal"
	"github.com/vigil-dev/vigil/internal/proc"
	"github.com/vigil-dev/vigil/internal/recovery"
)

// FaultEnv names a recovery stage at whose first attempt the daemon
// SIGKILLs itself, right after the stage is persisted: the fault point the
// tests use to show that the next daemon resumes there. Never set it
// outside tests.
const FaultEnv = "VIGIL_TEST_FAULT_RECOVERY_STAGE"

// inventory is what recovery found of the previous daemon's instances. It
// is persisted with the recovery state, so a daemon killed mid-recovery
// resumes with the same view instead of one that already changed.
type inventory struct {
	Generation uint64  `json:"generation"` // of the checkpoint it started from; 0: none
	Instances  []found `json:"instances"`
}

// found is one instance the previous daemon had, and whether it still runs.
type found struct {
	Service  string              `json:"service"`
	Instance checkpoint.Instance `json:"instance"`
	Alive    bool                `json:"alive"`
}

// newRecovery builds the recovery machine whose steps act on d.
func (d *daemon) newRecovery() *recovery.Machine {
	cfg := d.cfg.Load()
	return &recovery.Machine{
		Store: &recovery.Store{FS: d.opts.FS, Dir: cfg.StateDir},
		Steps: map[recovery.Stage]recovery.Step{
			recovery.Detecting:    d.detect,
			recovery.Inventorying: d.takeInventory,
			recovery.Restoring:    d.restore,
			recovery.Reconciling:  d.reconcile,
		},
		BeforeStage: func(st recovery.State) {
			if os.Getenv(FaultEnv) == string(st.Stage) && st.Attempt == 1 {
				d.log.Warn("fault point: killing the daemon", "stage", st.Stage)
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // SIGKILL is not instant; nothing more may happen
			}
		},
		OnTransition: func(t recovery.Transition, st recovery.State) {
			d.log.Info("recovery", "from", t.From, "to", t.To, "attempt", t.Attempt, "err", t.Error)
			d.mem.bus.Publish(event.Event{Time: t.At, Topic: event.RecoveryStage, State: string(t.To),
				From: string(t.From), Message: t.Error})
		},
	}
}

// recoveryNeeded reports whether the previous daemon did not stop cleanly
// or a recovery was interrupted.
func (d *daemon) recoveryNeeded() (bool, error) {
	_, inProgress, err := d.recovery.Store.Load()
	if err != nil {
		return true, err
	}
	return inProgress || !d.mem.cleanBefore, nil
}

// detect confirms what recovery starts from: the journal says the last
// daemon did not stop cleanly, and the checkpoint (if any) was read.
func (d *daemon) detect(ctx context.Context, st *recovery.State) error {
	if d.mem.previous == nil {
		d.log.Warn("recovering without a checkpoint: the journal alone says what ran")
	}
	return nil
}

// takeInventory lists every instance the previous daemon had, from the
// checkpoint and then the journal's later state changes, and checks each
// against /proc by pid and start time.
func (d *daemon) takeInventory(ctx context.Context, st *recovery.State) error {
	latest := map[string]*checkpoint.Instance{}
	var order []string
	note := func(name string, in *checkpoint.Instance) {
		if _, seen := latest[name]; !seen {
			order = append(order, name)
		}
		latest[name] = in
	}
	var inv inventory
	var since time.Time
	if prev := d.mem.previous; prev != nil {
		inv.Generation = prev.Generation
		since = replayFrom(prev.WrittenAt)
		for _, s := range prev.State.Services {
			note(s.Name, s.Instance)
		}
	}
	events, err := d.mem.eventsBefore(since)
	if err != nil {
		return err
	}
	for _, e := range events { // oldest first: the newest word wins
		switch {
		case e.Topic != event.ServiceState:
		case e.Instance != nil:
			note(e.Service, e.Instance)
		case e.State != "starting" && e.State != "stopping":
			note(e.Service, nil) // the instance ended
		}
	}
	for _, name := range order {
		in := latest[name]
		if in == nil {
			continue
		}
		alive := proc.Identity{PID: in.PID, StartTime: in.StartTime, Boot: in.Boot}.Alive()
		inv.Instances = append(inv.Instances, found{Service: name, Instance: *in, Alive: alive})
	}
	b, err := json.Marshal(inv)
	if err != nil {
		return err
	}
	st.Data = b
	return ctx.Err()
}

func decodeInventory(st *recovery.State) (inventory, error) {
	var inv inventory
	if len(st.Data) == 0 {
		return inv, errors.New("recovery: no inventory to restore from")
	}
	if err := json.Unmarshal(st.Data, &inv); err != nil {
		return inv, fmt.Errorf("recovery: inventory: %w", err)
	}
	return inv, nil
}

// restore gives the supervisor what the checkpoint kept and adopts every
// instance that survived. An instance that died since the inventory is
// left to reconcile, like the ones that were already dead.
func (d *daemon) restore(ctx context.Context, st *recovery.State) error {
	inv, err := decodeInventory(st)
	if err != nil {
		return err
	}
	if prev := d.mem.previous; prev != nil {
		d.sup.Restore(prev.State.Services)
	}
	cfg := d.cfg.Load()
	for i, f := range inv.Instances {
		if !f.Alive || !configured(cfg, f.Service) {
			continue
		}
		err := d.sup.Adopt(f.Service, f.Instance)
		switch {
		case err == nil:
		case errors.Is(err, apitype.ErrFailedPrecondition): // adopted by an earlier attempt
		case errors.Is(err, proc.ErrGone):
			inv.Instances[i].Alive = false
		default:
			return fmt.Errorf("adopting %s (pid %d): %w", f.Service, f.Instance.PID, err)
		}
	}
	if st.Data, err = json.Marshal(inv); err != nil {
		return err
	}
	d.restored = true
	return ctx.Err()
}

// reconcile kills what is left of dead instances (and of services the
// config no longer has), records each death as a lost crash, and starts
// every service that has no instance, in dependency order.
func (d *daemon) reconcile(ctx context.Context, st *recovery.State) error {
	if !d.restored {
		// Resumed here after a kill: restoring's work lived in the dead
		// daemon's memory, so it is done again (it is idempotent).
		if err := d.restore(ctx, st); err != nil {
			return err
		}
	}
	inv, err := decodeInventory(st)
	if err != nil {
		return err
	}
	cfg := d.cfg.Load()
	for _, f := range inv.Instances {
		in := f.Instance
		if f.Alive && configured(cfg, f.Service) {
			continue
		}
		rebooted := proc.OtherBoot(in.Boot)
		n := 0
		if !rebooted { // what an instance of another boot left died with it
			n = proc.KillLeftovers(proc.Adoptee{Service: f.Service, Identity: proc.Identity{PID: in.PID, StartTime: in.StartTime, Boot: in.Boot},
				PGID: in.PGID, Cgroup: in.Cgroup, Token: in.Token})
		}
		d.log.Info("recovery: instance not adopted", "service", f.Service, "pid", in.PID, "alive", f.Alive, "killed", n, "rebooted", rebooted)
		if !f.Alive {
			action, msg := "found dead after the daemon's restart; started again per its policy", "ended while the daemon was down"
			if rebooted {
				action, msg = "ended with the machine's previous boot; started again per its policy", "ended with the previous boot"
			}
			now := time.Now()
			c := &apitype.Crash{Service: f.Service, PID: in.PID, StartTime: in.StartTime, StartedAt: in.StartedAt,
				Exit: apitype.Exit{Class: "lost", At: now}, UptimeMS: now.Sub(in.StartedAt).Milliseconds(),
				Output: []string{}, Leases: append([]string{}, in.Leases...),
				Action: action}
			d.mem.bus.Publish(event.Event{Time: now, Topic: event.CrashDetected, Service: f.Service, PID: in.PID,
				Exit: &c.Exit, Crash: c, Message: msg})
		}
	}
	known := make(map[string]bool)
	for _, f := range inv.Instances {
		if f.Alive && configured(cfg, f.Service) && f.Instance.Token != "" {
			known[f.Instance.Token] = true
		}
	}
	d.killStrays(known)
	d.sup.StartAll()
	return ctx.Err()
}

// killStrays SIGKILLs the processes of this project that no record
// names: an instance whose start a dead daemon had not yet journaled (it
// died between the fork and the write), with whatever it started. Nothing
// would ever adopt or end them, and the service's next instance would run
// beside them. known holds the tokens of the instances adopted.
func (d *daemon) killStrays(known map[string]bool) {
	for _, s := range proc.Strays(d.project, func(token string) bool { return known[token] }) {
		err := syscall.Kill(s.PID, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			continue
		}
		d.log.Warn("recovery: killed a process no record names", "service", s.Service, "pid", s.PID, "instance", s.Token, "err", err)
		d.mem.bus.Publish(event.Event{Time: time.Now(), Topic: event.RecoveryStray, Service: s.Service, PID: s.PID,
			Message: "killed: an instance (or part of one) that a dead daemon started but never recorded"})
	}
}

func configured(cfg *config.Config, name string) bool {
	_, err := cfg.Lookup(name)
	return err == nil
}

// replaySlack is how far before a checkpoint's written_at the journal is
// replayed on top of it. The state in a checkpoint is taken a moment
// before written_at (encoding and syncing a large one takes a while), and
// events of that moment are in the journal only; replaying more is
// harmless, since the events are applied in order and the last word wins.
const replaySlack = 10 * time.Minute

func replayFrom(writtenAt time.Time) time.Time { return writtenAt.Add(-replaySlack) }

// eventsBefore returns the events the previous daemons journaled since
// since (all when zero), oldest first: the records before this daemon's own.
func (m *memory) eventsBefore(since time.Time) ([]event.Event, error) {
	if m.lastSeq == 0 {
		return nil, nil
	}
	recs, probs, err := (&journal.Reader{Dir: m.journal.Dir(), FS: m.fsys}).Newest(journal.Query{
		Types: []journal.Type{journal.TypeEvent}, Since: since,
		Match: func(r journal.Record) bool { return r.Seq <= m.lastSeq },
	})
	if err != nil {
		return nil, err
	}
	for _, p := range probs {
		m.log.Warn("recovery: journal damage skipped", "err", p)
	}
	out := make([]event.Event, 0, len(recs))
	for i := len(recs) - 1; i >= 0; i-- {
		var e event.Event
		if err := json.Unmarshal(recs[i].Payload, &e); err != nil {
			m.log.Warn("recovery: journal record skipped", "seq", recs[i].Seq, "err", err)
			continue
		}
		out = append(out, e)
	}
	return out, nil
}
