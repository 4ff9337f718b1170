package policy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// isFresh reports whether tr is closed with no history, as Reset leaves it.
func isFresh(tr Tracker) bool {
	return tr.Breaker == BreakerClosed && tr.Attempt == 0 && tr.Crashes == nil && tr.OpenedAt.IsZero()
}

// defaultPolicy mirrors the defaults package config applies.
var defaultPolicy = Policy{
	Restart:     RestartOnFailure,
	SuccessExit: []int{0},
	Backoff:     defaultBackoff,
	CrashLoop:   CrashLoop{Crashes: 5, Window: time.Minute},
}

func withCooldown(p Policy, d time.Duration) Policy {
	p.CrashLoop.Cooldown = d
	return p
}

var crashClasses = []Class{ClassExitCode, ClassSignal, ClassHeartbeatTimeout, ClassUnresponsive,
	ClassStartTimeout, ClassSpawnFailed, ClassLost}

// Every crash class counts; the N-th crash in the window trips the breaker
// and the ones before it are restarted with a growing delay.
func TestBreakerTripsAfterExactlyNCrashes(t *testing.T) {
	t.Parallel()
	for _, class := range crashClasses {
		t.Run(string(class), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				p := defaultPolicy
				tr := Tracker{Breaker: BreakerClosed}
				for i := range p.CrashLoop.Crashes - 1 {
					d := tr.OnExit(p, Exit{Class: class}, time.Second, time.Now(), 0)
					want := Decision{Restart: true, Delay: p.Backoff.Delay(i, 0), Reason: ReasonCrash}
					if d != want {
						t.Fatalf("crash %d: %+v, want %+v", i+1, d, want)
					}
					time.Sleep(time.Second + d.Delay)
				}
				now := time.Now()
				d := tr.OnExit(p, Exit{Class: class}, time.Second, now, 0)
				if want := (Decision{Reason: ReasonManualActionRequired, Tripped: true}); d != want {
					t.Fatalf("crash %d: %+v, want %+v", p.CrashLoop.Crashes, d, want)
				}
				if tr.Breaker != BreakerOpen || !tr.OpenedAt.Equal(now) || tr.CrashesInWindow(p, now) != 5 {
					t.Fatalf("after the trip: %+v, crashes in window %d", tr, tr.CrashesInWindow(p, now))
				}
				if until, ok := tr.CooldownDue(p); ok {
					t.Fatalf("CooldownDue without a cooldown = %v, true", until)
				}

				// Whatever ends while the breaker is open stays down.
				time.Sleep(time.Second)
				for _, c := range allClasses {
					d := tr.OnExit(p, Exit{Class: c}, time.Second, time.Now(), 0)
					if want := (Decision{Reason: ReasonManualActionRequired}); d != want {
						t.Fatalf("%s while open: %+v, want %+v", c, d, want)
					}
				}
				if tr.Breaker != BreakerOpen {
					t.Fatalf("breaker %q after exits while open, want open", tr.Breaker)
				}
			})
		})
	}
}

// A spawn that keeps failing is never a hot loop: each retry waits longer
// than the one before, and the breaker stops it within seconds.
func TestSpawnFailureBacksOffAndTrips(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := defaultPolicy
		tr := Tracker{}
		start := time.Now()
		var delays []time.Duration
		for {
			d := tr.OnExit(p, Exit{Class: ClassSpawnFailed}, 0, time.Now(), 0.999)
			if !d.Restart {
				if !d.Tripped || d.Reason != ReasonManualActionRequired {
					t.Fatalf("spawn failure stopped with %+v, want the breaker tripped", d)
				}
				break
			}
			if len(delays) > 0 && d.Delay <= delays[len(delays)-1] {
				t.Fatalf("delays %v then %v: not growing", delays, d.Delay)
			}
			delays = append(delays, d.Delay)
			time.Sleep(d.Delay)
		}
		if len(delays) != 4 || delays[0] < 80*time.Millisecond {
			t.Errorf("delays before the trip = %v, want 4 starting at >= 80ms", delays)
		}
		if elapsed := time.Since(start); elapsed > 2*time.Second {
			t.Errorf("breaker tripped after %v, want within 2s", elapsed)
		}
	})
}

