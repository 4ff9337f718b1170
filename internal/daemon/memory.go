package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/checkpoint"
	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/fsutil"
	"github.com/vigil-dev/vigil/internal/journal"
	"github.com/vigil-dev/vigil/internal/logs"
	"github.com/vigil-dev/vigil/internal/registry"
	"github.com/vigil-dev/vigil/internal/supervisor"
)

// memory is the daemon's durable memory: every published event goes to
// the journal (crashes as crash records), and the scheduler writes
// checkpoints of the supervisor's state.
type memory struct {
	log      *slog.Logger
	bus      *event.Bus
	journal  *journal.Journal
	store    *checkpoint.Store
	sched    atomic.Pointer[checkpoint.Scheduler] // set once supervision runs
	stateDir string
	output   config.Journal

	// cleanBefore: the journal's newest record was a clean shutdown.
	cleanBefore bool
	// lastSeq is the previous daemons' newest journal record.
	lastSeq  uint64
	fsys     fsutil.FS
	previous *checkpoint.Loaded // nil when none could be read

	failing atomic.Bool // the last journal write failed

	// cfg is the daemon's current config and hooks its crash hooks; both
	// are set before supervision starts.
	cfg   func() *config.Config
	hooks *hookRunner
	// sessions lists the registered sessions for the checkpoint.
	sessions func() []registry.Session

	mu        sync.Mutex
	last      apitype.CheckpointInfo
	closeOnce sync.Once
}

// openMemory opens the journal and reads the previous checkpoint. Damage
// in either is reported as events once the sink is in place, never fatal.
func openMemory(cfg *config.Config, fsys fsutil.FS, bus *event.Bus, log *slog.Logger) (*memory, error) {
	dir := filepath.Join(cfg.StateDir, "journal")
	m := &memory{log: log, bus: bus, stateDir: cfg.StateDir, output: cfg.Journal}
	newest, _, err := (&journal.Reader{Dir: dir, FS: fsys}).Newest(journal.Query{Limit: 1})
	firstRun := errors.Is(err, fs.ErrNotExist)
	m.cleanBefore = firstRun || (err == nil && (len(newest) == 0 || newest[0].Type == journal.TypeShutdown))
	if len(newest) == 1 {
		m.lastSeq = newest[0].Seq
	}
	m.fsys = fsys
	if m.fsys == nil {
		m.fsys = fsutil.OS{}
	}
	m.journal, err = journal.Open(journal.Options{
		Dir:         dir,
		FS:          fsys,
		SegmentSize: cfg.Journal.SegmentSize,
		MaxTotal:    cfg.Journal.MaxSize,
		MaxAge:      cfg.Journal.MaxAge,
	})
	if err != nil {
		return nil, err
	}
	m.store = &checkpoint.Store{FS: fsys, Dir: cfg.StateDir, MaxAge: cfg.Checkpoint.MaxAge, WarnSize: cfg.Checkpoint.WarnSize}
	m.last.Path = filepath.Join(cfg.StateDir, "checkpoint.json")
	bus.SetSink(m.sink)

	for _, r := range m.journal.Repairs() {
		log.Warn(r.String())
		bus.Publish(event.Event{Time: time.Now(), Topic: event.JournalRepaired, Message: r.String()})
	}
	msg := "previous run ended cleanly"
	switch {
	case firstRun:
		msg = "first run in this state dir"
	case !m.cleanBefore:
		msg = "previous run did not stop cleanly"
	}
	bus.Publish(event.Event{Time: time.Now(), Topic: event.DaemonStarted, Message: msg})

	loaded, err := m.store.Read()
	switch {
	case errors.Is(err, checkpoint.ErrNotFound):
	case err != nil:
		log.Error("no usable checkpoint; starting from the config alone", "err", err)
		bus.Publish(event.Event{Time: time.Now(), Topic: event.CheckpointFailed, Message: err.Error()})
	default:
		m.previous = loaded
		for _, p := range loaded.Problems {
			log.Warn("checkpoint fell back to the backup", "err", p)
			bus.Publish(event.Event{Time: time.Now(), Topic: event.CheckpointFailed, Message: p.Error()})
		}
		for _, s := range loaded.Skipped {
			log.Warn("checkpoint entry skipped", "err", s)
			bus.Publish(event.Event{Time: time.Now(), Topic: event.CheckpointFailed, Message: s.Error()})
		}
		m.last.Generation = loaded.Generation
		m.last.WrittenAt = loaded.WrittenAt
	}
	return m, nil
}

