package recovery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vigil-dev/vigil/internal/clock"
)

var (
	// ErrStageFailed is wrapped by the *StageError Run and Retry return
	// when a stage has failed MaxAttempts times.
	ErrStageFailed = errors.New("recovery: stage failed")
	// ErrStageTimeout is wrapped by the error of an attempt that ran
	// longer than StageTimeout.
	ErrStageTimeout = errors.New("recovery: stage timed out")
	// ErrInterrupted is wrapped by the error recorded for an attempt that
	// a daemon stop cut short (found persisted by Run).
	ErrInterrupted = errors.New("recovery: attempt interrupted")
	// ErrNotFailed: Retry was asked while no stage has failed.
	ErrNotFailed = errors.New("recovery: not in a failed stage")
	// ErrRunning: Run or Retry was called while another is running.
	ErrRunning = errors.New("recovery: already running")
)

// StageError is the error for a stage that failed for good.
type StageError struct {
	Stage     Stage // the working stage that failed (not X_failed)
	Attempts  int
	LastError string
	cause     error // the step's error, when it failed in this process
}

func (e *StageError) Error() string {
	return fmt.Sprintf("recovery: stage %q failed after %d attempts: %s", e.Stage, e.Attempts, e.LastError)
}

func (e *StageError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrStageFailed}
	}
	return []error{ErrStageFailed, e.cause}
}

// Step does one working stage's work. It may read and replace st.Data; its
// other changes to st are ignored. It must return once ctx is done, and be
// idempotent: an interrupted attempt is run again.
type Step func(ctx context.Context, st *State) error

// Machine runs a recovery. Its zero value with Store set is ready to use.
// Status may be called concurrently with Run and Retry; Run and Retry do
// not run concurrently with each other (the second gets ErrRunning).
type Machine struct {
	// Store persists the state; required.
	Store *Store
	// Steps holds the work of detecting, inventorying, restoring and
	// reconciling; a missing Step is a no-op that succeeds.
	Steps map[Stage]Step
	// Clock gives the time of transitions and arms the stage timeout;
	// nil means clock.Real{}.
	Clock clock.Clock
	// StageTimeout bounds one attempt; 0 means 30s. Its ctx is cancelled
	// then and the attempt counts as failed; a Step that ignores that is
	// abandoned (its result and its changes to State are discarded).
	StageTimeout time.Duration
	// MaxAttempts is how many failed attempts make a stage X_failed; 0 means 3.
	MaxAttempts int
	// BeforeStage, if set, is called with the state of each attempt after
	// it is persisted and before its Step runs (a fault point).
	BeforeStage func(State)
	// OnTransition, if set, is called for every transition after it is
	// persisted (the daemon journals and publishes it).
	OnTransition func(Transition, State)

	mu      sync.Mutex
	cur     *State // the latest state Run or Retry persisted or loaded
	running bool
}

func (m *Machine) clock() clock.Clock {
	if m.Clock == nil {
		return clock.Real{}
	}
	return m.Clock
}

func (m *Machine) timeout() time.Duration {
	if m.StageTimeout <= 0 {
		return 30 * time.Second
	}
	return m.StageTimeout
}

func (m *Machine) maxAttempts() int {
	if m.MaxAttempts <= 0 {
		return 3
	}
	return m.MaxAttempts
}

// Status returns the current state: the latest one Run or Retry reached
// in this process, else the persisted one, else a state at Live.
func (m *Machine) Status() (State, error) {
	m.mu.Lock()
	cur := m.cur // never changed once published
	m.mu.Unlock()
	if cur != nil {
		return cur.clone(), nil
	}
	if m.Store == nil {
		return State{}, errors.New("recovery: Machine.Store is nil")
	}
	st, ok, err := m.Store.Load()
	if !ok && err == nil {
		st.Stage = Live
	}
	return st, err
}

// Run starts a recovery from Crashed or resumes the persisted one, and runs
// every remaining stage. A persisted working stage X was interrupted: it is
// run again as attempt+1, or goes to X_failed if that exceeds MaxAttempts.
// On success the state is Live and the file is gone. On a stage's final
// failure X_failed is persisted and the error is a *StageError; a persisted
// X_failed returns that error at once. If ctx is done Run returns its error
// and leaves the persisted state to be resumed.
func (m *Machine) Run(ctx context.Context) (State, error) {
	return m.start(ctx, false)
}

// Retry is the operator's retry: from X_failed it goes to X with attempt 1
// and continues as Run does. In any other stage it returns ErrNotFailed.
func (m *Machine) Retry(ctx context.Context) (State, error) {
	return m.start(ctx, true)
}