// Crashes spread wider than the window never trip; bunched exactly Window
// apart (the edge counts), they do.
func TestBreakerWindow(t *testing.T) {
	t.Parallel()
	p := defaultPolicy
	spacing := p.CrashLoop.Window / time.Duration(p.CrashLoop.Crashes-1) // 5 crashes span exactly the window
	t.Run("just wider", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			tr := Tracker{}
			for i := range 100 {
				d := tr.OnExit(p, Exit{Class: ClassSignal}, 0, time.Now(), 0)
				if !d.Restart || d.Tripped {
					t.Fatalf("crash %d, %v apart: %+v, want a restart", i+1, spacing+1, d)
				}
				if n := tr.CrashesInWindow(p, time.Now()); n > 4 || len(tr.Crashes) > 4 {
					t.Fatalf("crash %d: %d in window, %d remembered; want at most 4", i+1, n, len(tr.Crashes))
				}
				time.Sleep(spacing + 1)
			}
		})
	})
	t.Run("exactly the window", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			tr := Tracker{}
			for range 4 {
				if d := tr.OnExit(p, Exit{Class: ClassSignal}, 0, time.Now(), 0); !d.Restart {
					t.Fatalf("early crash not restarted: %+v", d)
				}
				time.Sleep(spacing)
			}
			if d := tr.OnExit(p, Exit{Class: ClassSignal}, 0, time.Now(), 0); !d.Tripped {
				t.Fatalf("5th crash exactly a window after the 1st: %+v, want tripped", d)
			}
		})
	})
}

func TestCrashesInWindowAgesOut(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := defaultPolicy
		tr := Tracker{}
		for range 3 {
			tr.OnExit(p, Exit{Class: ClassExitCode, Exited: true, Code: 1}, 0, time.Now(), 0)
			time.Sleep(10 * time.Second)
		}
		// Crashes at 0s, 10s, 20s; now is 30s.
		for _, tc := range []struct {
			after time.Duration
			want  int
		}{{0, 3}, {30 * time.Second, 3}, {30*time.Second + 1, 2}, {40*time.Second + 1, 1}, {50*time.Second + 1, 0}} {
			if got := tr.CrashesInWindow(p, time.Now().Add(tc.after)); got != tc.want {
				t.Errorf("CrashesInWindow %v later = %d, want %d", tc.after, got, tc.want)
			}
		}
		if got := tr.CrashesInWindow(Policy{}, time.Now()); got != 0 {
			t.Errorf("CrashesInWindow with the breaker disabled = %d, want 0", got)
		}
	})
}

// An instance that stayed up for ResetAfter restarts from Initial; one that
// fell short by a nanosecond continues the schedule. Uptime resets the
// backoff, not the breaker's window.
func TestResetAfterUptime(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := defaultPolicy
		p.CrashLoop = CrashLoop{Crashes: 10, Window: time.Hour}
		tr := Tracker{}
		crash := func(uptime time.Duration) time.Duration {
			t.Helper()
			time.Sleep(uptime)
			d := tr.OnExit(p, Exit{Class: ClassSignal, Signal: 11}, uptime, time.Now(), 0)
			if !d.Restart {
				t.Fatalf("crash after %v up: %+v, want a restart", uptime, d)
			}
			return d.Delay
		}
		ms := time.Millisecond
		got := []time.Duration{crash(0), crash(ms), crash(time.Minute - 1), crash(time.Minute), crash(0)}
		if want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 100 * ms, 200 * ms}; !slices.Equal(got, want) {
			t.Errorf("delays = %v, want %v", got, want)
		}
		if n := tr.CrashesInWindow(p, time.Now()); n != 5 {
			t.Errorf("crashes in window = %d, want all 5 (uptime does not age crashes)", n)
		}

		tr.OnStable()
		if tr.Attempt != 0 || tr.Breaker != BreakerClosed || len(tr.Crashes) != 5 {
			t.Errorf("after OnStable on a closed breaker: %+v, want attempt 0 and the crashes kept", tr)
		}
		if d := crash(0); d != 100*ms {
			t.Errorf("delay after OnStable = %v, want 100ms", d)
		}
	})
}

