package checkpoint

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Inside a synctest bubble clock.Real{} and time.Sleep are fake time, so
// these tests wait on time without taking any.

// recWrites is a Write that records when each write began (as an offset
// from the bubble's start), how many ran at once, and sleeps as slow says.
type recWrites struct {
	start    time.Time
	mu       sync.Mutex
	began    []time.Duration
	inflight atomic.Int32
	overlap  atomic.Bool
	slow     func(n int) time.Duration // how long write n (from 1) takes
	err      error                     // guarded by mu
}

func newRec() *recWrites { return &recWrites{start: time.Now()} }

func (r *recWrites) write() error {
	if r.inflight.Add(1) > 1 {
		r.overlap.Store(true)
	}
	defer r.inflight.Add(-1)
	r.mu.Lock()
	r.began = append(r.began, time.Since(r.start))
	n, err := len(r.began), r.err
	r.mu.Unlock()
	if r.slow != nil {
		time.Sleep(r.slow(n))
	}
	return err
}

func (r *recWrites) fail(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

func (r *recWrites) times() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.began...)
}

func (r *recWrites) count() int { return len(r.times()) }

// run starts s.Run and returns a func that stops it and waits for it.
func run(t *testing.T, s *Scheduler) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	return func() {
		cancel()
		<-done
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestSchedulerInterval(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRec()
		s := &Scheduler{Write: r.write, Interval: 10 * time.Second, Refresh: time.Nanosecond}
		stop := run(t, s)
		defer stop()
		time.Sleep(35 * time.Second)
		synctest.Wait()
		if got, want := r.times(), []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second}; !equalDurations(got, want) {
			t.Errorf("writes at %v, want %v", got, want)
		}
		if s.CurrentInterval() != 10*time.Second {
			t.Errorf("interval %v", s.CurrentInterval())
		}
	})
}

func TestSchedulerDefaults(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRec()
		s := &Scheduler{Write: r.write}
		stop := run(t, s)
		defer stop()
		time.Sleep(59 * time.Second)
		synctest.Wait()
		if n := r.count(); n != 0 {
			t.Fatalf("%d writes before 60s", n)
		}
		for range 49 {
			s.Note()
		}
		synctest.Wait()
		if n := r.count(); n != 0 {
			t.Fatalf("%d writes after 49 notes", n)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := r.count(); n != 1 {
			t.Fatalf("%d writes at 60s", n)
		}
	})
}

// TestSchedulerSkipsWhenIdle: with no activity since the last write, the
// interval writes nothing until the checkpoint must be refreshed; the
// first write always happens, and any activity brings writes back.
func TestSchedulerSkipsWhenIdle(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRec()
		s := &Scheduler{Write: r.write, Interval: 10 * time.Second, Refresh: time.Minute}
		stop := run(t, s)
		defer stop()
		time.Sleep(75 * time.Second)
		synctest.Wait()
		if got, want := r.times(), []time.Duration{10 * time.Second, 70 * time.Second}; !equalDurations(got, want) {
			t.Fatalf("idle writes at %v, want %v", got, want)
		}
		s.Note()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got, want := r.times(), []time.Duration{10 * time.Second, 70 * time.Second, 80 * time.Second}; !equalDurations(got, want) {
			t.Fatalf("writes after a note at %v, want %v", got, want)
		}
	})
}

func TestSchedulerActivity(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRec()
		s := &Scheduler{Write: r.write, Interval: time.Hour, Activity: 5}
		stop := run(t, s)
		defer stop()
		for round := 1; round <= 3; round++ {
			time.Sleep(time.Minute)
			for range 4 {
				s.Note()
			}
			synctest.Wait()
			if n := r.count(); n != round-1 {
				t.Fatalf("round %d: %d writes after 4 notes", round, n)
			}
			s.Note()
			synctest.Wait()
			if n := r.count(); n != round {
				t.Fatalf("round %d: %d writes after 5 notes", round, n)
			}
		}
		// An early write restarts the interval.
		time.Sleep(time.Hour - time.Second)
		synctest.Wait()
		if n := r.count(); n != 3 {
			t.Fatalf("%d writes before the interval after the last write", n)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := r.count(); n != 4 {
			t.Fatalf("%d writes an interval after the last write", n)
		}
	})
}

// TestSchedulerMinGap: a burst of events writes a checkpoint at once, then
// at most one per MinGap, and the events of the burst's end are written
// when the gap ends, not at the next interval.
func TestSchedulerMinGap(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRec()
		s := &Scheduler{Write: r.write, Interval: time.Hour, Activity: 5, MinGap: time.Second}
		stop := run(t, s)
		defer stop()
		// 100 events in 0.1s: the first 5 write at once, the rest wait.
		for range 100 {
			s.Note()
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		if got := r.times(); len(got) != 1 || got[0] != 4*time.Millisecond {
			t.Fatalf("writes during the burst began at %v; want one, at 4ms", got)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := r.times(); len(got) != 2 || got[1] != time.Second+4*time.Millisecond {
			t.Fatalf("writes began at %v; want a second one when the gap after the first ended", got)
		}
		// Quiet: nothing more until the interval (which ends at 1h + 1.004s).
		time.Sleep(time.Hour - 200*time.Millisecond)
		synctest.Wait()
		if n := r.count(); n != 2 {
			t.Fatalf("%d writes after the burst; want 2 until the interval", n)
		}
		// Later activity, past the gap, writes at once again.
		for range 5 {
			s.Note()
		}
		synctest.Wait()
		if n := r.count(); n != 3 {
			t.Fatalf("%d writes after activity past the gap; want 3", n)
		}
	})
}

