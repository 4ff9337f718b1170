package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vigil-dev/vigil/internal/clock"
	"github.com/vigil-dev/vigil/internal/fsutil/fstest"
)

// newMachine returns a Machine on a fresh state dir and the transcript it
// writes: every transition, and "before X #n" for every attempt. Both hooks
// check that what they are handed is already on disk.
func newMachine(t *testing.T) (*Machine, *[]string) {
	t.Helper()
	var log []string
	store := &Store{Dir: t.TempDir()}
	onDisk := func(what string, st State) {
		t.Helper()
		got, ok, err := (&Store{Dir: store.Dir}).Load()
		switch {
		case err != nil:
			t.Errorf("%s: %v", what, err)
		case st.Stage == Live && ok:
			t.Errorf("%s: reached live but the file holds %s #%d", what, got.Stage, got.Attempt)
		case st.Stage != Live && (!ok || stateJSON(t, got) != stateJSON(t, st)):
			t.Errorf("%s: not persisted first: file holds %s #%d (ok=%v), hook got %s #%d", what, got.Stage, got.Attempt, ok, st.Stage, st.Attempt)
		}
	}
	m := &Machine{
		Store: store,
		BeforeStage: func(st State) {
			onDisk("BeforeStage", st)
			log = append(log, fmt.Sprintf("before %s #%d", st.Stage, st.Attempt))
		},
		OnTransition: func(tr Transition, st State) {
			onDisk("OnTransition", st)
			if st.Stage != tr.To || st.Attempt != tr.Attempt || st.LastError != tr.Error || !st.UpdatedAt.Equal(tr.At) {
				t.Errorf("OnTransition: state %s #%d %q does not match transition %v", st.Stage, st.Attempt, st.LastError, tr)
			}
			log = append(log, tr.String())
		},
	}
	return m, &log
}

func checkTranscript(t *testing.T, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("transcript:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

func checkGone(t *testing.T, m *Machine) {
	t.Helper()
	if st, ok, err := m.Store.Load(); ok || err != nil {
		t.Errorf("recovery file still there after live: %s #%d, %v", st.Stage, st.Attempt, err)
	}
}

// counting returns a Step that records "stage #attempt" into calls.
func counting(calls *[]string, then func(st *State) error) Step {
	return func(_ context.Context, st *State) error {
		*calls = append(*calls, fmt.Sprintf("%s #%d", st.Stage, st.Attempt))
		if then == nil {
			return nil
		}
		return then(st)
	}
}

func allSteps(calls *[]string) map[Stage]Step {
	return map[Stage]Step{
		Detecting:    counting(calls, nil),
		Inventorying: counting(calls, nil),
		Restoring:    counting(calls, nil),
		Reconciling:  counting(calls, nil),
	}
}

func TestRunGolden(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m, log := newMachine(t)
		var calls []string
		m.Steps = allSteps(&calls)
		st, err := m.Run(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		checkTranscript(t, *log, []string{
			"crashed → detecting #1",
			"before detecting #1",
			"detecting → inventorying #1",
			"before inventorying #1",
			"inventorying → restoring #1",
			"before restoring #1",
			"restoring → reconciling #1",
			"before reconciling #1",
			"reconciling → live #0",
		})
		checkTranscript(t, calls, []string{"detecting #1", "inventorying #1", "restoring #1", "reconciling #1"})
		if st.Stage != Live || st.Attempt != 0 || st.LastError != "" || !st.StartedAt.Equal(t0) || len(st.History) != 5 {
			t.Errorf("final state %+v", st)
		}
		checkGone(t, m)
		if s, err := m.Status(); err != nil || s.Stage != Live {
			t.Errorf("Status = %s, %v; want live", s.Stage, err)
		}
		if s, err := (&Machine{Store: m.Store}).Status(); err != nil || s.Stage != Live {
			t.Errorf("Status of a new Machine = %s, %v; want live", s.Stage, err)
		}
	})
}

func TestRunNoStepsAndZeroHooks(t *testing.T) {
	m := &Machine{Store: &Store{Dir: t.TempDir()}}
	st, err := m.Run(t.Context())
	if err != nil || st.Stage != Live {
		t.Fatalf("Run = %s, %v", st.Stage, err)
	}
	checkGone(t, m)
	if _, err := (&Machine{}).Run(t.Context()); err == nil {
		t.Error("Run without a Store succeeded")
	}
}

func TestRetriedAttemptsThenSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, log := newMachine(t)
		var calls []string
		m.Steps = allSteps(&calls)
		m.Steps[Inventorying] = counting(&calls, func(st *State) error {
			if st.Attempt < 3 {
				return fmt.Errorf("boom %d", st.Attempt)
			}
			return nil
		})
		if _, err := m.Run(t.Context()); err != nil {
			t.Fatal(err)
		}
		checkTranscript(t, *log, []string{
			"crashed → detecting #1",
			"before detecting #1",
			"detecting → inventorying #1",
			"before inventorying #1",
			"inventorying → inventorying #2: boom 1",
			"before inventorying #2",
			"inventorying → inventorying #3: boom 2",
			"before inventorying #3",
			"inventorying → restoring #1",
			"before restoring #1",
			"restoring → reconciling #1",
			"before reconciling #1",
			"reconciling → live #0",
		})
		checkTranscript(t, calls, []string{"detecting #1", "inventorying #1", "inventorying #2", "inventorying #3", "restoring #1", "reconciling #1"})
		checkGone(t, m)
	})
}

func TestFinalFailureAndOperatorRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, log := newMachine(t)
		var calls []string
		errFire := errors.New("disk on fire")
		m.Steps = allSteps(&calls)
		m.Steps[Restoring] = counting(&calls, func(*State) error { return errFire })

		_, err := m.Run(t.Context())
		var se *StageError
		if !errors.Is(err, ErrStageFailed) || !errors.Is(err, errFire) || !errors.As(err, &se) || se.Stage != Restoring || se.Attempts != 3 {
			t.Fatalf("Run = %v; want a StageError for restoring after 3 attempts", err)
		}
		const wantMsg = `recovery: stage "restoring" failed after 3 attempts: disk on fire`
		if err.Error() != wantMsg {
			t.Errorf("error = %q, want %q", err, wantMsg)
		}
		checkTranscript(t, (*log)[5:], []string{
			"before restoring #1",
			"restoring → restoring #2: disk on fire",
			"before restoring #2",
			"restoring → restoring #3: disk on fire",
			"before restoring #3",
			"restoring → restoring_failed #3: disk on fire",
		})
		st, ok, lerr := m.Store.Load()
		if !ok || lerr != nil || st.Stage != RestoringFailed || st.Attempt != 3 || st.LastError != "disk on fire" {
			t.Fatalf("persisted %+v, %v, %v; want restoring_failed #3", st, ok, lerr)
		}
		if s, _ := m.Status(); s.Stage != RestoringFailed {
			t.Errorf("Status = %s, want restoring_failed", s.Stage)
		}

		// Run again, here and in a restarted daemon: the same error at once.
		*log, calls = nil, nil
		for _, again := range []*Machine{m, {Store: m.Store, Steps: m.Steps, OnTransition: m.OnTransition, BeforeStage: m.BeforeStage}} {
			_, err := again.Run(t.Context())
			if !errors.Is(err, ErrStageFailed) || err.Error() != wantMsg {
				t.Errorf("second Run = %v, want %q", err, wantMsg)
			}
			if s, _ := again.Status(); s.Stage != RestoringFailed {
				t.Errorf("Status = %s, want restoring_failed", s.Stage)
			}
		}
		checkTranscript(t, *log, nil)
		checkTranscript(t, calls, nil)

		// The operator fixes the disk and retries.
		m.Steps[Restoring] = counting(&calls, nil)
		st, err = m.Retry(t.Context())
		if err != nil || st.Stage != Live {
			t.Fatalf("Retry = %s, %v", st.Stage, err)
		}
		checkTranscript(t, *log, []string{
			"restoring_failed → restoring #1",
			"before restoring #1",
			"restoring → reconciling #1",
			"before reconciling #1",
			"reconciling → live #0",
		})
		checkTranscript(t, calls, []string{"restoring #1", "reconciling #1"})
		checkGone(t, m)
		if _, err := m.Retry(t.Context()); !errors.Is(err, ErrNotFailed) {
			t.Errorf("Retry when live = %v, want ErrNotFailed", err)
		}
	})
}

func TestStageTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m, log := newMachine(t) // StageTimeout 0: 30s
		var (
			mu sync.Mutex // the abandoned attempt runs beside the next one
			at []time.Duration
		)
		m.Steps = map[Stage]Step{Restoring: func(ctx context.Context, st *State) error {
			mu.Lock()
			at = append(at, time.Since(t0))
			mu.Unlock()
			switch st.Attempt {
			case 1: // honours ctx
				<-ctx.Done()
				if !errors.Is(context.Cause(ctx), ErrStageTimeout) {
					t.Errorf("ctx cause = %v, want ErrStageTimeout", context.Cause(ctx))
				}
				return ctx.Err()
			case 2: // ignores ctx: abandoned, and its Data never lands
				time.Sleep(time.Hour)
				st.Data = json.RawMessage(`"abandoned"`)
				return nil
			}
			st.Data = json.RawMessage(`"restored"`)
			return nil
		}}
		st, err := m.Run(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		checkTranscript(t, (*log)[5:10], []string{
			"before restoring #1",
			"restoring → restoring #2: recovery: stage timed out: restoring attempt 1 ran longer than 30s",
			"before restoring #2",
			"restoring → restoring #3: recovery: stage timed out: restoring attempt 2 ran longer than 30s",
			"before restoring #3",
		})
		mu.Lock()
		if want := []time.Duration{0, 30 * time.Second, 60 * time.Second}; !slices.Equal(at, want) {
			t.Errorf("attempts started at %v, want %v", at, want)
		}
		mu.Unlock()
		if string(st.Data) != `"restored"` || st.Stage != Live {
			t.Errorf("final %s with data %s", st.Stage, st.Data)
		}
		time.Sleep(time.Hour) // let the abandoned attempt finish: the bubble must end empty
		if st, _ := m.Status(); string(st.Data) != `"restored"` {
			t.Errorf("the abandoned attempt changed the state: data %s", st.Data)
		}
	})
}

func TestStageTimeoutIsFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := newMachine(t)
		m.StageTimeout, m.MaxAttempts = time.Second, 1
		m.Steps = map[Stage]Step{Detecting: func(ctx context.Context, _ *State) error {
			<-ctx.Done()
			return nil // returning nil too late does not make it a success
		}}
		st, err := m.Run(t.Context())
		if !errors.Is(err, ErrStageFailed) || !errors.Is(err, ErrStageTimeout) || st.Stage != DetectingFailed {
			t.Fatalf("Run = %s, %v; want detecting_failed with ErrStageTimeout", st.Stage, err)
		}
	})
}

// A daemon SIGKILLed during restoring attempt 1 left this state behind.
func TestResumeAfterKill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, log := newMachine(t)
		t0 := time.Now().Add(-time.Minute)
		prev := State{
			Stage: Restoring, Attempt: 1, StartedAt: t0, UpdatedAt: t0,
			Data:    json.RawMessage(`{"inventory":["web"]}`),
			History: []Transition{{From: Crashed, To: Detecting, At: t0, Attempt: 1}},
		}
		if err := m.Store.Save(prev); err != nil {
			t.Fatal(err)
		}
		notCalled := func(context.Context, *State) error { t.Error("an earlier stage was run again"); return nil }
		var sawRestoring, sawReconciling string
		m.Steps = map[Stage]Step{
			Detecting:    notCalled,
			Inventorying: notCalled,
			Restoring: func(_ context.Context, st *State) error {
				sawRestoring = fmt.Sprintf("#%d %s", st.Attempt, st.Data)
				st.Data = json.RawMessage(`{"inventory":["web"],"restored":["web"]}`)
				return nil
			},
			Reconciling: func(_ context.Context, st *State) error {
				sawReconciling = fmt.Sprintf("#%d %s", st.Attempt, st.Data)
				return nil
			},
		}
		st, err := m.Run(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		// newMachine's hooks check that restoring's Data was on disk before reconciling began.
		checkTranscript(t, *log, []string{
			"restoring → restoring #2: recovery: attempt interrupted: restoring attempt 1 did not finish (the daemon stopped)",
			"before restoring #2",
			"restoring → reconciling #1",
			"before reconciling #1",
			"reconciling → live #0",
		})
		if want := `#2 {"inventory":["web"]}`; sawRestoring != want {
			t.Errorf("restoring saw %s, want %s", sawRestoring, want)
		}
		if want := `#1 {"inventory":["web"],"restored":["web"]}`; sawReconciling != want {
			t.Errorf("reconciling saw %s, want %s", sawReconciling, want)
		}
		if !st.StartedAt.Equal(t0) || len(st.History) != 4 || string(st.Data) != `{"inventory":["web"],"restored":["web"]}` {
			t.Errorf("final state %+v", st)
		}
		checkGone(t, m)
	})
}