// With the default cooldown of 0 the breaker stays open until Reset.
func TestReset(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := defaultPolicy
		tr := Tracker{}
		for range p.CrashLoop.Crashes {
			tr.OnExit(p, Exit{Class: ClassExitCode}, 0, time.Now(), 0)
		}
		if tr.Breaker != BreakerOpen {
			t.Fatalf("breaker %q, want open", tr.Breaker)
		}
		time.Sleep(24 * time.Hour)
		tr.HalfOpen() // a caller bug without a cooldown; it must not matter to Reset
		tr.Reset()
		if !isFresh(tr) {
			t.Fatalf("after Reset: %+v, want a fresh closed tracker", tr)
		}
		if n := tr.CrashesInWindow(p, time.Now()); n != 0 {
			t.Fatalf("crashes in window after Reset = %d, want 0", n)
		}
		d := tr.OnExit(p, Exit{Class: ClassExitCode}, 0, time.Now(), 0)
		if want := (Decision{Restart: true, Delay: 100 * time.Millisecond, Reason: ReasonCrash}); d != want {
			t.Fatalf("first crash after Reset: %+v, want %+v", d, want)
		}
	})
}

func TestCooldownHalfOpen(t *testing.T) {
	t.Parallel()
	p := withCooldown(defaultPolicy, 5*time.Minute)
	// trip crashes the service until the breaker opens and returns the trip decision.
	trip := func(t *testing.T, tr *Tracker) Decision {
		t.Helper()
		for range p.CrashLoop.Crashes - 1 {
			tr.OnExit(p, Exit{Class: ClassSignal}, 0, time.Now(), 0)
		}
		return tr.OnExit(p, Exit{Class: ClassSignal}, 0, time.Now(), 0)
	}
	// halfOpen waits for the cooldown and half-opens the breaker.
	halfOpen := func(t *testing.T, tr *Tracker) {
		t.Helper()
		until, ok := tr.CooldownDue(p)
		if !ok {
			t.Fatalf("CooldownDue on %+v = false, want a time", tr)
		}
		time.Sleep(until.Sub(time.Now()))
		tr.HalfOpen()
		if tr.Breaker != BreakerHalfOpen {
			t.Fatalf("breaker %q after HalfOpen, want half_open", tr.Breaker)
		}
		if _, ok := tr.CooldownDue(p); ok {
			t.Fatal("CooldownDue while half-open = true, want false")
		}
	}

	t.Run("trial crash reopens, surviving trial closes", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			tr := Tracker{}
			d := trip(t, &tr)
			if want := time.Now().Add(5 * time.Minute); !d.Tripped || !d.CooldownUntil.Equal(want) {
				t.Fatalf("trip: %+v, want tripped with cooldown until %v", d, want)
			}
			if until, ok := tr.CooldownDue(p); !ok || !until.Equal(d.CooldownUntil) {
				t.Fatalf("CooldownDue = %v, %v, want %v, true", until, ok, d.CooldownUntil)
			}

			halfOpen(t, &tr)
			time.Sleep(time.Second)
			d = tr.OnExit(p, Exit{Class: ClassExitCode, Exited: true, Code: 2}, time.Second, time.Now(), 0)
			want := Decision{Reason: ReasonManualActionRequired, Tripped: true, CooldownUntil: time.Now().Add(5 * time.Minute)}
			if d != want || tr.Breaker != BreakerOpen || !tr.OpenedAt.Equal(time.Now()) {
				t.Fatalf("trial crash: %+v (tracker %+v), want %+v and the breaker open now", d, tr, want)
			}

			halfOpen(t, &tr)
			time.Sleep(p.Backoff.ResetAfter)
			tr.OnStable()
			if !isFresh(tr) {
				t.Fatalf("after a surviving trial: %+v, want a fresh closed tracker", tr)
			}
			d = tr.OnExit(p, Exit{Class: ClassSignal}, time.Second, time.Now(), 0)
			if want := (Decision{Restart: true, Delay: 100 * time.Millisecond, Reason: ReasonCrash}); d != want {
				t.Fatalf("first crash after the trial: %+v, want %+v", d, want)
			}
		})
	})

	t.Run("trial that ran ResetAfter then crashed closes", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			tr := Tracker{}
			trip(t, &tr)
			halfOpen(t, &tr)
			time.Sleep(p.Backoff.ResetAfter)
			// The exit arrived before the supervisor's stable timer ran OnStable.
			d := tr.OnExit(p, Exit{Class: ClassSignal}, p.Backoff.ResetAfter, time.Now(), 0)
			if want := (Decision{Restart: true, Delay: 100 * time.Millisecond, Reason: ReasonCrash}); d != want {
				t.Fatalf("%+v, want %+v", d, want)
			}
			if tr.Breaker != BreakerClosed || len(tr.Crashes) != 1 {
				t.Fatalf("tracker %+v, want closed with this one crash", tr)
			}
		})
	})

	for _, tc := range []struct {
		class Class
		want  Decision
	}{
		{ClassClean, Decision{Reason: ReasonCleanExit}},
		{ClassStopped, Decision{Reason: ReasonStopped}},
	} {
		t.Run("trial ends "+string(tc.class), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				tr := Tracker{}
				trip(t, &tr)
				halfOpen(t, &tr)
				d := tr.OnExit(p, Exit{Class: tc.class}, time.Second, time.Now(), 0)
				if d != tc.want {
					t.Fatalf("%+v, want %+v", d, tc.want)
				}
				if !isFresh(tr) {
					t.Fatalf("tracker %+v, want a fresh closed tracker", tr)
				}
			})
		})
	}
}

