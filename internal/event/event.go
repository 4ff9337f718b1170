// Package event defines what the supervisor tells the world and the fan-out
// bus that carries it to subscribers (foreground output, the daemon log, and
// later the SSE stream, metrics and crash hooks).
//
// Publishing never blocks: a subscriber that falls behind loses events and
// its Dropped count says how many, so a slow reader can never stall the
// supervisor's event loop.
package event

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/checkpoint"
	"github.com/vigil-dev/vigil/internal/registry"
)

// Topic names a kind of event; the strings are part of the API (DESIGN §7).
type Topic string

const (
	ServiceState   Topic = "service.state"
	CrashDetected  Topic = "crash.detected"
	BreakerTripped Topic = "breaker.tripped"
	// OperatorCommand: start, stop, restart, reset or reload was asked for.
	OperatorCommand Topic = "operator.command"
	// CheckpointWritten and CheckpointFailed: a checkpoint write's outcome.
	CheckpointWritten Topic = "checkpoint.written"
	CheckpointFailed  Topic = "checkpoint.failed"
	// JournalRepaired: damage found in the journal at start and repaired.
	JournalRepaired Topic = "journal.repaired"
	// JournalFailed: a journal write failed; supervision goes on.
	JournalFailed Topic = "journal.failed"
	// DaemonStarted and DaemonStopped bracket a daemon's life; a stop is
	// only published for a clean shutdown.
	DaemonStarted Topic = "daemon.started"
	DaemonStopped Topic = "daemon.stopped"
	// SafeModeEntered and SafeModeExited: the daemon runs essential
	// services only, or everything again; Message says why.
	SafeModeEntered Topic = "safemode.entered"
	SafeModeExited  Topic = "safemode.exited"
	// HookFinished: a crash hook (Reason: on_crash or on_failed) ran for
	// the crash record CrashSeq; Message says how it ended.
	HookFinished Topic = "hook.finished"
	// Session topics: a session registered or ended by its owner, found
	// stale, or removed by a cleanup (Message says what was killed);
	// CleanupBulk when one cleanup killed more than 3 processes.
	SessionRegistered Topic = "session.registered"
	SessionEnded      Topic = "session.ended"
	SessionStale      Topic = "session.stale"
	SessionRemoved    Topic = "session.removed"
	CleanupBulk       Topic = "cleanup.bulk"
	// RecoveryStage: the daemon's own recovery moved to State from From.
	RecoveryStage Topic = "recovery.stage"
	// RecoveryStray: recovery killed process PID of Service, which carried
	// this project's instance token but no record named: a dead daemon
	// started it and died before journaling the start.
	RecoveryStray Topic = "recovery.stray"
)

// Event is one thing that happened.
type Event struct {
	Seq     uint64         `json:"seq"`
	Time    time.Time      `json:"time"`
	Topic   Topic          `json:"topic"`
	Service string         `json:"service,omitempty"`
	State   string         `json:"state,omitempty"`
	From    string         `json:"from,omitempty"`
	PID     int            `json:"pid,omitempty"`
	Exit    *apitype.Exit  `json:"exit,omitempty"`
	Reason  string         `json:"reason,omitempty"`
	Message string         `json:"message,omitempty"`
	Crash   *apitype.Crash `json:"crash,omitempty"` // crash.detected: the full record
	// Instance identifies the service's live instance on service.state
	// events, so recovery finds instances started since the last checkpoint.
	Instance *checkpoint.Instance `json:"instance,omitempty"`
	// CrashSeq is the journal sequence number of the crash record a
	// hook.finished event is about.
	CrashSeq uint64 `json:"crash_seq,omitempty"`
	// Session is the session a session.* event is about.
	Session *registry.Session `json:"session,omitempty"`
}

// Bus fans events out to subscribers. Its zero value is ready to use.
type Bus struct {
	mu   sync.Mutex
	seq  uint64
	subs map[*Subscription]struct{}
	sink func(Event)
}

// SetSink makes Publish hand every event to sink, in sequence order,
// before any subscriber sees it: the daemon's journal. sink must not
// block or publish.
func (b *Bus) SetSink(sink func(Event)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sink = sink
}

// Subscription receives events on C until Close.
type Subscription struct {
	C       <-chan Event
	c       chan Event
	bus     *Bus
	dropped atomic.Uint64
}

// Dropped is how many events this subscriber missed because its buffer was full.
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

// Close stops delivery and closes C.
func (s *Subscription) Close() {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	if _, ok := s.bus.subs[s]; ok {
		delete(s.bus.subs, s)
		close(s.c)
	}
}

// Subscribe returns a subscription with room for buffer undelivered events.
func (b *Bus) Subscribe(buffer int) *Subscription {
	c := make(chan Event, buffer)
	s := &Subscription{C: c, c: c, bus: b}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.subs == nil {
		b.subs = make(map[*Subscription]struct{})
	}
	b.subs[s] = struct{}{}
	return s
}

// Publish stamps e with the next sequence number and hands it to every
// subscriber that has room.
func (b *Bus) Publish(e Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	e.Seq = b.seq
	if b.sink != nil {
		b.sink(e)
	}
	for s := range b.subs {
		select {
		case s.c <- e:
		default:
			s.dropped.Add(1)
		}
	}
}
