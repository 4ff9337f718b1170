package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vigil-dev/vigil/internal/clock"
)

// ErrClosed is returned for writes asked of a Scheduler after Shutdown.
var ErrClosed = errors.New("checkpoint: scheduler is shut down")

// Scheduler decides when to write checkpoints: every Interval, early after
// Activity events, less often while writes are slow, on request, and once
// more at Shutdown. Writes never overlap. Its zero value with Write set is
// ready to use; the fields must not change once Run has started.
type Scheduler struct {
	// Write takes and writes one checkpoint; required.
	Write func() error
	// Clock is the only source of time; nil means clock.Real{}.
	Clock clock.Clock
	// Interval is the time between scheduled writes; 0 means 60s.
	Interval time.Duration
	// Activity is how many Note calls bring the next write forward; 0 means 50.
	Activity int
	// MinGap is how long after the end of a write an Activity write waits
	// at least; 0 means 1s. A burst of events (a mass start, a registration
	// storm) would otherwise write a checkpoint every Activity events, each
	// contending for the disk with the journal's syncs that the events'
	// answers wait for; the journal holds what happens in between.
	MinGap time.Duration
	// Slow: a write that takes longer doubles the interval; 0 means 500ms.
	Slow time.Duration
	// Fast: a write that takes less restores Interval; 0 means 100ms.
	Fast time.Duration
	// MaxInterval caps the doubling; 0 means 5m.
	MaxInterval time.Duration
	// ShutdownTimeout bounds the final write; 0 means 5s.
	ShutdownTimeout time.Duration
	// OnError, if set, is called with every failed write's error.
	OnError func(error)
	// Refresh: a scheduled write with no Note since the last write is
	// skipped unless that write is older than this (a checkpoint must stay
	// younger than the reader's age limit); 0 means 1h.
	Refresh time.Duration

	once     sync.Once
	kick     chan struct{} // Activity reached, or the timer fired
	quit     chan struct{}
	quitOnce sync.Once
	notes    atomic.Int64
	cur      atomic.Int64 // effective interval
	last     atomic.Int64 // unix nanoseconds of the last successful write; 0: none yet
	ended    atomic.Int64 // unix nanoseconds of the end of the last write; 0: none yet

	// busy is held (a token sent) for the length of a write; a channel, not
	// a mutex, so that a waiter is durably blocked under testing/synctest.
	busy   chan struct{}
	closed bool // guarded by busy: the final write has begun
}

func (s *Scheduler) init() {
	s.once.Do(func() {
		s.kick = make(chan struct{}, 1)
		s.busy = make(chan struct{}, 1)
		s.quit = make(chan struct{})
		s.cur.Store(int64(s.interval()))
	})
}

func (s *Scheduler) clock() clock.Clock {
	if s.Clock == nil {
		return clock.Real{}
	}
	return s.Clock
}

func (s *Scheduler) interval() time.Duration { return orDefault(s.Interval, 60*time.Second) }

func (s *Scheduler) refresh() time.Duration { return orDefault(s.Refresh, time.Hour) }

// lastWrite is when the last successful write began; the zero time if none.
func (s *Scheduler) lastWrite() time.Time {
	if n := s.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

func (s *Scheduler) activity() int64 {
	if s.Activity <= 0 {
		return 50
	}
	return int64(s.Activity)
}

// CurrentInterval is the effective interval now: Interval, or more while writes
// are slow.
func (s *Scheduler) CurrentInterval() time.Duration {
	s.init()
	return time.Duration(s.cur.Load())
}

// Note counts one activity event. It never blocks, and wakes the
// scheduler only when the count reaches Activity: the events after that,
// until the next write, change nothing it has to decide.
func (s *Scheduler) Note() {
	s.init()
	if s.notes.Add(1) == s.activity() {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// Run writes checkpoints until ctx is done or Shutdown is called. It does
// not write a final checkpoint itself: Shutdown does.
func (s *Scheduler) Run(ctx context.Context) {
	s.init()
	fired := make(chan struct{}, 1)
	arm := func() clock.Timer {
		return s.clock().AfterFunc(s.CurrentInterval(), func() {
			select {
			case fired <- struct{}{}:
			default:
			}
		})
	}
	t := arm()
	defer func() { t.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.quit:
			return
		case <-fired:
			if s.notes.Load() == 0 && s.clock().Now().Sub(s.lastWrite()) < s.refresh() {
				// Nothing changed: the checkpoint on disk is still true. An
				// idle daemon writes nothing until it must refresh its age.
				t = arm()
				continue
			}
		case <-s.kick:
			if s.notes.Load() < s.activity() {
				continue // a stale kick: a write since has reset the count
			}
			t.Stop()
			select { // the timer may have fired meanwhile; one write covers both
			case <-fired:
			default:
			}
			if ended := s.ended.Load(); ended != 0 {
				if wait := time.Unix(0, ended).Add(orDefault(s.MinGap, time.Second)).Sub(s.clock().Now()); wait > 0 {
					// Too soon after the last: the write is due when the
					// gap ends (notes are counted, so it is not skipped).
					t = s.clock().AfterFunc(wait, func() {
						select {
						case fired <- struct{}{}:
						default:
						}
					})
					continue
				}
			}
		}
		if errors.Is(s.write(false), ErrClosed) {
			return
		}
		t = arm() // the interval counts from the end of the last write
	}
}

// write performs one write unless the final one has begun, and adapts
// the interval to how long it took.
func (s *Scheduler) write(final bool) error {
	s.busy <- struct{}{}
	defer func() { <-s.busy }()
	if s.closed {
		return ErrClosed
	}
	s.closed = final
	s.notes.Store(0)
	c := s.clock()
	began := c.Now()
	err := s.Write()
	if err == nil {
		s.last.Store(began.UnixNano())
	}
	end := c.Now()
	s.ended.Store(end.UnixNano())
	took := end.Sub(began)
	switch {
	case took > orDefault(s.Slow, 500*time.Millisecond):
		limit := max(orDefault(s.MaxInterval, 5*time.Minute), s.interval())
		s.cur.Store(int64(min(2*s.CurrentInterval(), limit)))
	case took < orDefault(s.Fast, 100*time.Millisecond):
		s.cur.Store(int64(s.interval()))
	}
	if err != nil && s.OnError != nil {
		s.OnError(err)
	}
	return err
}

// Now writes a checkpoint at once, after any write in progress, and
// returns its error; if ctx ends first the write still happens.
func (s *Scheduler) Now(ctx context.Context) error {
	s.init()
	res := make(chan error, 1)
	go func() { res <- s.write(false) }()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown stops Run and writes the final checkpoint, waiting at most
// ShutdownTimeout for it (and for any write in progress before it). A
// write still running then goes on in the background, but nothing is
// written after it.
func (s *Scheduler) Shutdown() error {
	s.init()
	s.quitOnce.Do(func() { close(s.quit) })
	res := make(chan error, 1)
	go func() { res <- s.write(true) }()
	timeout := orDefault(s.ShutdownTimeout, 5*time.Second)
	expired := make(chan struct{})
	t := s.clock().AfterFunc(timeout, func() { close(expired) })
	defer t.Stop()
	select {
	case err := <-res:
		return err
	case <-expired:
		return fmt.Errorf("checkpoint: final write did not finish within %s", timeout)
	}
}
