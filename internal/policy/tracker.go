package policy

import "time"

// CrashLoop configures the circuit breaker against restart storms.
type CrashLoop struct {
	// Crashes within Window open the breaker; 0 disables it, and then no
	// crash times are kept at all.
	Crashes int
	// Window is the sliding window crashes are counted in. A crash exactly
	// Window ago still counts.
	Window time.Duration
	// Cooldown is how long an open breaker waits before half-opening for one
	// trial start; 0 keeps it open until Reset.
	Cooldown time.Duration
}

// BreakerState is the crash-loop breaker's state, shown verbatim as
// `breaker` in every interface.
type BreakerState string

const (
	// BreakerClosed: restarts follow the policy. A Tracker's zero Breaker
	// ("") means closed too; OnExit and Reset write "closed".
	BreakerClosed BreakerState = "closed"
	// BreakerOpen: the service is failed and is not started again until
	// Reset, or until its cooldown half-opens the breaker.
	BreakerOpen BreakerState = "open"
	// BreakerHalfOpen: one trial instance may run; its crash opens the
	// breaker again, its survival closes it.
	BreakerHalfOpen BreakerState = "half_open"
)

// Policy is everything that decides a service's restarts, taken from its
// config.
type Policy struct {
	Restart     Restart
	SuccessExit []int // exit codes that are clean besides 0; used by the caller's Classify
	Backoff     Backoff
	CrashLoop   CrashLoop
}

// Reason says why a Decision was made; the values appear verbatim in
// `status --json` and in events.
type Reason string

const (
	// ReasonCrash: the instance crashed and is restarted after Delay.
	ReasonCrash Reason = "crash"
	// ReasonAlways: the instance ended cleanly and restart = "always" starts
	// it again after Delay.
	ReasonAlways Reason = "restart_always"
	// ReasonCleanExit: the instance ended cleanly and, under on-failure or
	// never, stays down.
	ReasonCleanExit Reason = "clean_exit"
	// ReasonStopped: vigil stopped the instance on purpose; policy never
	// restarts it.
	ReasonStopped Reason = "stopped_by_operator"
	// ReasonRestartNever: the instance crashed and restart = "never" leaves it
	// down.
	ReasonRestartNever Reason = "restart_never"
	// ReasonManualActionRequired: the crash-loop breaker is open; the service
	// stays failed until `vigil reset` or a cooldown's trial.
	ReasonManualActionRequired Reason = "manual_action_required"
	// ReasonHalfOpenTrial: the reason the supervisor shows when it starts the
	// one trial instance after HalfOpen. OnExit never returns it.
	ReasonHalfOpenTrial Reason = "half_open_trial"
)

// Decision is what to do about an instance that ended.
type Decision struct {
	// Restart says to start the service again after Delay.
	Restart bool
	Delay   time.Duration
	Reason  Reason
	// Tripped is true when this end opened the breaker (a closed breaker
	// reaching its crash count, or a half-open trial crashing).
	Tripped bool
	// CooldownUntil is when the open breaker may half-open; zero unless the
	// breaker is open and has a cooldown.
	CooldownUntil time.Time
}

// Tracker is one service's restart memory: the consecutive-restart count
// that drives the backoff and the recent crash times that drive the breaker.
// It is a plain value with no locks, owned by the supervisor's event loop;
// its zero value is a closed breaker with no history. The fields are
// exported and JSON-tagged so a checkpoint can store and restore it. Methods
// never write into the backing array of Crashes, so a copy taken for a
// checkpoint stays intact while the loop goes on.
type Tracker struct {
	// Attempt is the number of consecutive automatic restarts so far, the n
	// of Backoff.Delay for the next one.
	Attempt int `json:"attempt"`
	// Crashes are the times of the latest crashes still inside the window,
	// oldest first; never more than CrashLoop.Crashes of them.
	Crashes []time.Time `json:"crashes,omitempty"`
	// Breaker is the breaker's state.
	Breaker BreakerState `json:"breaker"`
	// OpenedAt is when the breaker last opened; zero while closed.
	OpenedAt time.Time `json:"opened_at,omitzero"`
}