// sink journals e. It runs inside Publish, so it only queues: the
// journal's writer makes the record durable, and Options.Durable (the
// journal's barrier) is what waits for it. A crash record lists the hooks
// due for it, which run once it is durable.
func (m *memory) sink(e event.Event) {
	typ, done := journal.TypeEvent, m.written
	var seqc chan uint64
	if e.Topic == event.CrashDetected && e.Crash != nil {
		typ = journal.TypeCrash
		if m.cfg != nil {
			if svc, err := m.cfg().Lookup(e.Crash.Service); err == nil {
				e.Crash.Hooks = hooksDue(*svc, e.Crash)
			}
		}
		if len(e.Crash.Hooks) > 0 && m.hooks != nil {
			// The record's sequence number reaches the writer's callback
			// through seqc: the callback may run before Append returns.
			seqc = make(chan uint64, 1)
			crash := *e.Crash
			done = func(err error) {
				m.written(err)
				if seq := <-seqc; err == nil {
					m.hooks.due(seq, crash)
				}
			}
		}
	}
	payload, err := json.Marshal(e)
	if err != nil {
		m.log.Error("journal: encoding event", "topic", e.Topic, "err", err)
		return
	}
	appendRec := m.journal.Append
	switch e.Topic {
	case event.SessionRegistered, event.SessionEnded:
		// Written before the answer (see daemon.journaled), which is what
		// a session needs; the fsync comes with the next one, within a
		// second, so a registration storm is not an fsync storm.
		appendRec = m.journal.AppendLazy
	}
	seq, err := appendRec(typ, payload, done)
	if seqc != nil {
		seqc <- seq
	}
	if err != nil {
		go m.written(err)
	}
	switch e.Topic {
	case event.CheckpointWritten, event.CheckpointFailed, event.JournalFailed, event.HookFinished:
		// Not state a checkpoint keeps: counting them would make an idle
		// daemon write checkpoints about its own checkpoints.
	default:
		if sc := m.sched.Load(); sc != nil {
			sc.Note()
		}
	}
}

// written learns the outcome of each journal write. A failure is logged
// and published once per outage, not once per record, so a full disk
// under a crash loop does not become a flood of its own; supervision goes
// on either way.
func (m *memory) written(err error) {
	if err == nil {
		if m.failing.CompareAndSwap(true, false) {
			m.log.Info("journal writes succeed again")
		}
		return
	}
	if !m.failing.CompareAndSwap(false, true) {
		return
	}
	m.log.Error("journal write failed", "err", err)
	m.bus.Publish(event.Event{Time: time.Now(), Topic: event.JournalFailed, Message: err.Error()})
}

// crashOutput is the last lines a service wrote, for its crash record.
func (m *memory) crashOutput(service string) []string {
	if m.output.CrashOutputLines == 0 {
		return []string{}
	}
	lines, err := logs.Tail(m.stateDir, service, m.output.CrashOutputLines, m.output.CrashOutputBytes)
	if err != nil || lines == nil {
		return []string{}
	}
	return lines
}