func TestHalfOpenOnlyFromOpen(t *testing.T) {
	t.Parallel()
	for _, b := range []BreakerState{"", BreakerClosed, BreakerHalfOpen} {
		tr := Tracker{Breaker: b}
		tr.HalfOpen()
		if tr.Breaker != b {
			t.Errorf("HalfOpen on %q gave %q, want unchanged", b, tr.Breaker)
		}
		if until, ok := tr.CooldownDue(withCooldown(defaultPolicy, time.Minute)); ok {
			t.Errorf("CooldownDue on %q = %v, true; want false", b, until)
		}
	}
}

// Clean and stopped ends never count toward the breaker, and "always"
// restarts after a clean exit still back off.
func TestNonCrashesNeverTrip(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := defaultPolicy
		p.Restart = RestartAlways
		tr := Tracker{}
		var last time.Duration
		for i := range 50 {
			d := tr.OnExit(p, Exit{Class: ClassClean, Exited: true}, 0, time.Now(), 0)
			if !d.Restart || d.Reason != ReasonAlways || d.Delay < last || d.Delay <= 0 {
				t.Fatalf("clean exit %d: %+v (previous delay %v), want a restart_always with a growing delay", i+1, d, last)
			}
			last = d.Delay
			if d := tr.OnExit(p, Exit{Class: ClassStopped}, 0, time.Now(), 0); d != (Decision{Reason: ReasonStopped}) {
				t.Fatalf("stopped exit %d: %+v, want no restart", i+1, d)
			}
		}
		if last != p.Backoff.Max {
			t.Errorf("delay after 50 clean exits = %v, want the %v cap", last, p.Backoff.Max)
		}
		if tr.Breaker != BreakerClosed || tr.Crashes != nil {
			t.Errorf("tracker %+v, want closed with no crashes", tr)
		}
	})
}

func TestBreakerDisabled(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := defaultPolicy
		p.CrashLoop = CrashLoop{Window: time.Minute}
		tr := Tracker{}
		for i := range 100 {
			if d := tr.OnExit(p, Exit{Class: ClassSignal}, 0, time.Now(), 0); !d.Restart {
				t.Fatalf("crash %d with the breaker disabled: %+v, want a restart", i+1, d)
			}
		}
		if tr.Crashes != nil || tr.CrashesInWindow(p, time.Now()) != 0 {
			t.Errorf("tracker %+v kept crashes with the breaker disabled", tr)
		}
	})
}