func (m *Machine) start(ctx context.Context, retry bool) (State, error) {
	if m.Store == nil {
		return State{}, errors.New("recovery: Machine.Store is nil")
	}
	m.mu.Lock()
	if m.running {
		m.mu.Unlock()
		return State{}, ErrRunning
	}
	m.running = true
	m.mu.Unlock()
	defer func() { m.mu.Lock(); m.running = false; m.mu.Unlock() }()

	st, ok, err := m.Store.Load()
	if err != nil {
		return State{}, err
	}
	if !ok {
		now := m.clock().Now()
		st = State{Stage: Crashed, StartedAt: now, UpdatedAt: now}
	}
	m.publish(st)
	var cause error // the latest failed attempt's error
	switch {
	case retry && !st.Stage.Failed():
		return st, fmt.Errorf("%w (stage %q)", ErrNotFailed, st.Stage)
	case retry:
		err = m.transition(&st, st.Stage.retried(), 1, nil)
	case st.Stage == Crashed:
		err = m.transition(&st, Detecting, 1, nil)
	case st.Stage.Working():
		cause = fmt.Errorf("%w: %s attempt %d did not finish (the daemon stopped)", ErrInterrupted, st.Stage, st.Attempt)
		err = m.fail(&st, cause)
	}
	if err != nil {
		return st, err
	}
	for st.Stage.Working() {
		if m.BeforeStage != nil {
			m.BeforeStage(st.clone())
		}
		if err := ctx.Err(); err != nil {
			return st, fmt.Errorf("recovery: stopped before %s attempt %d: %w", st.Stage, st.Attempt, err)
		}
		next, stepErr := m.attempt(ctx, st)
		if err := ctx.Err(); err != nil {
			return st, fmt.Errorf("recovery: stopped during %s attempt %d: %w", st.Stage, st.Attempt, err)
		}
		if stepErr == nil {
			err = m.transition(&next, st.Stage.next(), 1, nil)
			st = next
		} else {
			cause = stepErr
			err = m.fail(&st, cause)
		}
		if err != nil {
			return st, err
		}
	}
	if st.Stage.Failed() {
		return st, &StageError{Stage: st.Stage.retried(), Attempts: st.Attempt, LastError: st.LastError, cause: cause}
	}
	return st, nil
}

// fail records a failed attempt: a retry of the stage, or its failure state.
func (m *Machine) fail(st *State, cause error) error {
	if st.Attempt >= m.maxAttempts() {
		return m.transition(st, st.Stage.failure(), st.Attempt, cause)
	}
	return m.transition(st, st.Stage, st.Attempt+1, cause)
}

// attempt runs the Step of st.Stage on a copy of st and returns the copy.
func (m *Machine) attempt(ctx context.Context, st State) (State, error) {
	step := m.Steps[st.Stage]
	if step == nil {
		return st, nil
	}
	timeoutErr := fmt.Errorf("%w: %s attempt %d ran longer than %v", ErrStageTimeout, st.Stage, st.Attempt, m.timeout())
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	expired := make(chan struct{})
	t := m.clock().AfterFunc(m.timeout(), func() { cancel(timeoutErr); close(expired) })
	defer t.Stop()

	work := st.clone()
	done := make(chan error, 1)
	go func() { done <- step(sctx, &work) }()
	select {
	case err := <-done:
		switch {
		case context.Cause(sctx) == timeoutErr:
			return st, timeoutErr
		case err != nil:
			return st, err
		case len(work.Data) == 0:
			st.Data = nil
			return st, nil
		}
		var data bytes.Buffer // compact, as it will be read back after a restart
		if err := json.Compact(&data, work.Data); err != nil {
			return st, fmt.Errorf("recovery: %s step set Data that is not valid JSON: %v", st.Stage, err)
		}
		st.Data = data.Bytes()
		return st, nil
	case <-expired:
		return st, timeoutErr
	case <-ctx.Done():
		return st, ctx.Err()
	}
}

// transition moves st to (to, attempt), persists it, and reports it.
func (m *Machine) transition(st *State, to Stage, attempt int, cause error) error {
	if err := CheckTransition(st.Stage, to); err != nil {
		return err
	}
	if !to.Working() && !to.Failed() {
		attempt = 0 // crashed and live have no attempts
	}
	tr := Transition{From: st.Stage, To: to, At: m.clock().Now(), Attempt: attempt}
	if cause != nil {
		tr.Error = cause.Error()
	}
	next := st.clone()
	next.Stage, next.Attempt, next.LastError, next.UpdatedAt = to, attempt, tr.Error, tr.At
	next.History = append(next.History, tr)
	if n := len(next.History); n > maxHistory {
		next.History = append([]Transition(nil), next.History[n-maxHistory:]...)
	}
	var err error
	if to == Live {
		err = m.Store.Clear()
	} else {
		err = m.Store.Save(next)
	}
	if err != nil {
		return fmt.Errorf("recovery: persist %s → %s: %w", st.Stage, to, err)
	}
	*st = next
	m.publish(next)
	if m.OnTransition != nil {
		m.OnTransition(tr, next.clone())
	}
	return nil
}

func (m *Machine) publish(st State) {
	st = st.clone()
	m.mu.Lock()
	m.cur = &st
	m.mu.Unlock()
}