func TestSchedulerSlowWrites(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRec()
		r.slow = func(n int) time.Duration {
			if n <= 4 {
				return time.Second
			}
			return 0
		}
		s := &Scheduler{Write: r.write, Interval: 10 * time.Second, MaxInterval: time.Minute, Refresh: time.Nanosecond}
		stop := run(t, s)
		defer stop()
		s2 := 1 * time.Second
		// Each slow write doubles the interval (20s, 40s, then 60s at the
		// cap); the interval counts from the end of the last write; the
		// first fast write restores 10s.
		want := []time.Duration{10 * s2, 31 * s2, 72 * s2, 133 * s2, 194 * s2, 204 * s2, 214 * s2}
		intervals := []time.Duration{20 * s2, 40 * s2, 60 * s2, 60 * s2, 10 * s2}
		for i, at := range want[:5] {
			time.Sleep(at + 2*s2 - time.Since(r.start))
			synctest.Wait()
			if got := s.CurrentInterval(); got != intervals[i] {
				t.Errorf("after write %d: interval %v, want %v", i+1, got, intervals[i])
			}
		}
		time.Sleep(want[6] + s2 - time.Since(r.start))
		synctest.Wait()
		if got := r.times(); !equalDurations(got, want) {
			t.Errorf("writes at %v, want %v", got, want)
		}
	})
}

func TestSchedulerNow(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRec()
		r.slow = func(int) time.Duration { return time.Second }
		var reported atomic.Int32
		s := &Scheduler{Write: r.write, Interval: 10 * time.Second, OnError: func(error) { reported.Add(1) }, Refresh: time.Nanosecond}
		stop := run(t, s)
		defer stop()
		if err := s.Now(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := r.times(); !equalDurations(got, []time.Duration{0}) || time.Since(r.start) != time.Second {
			t.Fatalf("writes at %v, returned after %v", got, time.Since(r.start))
		}
		// A request during a scheduled write waits for it, then writes.
		time.Sleep(9*time.Second + 500*time.Millisecond) // the scheduled write runs 10s..11s
		boom := errors.New("boom")
		r.fail(boom)
		if err := s.Now(t.Context()); !errors.Is(err, boom) {
			t.Fatalf("Now: %v, want the write's error", err)
		}
		if got := r.times(); !equalDurations(got, []time.Duration{0, 10 * time.Second, 11 * time.Second}) || time.Since(r.start) != 12*time.Second {
			t.Fatalf("writes at %v, returned at %v", got, time.Since(r.start))
		}
		if r.overlap.Load() {
			t.Error("writes overlapped")
		}
		if reported.Load() != 1 {
			t.Errorf("OnError called %d times, want 1", reported.Load())
		}
		// A caller that gives up gets its context's error.
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		if err := s.Now(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Now with a short deadline: %v", err)
		}
		time.Sleep(time.Second) // its write goes on; let it end inside the bubble
		synctest.Wait()
	})
}

func TestSchedulerShutdown(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRec()
		s := &Scheduler{Write: r.write, Interval: 10 * time.Second, Refresh: time.Nanosecond}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var ran atomic.Bool
		go func() { s.Run(ctx); ran.Store(true) }()
		time.Sleep(15 * time.Second)
		if err := s.Shutdown(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if !ran.Load() {
			t.Error("Run still running after Shutdown")
		}
		if got := r.times(); !equalDurations(got, []time.Duration{10 * time.Second, 15 * time.Second}) {
			t.Errorf("writes at %v", got)
		}
		time.Sleep(time.Minute)
		if err := s.Now(t.Context()); !errors.Is(err, ErrClosed) {
			t.Errorf("Now after Shutdown: %v", err)
		}
		if err := s.Shutdown(); !errors.Is(err, ErrClosed) {
			t.Errorf("second Shutdown: %v", err)
		}
		if n := r.count(); n != 2 {
			t.Errorf("%d writes after Shutdown", n)
		}
	})
}

func TestSchedulerShutdownWithoutRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRec()
		s := &Scheduler{Write: r.write}
		if err := s.Shutdown(); err != nil || r.count() != 1 {
			t.Fatalf("Shutdown: %v, %d writes", err, r.count())
		}
	})
}

func TestSchedulerShutdownTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRec()
		r.slow = func(int) time.Duration { return time.Hour }
		s := &Scheduler{Write: r.write, Interval: 10 * time.Second, ShutdownTimeout: 3 * time.Second, Refresh: time.Nanosecond}
		stop := run(t, s)
		defer stop()
		time.Sleep(11 * time.Second) // a scheduled write hangs since 10s
		began := time.Now()
		err := s.Shutdown()
		if err == nil || !strings.Contains(err.Error(), "did not finish within 3s") {
			t.Fatalf("Shutdown: %v", err)
		}
		if took := time.Since(began); took != 3*time.Second {
			t.Errorf("Shutdown returned after %v", took)
		}
		// The hung write ends eventually; the final one still runs after it,
		// never beside it, and nothing after that.
		time.Sleep(3 * time.Hour)
		synctest.Wait()
		if r.overlap.Load() || r.count() != 2 {
			t.Errorf("overlap %v, %d writes", r.overlap.Load(), r.count())
		}
	})
}