// restart = "never" restarts nothing, so there is no storm to break: crashes
// are counted but the service just stays down. The policy is passed per
// call, so a reload that changes it takes effect at the next exit.
func TestRestartNeverDoesNotTrip(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := defaultPolicy
		p.Restart = RestartNever
		tr := Tracker{}
		for i := range 10 {
			if d := tr.OnExit(p, Exit{Class: ClassSignal}, 0, time.Now(), 0); d != (Decision{Reason: ReasonRestartNever}) {
				t.Fatalf("crash %d: %+v, want restart_never", i+1, d)
			}
		}
		if n := tr.CrashesInWindow(p, time.Now()); tr.Breaker != BreakerClosed || n != 5 || len(tr.Crashes) != 5 {
			t.Errorf("tracker %+v (%d in window), want closed with the 5 newest crashes", tr, n)
		}
		if d := tr.OnExit(p, Exit{Class: ClassClean}, 0, time.Now(), 0); d != (Decision{Reason: ReasonCleanExit}) {
			t.Errorf("clean exit: %+v, want clean_exit", d)
		}

		// A reload to "always" keeps the memory: a clean exit still does not
		// count, but the next crash is the 5th in the window.
		p.Restart = RestartAlways
		if d := tr.OnExit(p, Exit{Class: ClassClean}, 0, time.Now(), 0); !d.Restart || d.Tripped || d.Reason != ReasonAlways {
			t.Errorf("clean exit after the reload: %+v, want restart_always", d)
		}
		if d := tr.OnExit(p, Exit{Class: ClassSignal}, 0, time.Now(), 0); !d.Tripped {
			t.Errorf("crash after the reload: %+v, want tripped", d)
		}
	})
}

// A copy taken for a checkpoint is not disturbed by later exits, and a
// tracker survives a JSON round trip.
func TestTrackerSnapshot(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := withCooldown(defaultPolicy, time.Minute)
		tr := Tracker{}
		for range 3 {
			tr.OnExit(p, Exit{Class: ClassSignal}, 0, time.Now(), 0)
			time.Sleep(time.Second)
		}
		snap := tr
		snapCrashes := slices.Clone(tr.Crashes)
		time.Sleep(time.Hour)
		tr.OnExit(p, Exit{Class: ClassSignal}, 0, time.Now(), 0)
		if !slices.Equal(snap.Crashes, snapCrashes) {
			t.Fatalf("snapshot crashes changed from %v to %v", snapCrashes, snap.Crashes)
		}

		for range 4 {
			tr.OnExit(p, Exit{Class: ClassSignal}, 0, time.Now(), 0)
		}
		b, err := json.Marshal(tr)
		if err != nil {
			t.Fatal(err)
		}
		var back Tracker
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back.Attempt != tr.Attempt || back.Breaker != BreakerOpen || !back.OpenedAt.Equal(tr.OpenedAt) ||
			!slices.EqualFunc(back.Crashes, tr.Crashes, time.Time.Equal) {
			t.Fatalf("JSON round trip: %s gave %+v, want %+v", b, back, tr)
		}
		if !strings.Contains(string(b), `"breaker":"open"`) {
			t.Errorf("JSON %s lacks the breaker state", b)
		}
		if b, _ := json.Marshal(Tracker{Breaker: BreakerClosed}); string(b) != `{"attempt":0,"breaker":"closed"}` {
			t.Errorf("JSON of a fresh tracker = %s", b)
		}
	})
}

// The zero Tracker is a closed breaker and reports "closed" once used.
func TestZeroTracker(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var tr Tracker
		if d := tr.OnExit(defaultPolicy, Exit{Class: ClassSignal}, 0, time.Now(), 0); !d.Restart {
			t.Fatalf("first crash on a zero tracker: %+v, want a restart", d)
		}
		if tr.Breaker != BreakerClosed {
			t.Fatalf("breaker %q, want closed", tr.Breaker)
		}
	})
}