// OnExit records the end of an instance that ran for uptime and ended at now,
// and decides what to do; u in [0,1) is the caller's random number for the
// jitter.
//
// In order: an instance that ran at least Backoff.ResetAfter counts as stable
// (see OnStable). A crash is recorded in the window. If the breaker is open,
// nothing restarts. A crash of a half-open trial opens the breaker again at
// once; any other end of the trial closes it. With a closed breaker, a crash
// that would be restarted and that brings the count in the window to
// CrashLoop.Crashes opens the breaker (Tripped). Otherwise ShouldRestart
// decides, and a restart waits Backoff.Delay(Attempt, u) and counts as the
// next attempt. Planned restarts must not reach OnExit as crashes: the
// caller passes ClassStopped for them, or does not call OnExit at all.
func (t *Tracker) OnExit(p Policy, e Exit, uptime time.Duration, now time.Time, u float64) Decision {
	if uptime >= p.Backoff.ResetAfter {
		t.OnStable()
	}
	crash := e.Class.IsCrash()
	if crash {
		t.recordCrash(p.CrashLoop, now)
	}
	switch {
	case t.Breaker == BreakerOpen:
		until, _ := t.CooldownDue(p)
		return Decision{Reason: ReasonManualActionRequired, CooldownUntil: until}
	case t.Breaker == BreakerHalfOpen && crash:
		return t.trip(p, now)
	case t.Breaker == BreakerHalfOpen:
		t.Reset() // the trial ended without crashing: a fresh start
	}
	t.Breaker = BreakerClosed

	if !ShouldRestart(p.Restart, e.Class) {
		return Decision{Reason: stayDownReason(e.Class)}
	}
	if crash && p.CrashLoop.Crashes > 0 && len(t.Crashes) >= p.CrashLoop.Crashes {
		return t.trip(p, now)
	}
	d := Decision{Restart: true, Delay: p.Backoff.Delay(t.Attempt, u), Reason: ReasonAlways}
	if crash {
		d.Reason = ReasonCrash
	}
	t.Attempt++
	return d
}

// stayDownReason names why an end that is not restarted stays down.
func stayDownReason(c Class) Reason {
	switch c {
	case ClassStopped:
		return ReasonStopped
	case ClassClean:
		return ReasonCleanExit
	}
	return ReasonRestartNever
}

// trip opens the breaker at now.
func (t *Tracker) trip(p Policy, now time.Time) Decision {
	t.Breaker, t.OpenedAt = BreakerOpen, now
	until, _ := t.CooldownDue(p)
	return Decision{Reason: ReasonManualActionRequired, Tripped: true, CooldownUntil: until}
}

// recordCrash adds a crash at now, forgets crashes that left the window and
// keeps at most the cl.Crashes newest, into a new slice (see Tracker).
func (t *Tracker) recordCrash(cl CrashLoop, now time.Time) {
	if cl.Crashes <= 0 {
		t.Crashes = nil
		return
	}
	cutoff := now.Add(-cl.Window)
	kept := make([]time.Time, 0, len(t.Crashes)+1)
	for _, c := range t.Crashes {
		if !c.Before(cutoff) {
			kept = append(kept, c)
		}
	}
	kept = append(kept, now)
	t.Crashes = kept[max(0, len(kept)-cl.Crashes):]
}

// OnStable is called once the current instance has stayed up for
// Backoff.ResetAfter (OnExit also applies it lazily from the uptime). The
// backoff starts again from Initial; a half-open breaker closes and its old
// crashes are forgotten. In a closed breaker the crash times stay: uptime
// resets the backoff, while the window alone ages crashes out.
func (t *Tracker) OnStable() {
	if t.Breaker == BreakerHalfOpen {
		t.Reset()
		return
	}
	t.Attempt = 0
}

// Reset is the operator's `vigil reset`: the breaker closes and the crash
// times and restart count are cleared.
func (t *Tracker) Reset() {
	*t = Tracker{Breaker: BreakerClosed}
}

// CooldownDue reports when an open breaker may half-open: OpenedAt plus the
// cooldown. ok is false unless the breaker is open and has a cooldown.
func (t *Tracker) CooldownDue(p Policy) (until time.Time, ok bool) {
	if t.Breaker != BreakerOpen || p.CrashLoop.Cooldown <= 0 {
		return time.Time{}, false
	}
	return t.OpenedAt.Add(p.CrashLoop.Cooldown), true
}

// HalfOpen moves an open breaker to half-open, allowing one trial start; the
// caller invokes it when CooldownDue's time has come. In any other state it
// does nothing.
func (t *Tracker) HalfOpen() {
	if t.Breaker == BreakerOpen {
		t.Breaker = BreakerHalfOpen
	}
}

// CrashesInWindow counts the recorded crashes within p's window ending at
// now; 0 when the breaker is disabled.
func (t *Tracker) CrashesInWindow(p Policy, now time.Time) int {
	if p.CrashLoop.Crashes <= 0 {
		return 0
	}
	cutoff := now.Add(-p.CrashLoop.Window)
	n := 0
	for _, c := range t.Crashes {
		if !c.Before(cutoff) {
			n++
		}
	}
	return n
}