// startScheduler begins writing checkpoints of sup's state.
func (m *memory) startScheduler(ctx context.Context, cfg config.Checkpoint, sup *supervisor.Supervisor) {
	sc := &checkpoint.Scheduler{
		Write:    func() error { return m.write(sup) },
		Interval: cfg.Interval,
		Activity: cfg.Activity,
		// An idle daemon rewrites its unchanged checkpoint only to keep it
		// well within checkpoint.max_age.
		Refresh: min(time.Hour, cfg.MaxAge/4),
	}
	m.sched.Store(sc)
	go sc.Run(ctx)
}

// write takes and writes one checkpoint.
func (m *memory) write(sup *supervisor.Supervisor) error {
	st := sup.Checkpoint()
	if m.sessions != nil {
		st.Sessions = m.sessions()
	}
	began := time.Now()
	info, err := m.store.Write(&st)
	took := time.Since(began)
	m.mu.Lock()
	if err != nil {
		m.last.LastErr = err.Error()
	} else {
		m.last.Generation, m.last.Size, m.last.Warning, m.last.LastErr = info.Generation, info.Size, info.Warning, ""
		m.last.WrittenAt = began
		m.last.DurationMS = float64(took.Microseconds()) / 1000
	}
	m.mu.Unlock()
	now := time.Now()
	switch {
	case err != nil:
		m.log.Error("checkpoint failed; the previous one stays", "err", err)
		m.bus.Publish(event.Event{Time: now, Topic: event.CheckpointFailed, Message: err.Error()})
	default:
		if info.Warning != "" {
			m.log.Warn("checkpoint", "warning", info.Warning)
		}
		m.bus.Publish(event.Event{Time: now, Topic: event.CheckpointWritten,
			Message: fmt.Sprintf("generation %d, %d bytes in %s", info.Generation, info.Size, took.Round(time.Microsecond))})
	}
	return err
}

// info describes the last checkpoint.
func (m *memory) info() *apitype.CheckpointInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.last
	if sc := m.sched.Load(); sc != nil {
		out.IntervalMS = sc.CurrentInterval().Milliseconds()
	}
	return &out
}

func (m *memory) journalStatus() *apitype.Journal {
	st := m.journal.Stats()
	out := &apitype.Journal{Dir: m.journal.Dir(), Appended: st.Appended, Failed: st.Failed, Behind: st.Behind,
		LastErr: st.LastErr, Repairs: []string{}}
	for _, r := range m.journal.Repairs() {
		out.Repairs = append(out.Repairs, r.String())
	}
	return out
}

// checkpointNow writes a checkpoint at once (`vigil checkpoint now`).
func (m *memory) checkpointNow(ctx context.Context) (apitype.CheckpointInfo, error) {
	sc := m.sched.Load()
	if sc == nil {
		return apitype.CheckpointInfo{}, apitype.Errorf(apitype.CodeUnavailable, "the daemon is still starting")
	}
	if err := sc.Now(ctx); err != nil {
		return *m.info(), apitype.Errorf(apitype.CodeUnavailable, "checkpoint: %v", err)
	}
	return *m.info(), nil
}

// close ends the daemon's memory once every service has stopped: the
// final checkpoint (bounded by the scheduler's shutdown timeout), then the
// clean-shutdown record that tells the next daemon no recovery is needed,
// then the journal. A daemon that dies never gets here, and that absence
// is what the next one sees.
func (m *memory) close() { m.closeOnce.Do(m.doClose) }

func (m *memory) doClose() {
	if sc := m.sched.Load(); sc != nil {
		if err := sc.Shutdown(); err != nil {
			m.log.Error("final checkpoint", "err", err)
		}
	}
	m.bus.Publish(event.Event{Time: time.Now(), Topic: event.DaemonStopped})
	if _, err := m.journal.Write(journal.TypeShutdown, []byte(`{}`)); err != nil {
		m.log.Error("journal: clean-shutdown record", "err", err)
	}
	m.bus.SetSink(nil)
	if err := m.journal.Close(); err != nil {
		m.log.Error("journal close", "err", err)
	}
}