// TestTranscript is a golden transcript: a sequence of exits and operator
// actions and what the tracker decided, rendered one line per step.
func TestTranscript(t *testing.T) {
	t.Parallel()
	p := Policy{
		Restart:   RestartOnFailure,
		Backoff:   Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: 0.2, ResetAfter: time.Minute},
		CrashLoop: CrashLoop{Crashes: 3, Window: 10 * time.Second, Cooldown: time.Minute},
	}
	steps := []struct {
		at     time.Duration // since the start
		op     string        // a class, "stable", "half_open" or "reset"
		uptime time.Duration
		want   string
	}{
		{0, "exit_code", 0, "restart in 90ms (crash) | closed in_window=1 attempt=1"},
		{1 * time.Second, "clean", time.Second, "stay down (clean_exit) | closed in_window=1 attempt=1"},
		{2 * time.Second, "signal", time.Second, "restart in 180ms (crash) | closed in_window=2 attempt=2"},
		{3 * time.Second, "stopped", time.Second, "stay down (stopped_by_operator) | closed in_window=2 attempt=2"},
		{20 * time.Second, "exit_code", 17 * time.Second, "restart in 360ms (crash) | closed in_window=1 attempt=3"},
		{21 * time.Second, "unresponsive", time.Second, "restart in 720ms (crash) | closed in_window=2 attempt=4"},
		{22 * time.Second, "lost", time.Second, "trip (manual_action_required) until +1m22s | open in_window=3 attempt=4"},
		{30 * time.Second, "stopped", 0, "stay down (manual_action_required) until +1m22s | open in_window=3 attempt=4"},
		{82 * time.Second, "half_open", 0, "half_open in_window=0 attempt=4"},
		{83 * time.Second, "start_timeout", time.Second, "trip (manual_action_required) until +2m23s | open in_window=1 attempt=4"},
		{143 * time.Second, "half_open", 0, "half_open in_window=0 attempt=4"},
		{203 * time.Second, "stable", 0, "closed in_window=0 attempt=0"},
		{204 * time.Second, "heartbeat_timeout", time.Second, "restart in 90ms (crash) | closed in_window=1 attempt=1"},
		{205 * time.Second, "spawn_failed", 0, "restart in 180ms (crash) | closed in_window=2 attempt=2"},
		{300 * time.Second, "exit_code", 90 * time.Second, "restart in 90ms (crash) | closed in_window=1 attempt=1"},
		{301 * time.Second, "reset", 0, "closed in_window=0 attempt=0"},
		{302 * time.Second, "signal", 0, "restart in 90ms (crash) | closed in_window=1 attempt=1"},
	}
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		tr := Tracker{Breaker: BreakerClosed}
		var got, want strings.Builder
		for _, s := range steps {
			time.Sleep(start.Add(s.at).Sub(time.Now()))
			now := time.Now()
			line := ""
			switch s.op {
			case "stable":
				tr.OnStable()
			case "half_open":
				tr.HalfOpen()
			case "reset":
				tr.Reset()
			default:
				d := tr.OnExit(p, Exit{Class: Class(s.op)}, s.uptime, now, 0.5)
				line = renderDecision(d, start) + " | "
			}
			line += fmt.Sprintf("%s in_window=%d attempt=%d", tr.Breaker, tr.CrashesInWindow(p, now), tr.Attempt)
			fmt.Fprintf(&got, "+%v %s %s\n", s.at, s.op, line)
			fmt.Fprintf(&want, "+%v %s %s\n", s.at, s.op, s.want)
		}
		if got.String() != want.String() {
			t.Errorf("transcript:\n%s\nwant:\n%s", got.String(), want.String())
		}
	})
}

func renderDecision(d Decision, start time.Time) string {
	s := "stay down"
	switch {
	case d.Restart:
		s = fmt.Sprintf("restart in %v", d.Delay)
	case d.Tripped:
		s = "trip"
	}
	s += fmt.Sprintf(" (%s)", d.Reason)
	if !d.CooldownUntil.IsZero() {
		s += fmt.Sprintf(" until +%v", d.CooldownUntil.Sub(start))
	}
	return s
}