// An interrupted last attempt fails the stage without running it again.
func TestResumeExhausted(t *testing.T) {
	m, log := newMachine(t)
	m.Store.Save(State{Stage: Reconciling, Attempt: 3, LastError: "earlier"})
	m.Steps = map[Stage]Step{Reconciling: func(context.Context, *State) error { t.Error("ran"); return nil }}
	st, err := m.Run(t.Context())
	if !errors.Is(err, ErrStageFailed) || !errors.Is(err, ErrInterrupted) || st.Stage != ReconcilingFailed || st.Attempt != 3 {
		t.Fatalf("Run = %s #%d, %v", st.Stage, st.Attempt, err)
	}
	checkTranscript(t, *log, []string{"reconciling → reconciling_failed #3: recovery: attempt interrupted: reconciling attempt 3 did not finish (the daemon stopped)"})
}

// The daemon is killed at the BeforeStage fault point (here: its ctx is
// cancelled there), and a new daemon resumes.
func TestKilledAtFaultPoint(t *testing.T) {
	m, _ := newMachine(t)
	var calls []string
	m.Steps = allSteps(&calls)
	ctx, kill := context.WithCancel(t.Context())
	before := m.BeforeStage
	m.BeforeStage = func(st State) {
		before(st)
		if st.Stage == Inventorying {
			kill()
		}
	}
	_, err := m.Run(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if st, ok, _ := m.Store.Load(); !ok || st.Stage != Inventorying || st.Attempt != 1 {
		t.Fatalf("persisted %s #%d, want inventorying #1", st.Stage, st.Attempt)
	}
	checkTranscript(t, calls, []string{"detecting #1"})

	m2, log2 := newMachine(t)
	m2.Store.Dir, m2.Steps = m.Store.Dir, m.Steps
	if _, err := m2.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	checkTranscript(t, calls, []string{"detecting #1", "inventorying #2", "restoring #1", "reconciling #1"})
	if !strings.HasPrefix((*log2)[0], "inventorying → inventorying #2: recovery: attempt interrupted") {
		t.Errorf("first transition after restart: %s", (*log2)[0])
	}
}

// A failed write leaves the previous state on disk and is reported; the
// next Run resumes from what is on disk.
func TestPersistFailure(t *testing.T) {
	mem := &fstest.Crash{}
	faulty := &fstest.Faulty{FS: mem}
	faulty.FailNth(fstest.OpRename, 2, fstest.EIO, false) // detecting → inventorying
	store := &Store{FS: faulty, Dir: "/state"}
	var calls []string
	steps := allSteps(&calls)
	steps[Detecting] = counting(&calls, func(st *State) error { st.Data = json.RawMessage(`1`); return nil })
	m := &Machine{Store: store, Steps: steps}
	st, err := m.Run(t.Context())
	if !errors.Is(err, fstest.EIO) {
		t.Fatalf("Run = %v, want EIO", err)
	}
	if st.Stage != Detecting {
		t.Errorf("Run returned %s, want the last persisted stage detecting", st.Stage)
	}
	if s, _ := m.Status(); s.Stage != Detecting || s.Data != nil {
		t.Errorf("Status = %s %s, want detecting with no data", s.Stage, s.Data)
	}
	if st, ok, _ := store.Load(); !ok || st.Stage != Detecting || st.Data != nil {
		t.Fatalf("persisted %s %s, want detecting with no data", st.Stage, st.Data)
	}
	st, err = m.Run(t.Context())
	if err != nil || st.Stage != Live || string(st.Data) != "1" {
		t.Fatalf("second Run = %s %s, %v", st.Stage, st.Data, err)
	}
	checkTranscript(t, calls, []string{"detecting #1", "detecting #2", "inventorying #1", "restoring #1", "reconciling #1"})
}

func TestInvalidDataIsAFailedAttempt(t *testing.T) {
	m, log := newMachine(t)
	m.Steps = map[Stage]Step{Detecting: func(_ context.Context, st *State) error {
		if st.Attempt == 1 {
			st.Data = json.RawMessage(`{`)
		}
		return nil
	}}
	if _, err := m.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if want := "detecting → detecting #2: recovery: detecting step set Data that is not valid JSON"; !strings.HasPrefix((*log)[2], want) {
		t.Errorf("got %s, want %s", (*log)[2], want)
	}
}

func TestStatusWhileRunning(t *testing.T) {
	m, _ := newMachine(t)
	if st, err := m.Status(); err != nil || st.Stage != Live {
		t.Fatalf("Status before any recovery = %s, %v; want live", st.Stage, err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	m.Steps = map[Stage]Step{Restoring: func(_ context.Context, st *State) error {
		close(entered)
		<-release
		st.Data = json.RawMessage(`"x"`)
		return nil
	}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // the API asking all the time
		for {
			select {
			case <-stop:
				return
			default:
				if st, err := m.Status(); err == nil && len(st.History) > 0 {
					st.History[0].Error = "scribbled" // a caller's copy is its own
				}
			}
		}
	})
	res := make(chan error, 1)
	go func() { _, err := m.Run(t.Context()); res <- err }()
	<-entered
	if st, err := m.Status(); err != nil || st.Stage != Restoring || st.Attempt != 1 {
		t.Errorf("Status during restoring = %s #%d, %v", st.Stage, st.Attempt, err)
	}
	if _, err := m.Run(t.Context()); !errors.Is(err, ErrRunning) {
		t.Errorf("concurrent Run = %v, want ErrRunning", err)
	}
	if _, err := m.Retry(t.Context()); !errors.Is(err, ErrRunning) {
		t.Errorf("concurrent Retry = %v, want ErrRunning", err)
	}
	close(release)
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	st, err := m.Status()
	if err != nil || st.Stage != Live || string(st.Data) != `"x"` || st.History[0].Error != "" {
		t.Errorf("Status after = %+v, %v", st, err)
	}
}

// Machine.Clock is the only source of time: with a manual clock, a stage
// times out when the clock is advanced, and transitions carry its times.
func TestManualClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
		fake := clock.NewFake(start)
		m, log := newMachine(t)
		m.Clock, m.StageTimeout, m.MaxAttempts = fake, 10*time.Second, 1
		m.Steps = map[Stage]Step{Inventorying: func(ctx context.Context, _ *State) error {
			<-ctx.Done()
			return ctx.Err()
		}}
		type result struct {
			st  State
			err error
		}
		res := make(chan result, 1)
		go func() { st, err := m.Run(t.Context()); res <- result{st, err} }()
		synctest.Wait() // the step is blocked; real (bubble) time does not time it out
		if st, _ := m.Status(); st.Stage != Inventorying || fake.Pending() != 1 {
			t.Fatalf("before Advance: %s, %d timers", st.Stage, fake.Pending())
		}
		fake.Advance(10 * time.Second)
		r := <-res
		if !errors.Is(r.err, ErrStageTimeout) || r.st.Stage != InventoryingFailed {
			t.Fatalf("Run = %s, %v", r.st.Stage, r.err)
		}
		if !r.st.StartedAt.Equal(start) || !r.st.UpdatedAt.Equal(start.Add(10*time.Second)) {
			t.Errorf("times %v, %v; want the manual clock's", r.st.StartedAt, r.st.UpdatedAt)
		}
		checkTranscript(t, *log, []string{
			"crashed → detecting #1",
			"before detecting #1",
			"detecting → inventorying #1",
			"before inventorying #1",
			"inventorying → inventorying_failed #1: recovery: stage timed out: inventorying attempt 1 ran longer than 10s",
		})
		if st, err := (&Machine{Store: m.Store}).Status(); err != nil || st.Stage != InventoryingFailed {
			t.Errorf("Status of a restarted daemon = %s, %v; want inventorying_failed", st.Stage, err)
		}
	})
}
