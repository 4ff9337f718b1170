package supervisor

import (
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/checkpoint"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/policy"
)

// fakeJournal holds every barrier until the test releases it, as a slow
// disk would.
type fakeJournal struct {
	mu      sync.Mutex
	waiting []func(error)
}

func (j *fakeJournal) barrier(done func(error)) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.waiting = append(j.waiting, done)
}

func (j *fakeJournal) pending() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.waiting)
}

func (j *fakeJournal) release(err error) {
	j.mu.Lock()
	w := j.waiting
	j.waiting = nil
	j.mu.Unlock()
	for _, f := range w {
		f(err)
	}
}

func withJournal(j *fakeJournal) func(*Options) {
	return func(o *Options) {
		o.Durable = j.barrier
		o.CrashOutput = func(name string) []string { return []string{name + ": boom"} }
	}
}

func TestRestartWaitsForCrashRecord(t *testing.T) {
	t.Parallel()
	for _, initial := range []time.Duration{0, 100 * time.Millisecond} {
		j := &fakeJournal{}
		c := svc("web")
		c.Backoff.Initial = initial
		h := newHarnessWith(t, withJournal(j), c)
		h.sup.StartAll()
		h.expectLog("spawn web 101")
		h.r.end(t, "web", exit1)
		h.sup.Sync()           // the exit is handled, its backoff timer armed
		h.advance(time.Second) // well past the backoff
		h.expectLog("killall web 101")
		if j.pending() != 1 {
			t.Fatalf("backoff %v: %d barriers pending, want the crash record's", initial, j.pending())
		}
		j.release(nil)
		h.sup.Sync()
		h.expectLog("spawn web 102")

		// A journal that fails does not stop supervision.
		h.r.end(t, "web", exit1)
		h.sup.Sync()
		h.advance(time.Second)
		j.release(errors.New("disk full"))
		h.advance(time.Second)
		h.expectLog("killall web 102", "spawn web 103")
	}
}

// TestHungDiskDoesNotStopSupervision: a journal that never answers holds
// a restart, and an operator's answer, for DurableWait and no longer.
func TestHungDiskDoesNotStopSupervision(t *testing.T) {
	t.Parallel()
	j := &fakeJournal{} // never released
	h := newHarnessWith(t, withJournal(j), svc("web"))
	h.sup.StartAll()
	h.expectLog("spawn web 101")
	h.r.end(t, "web", exit1)
	h.sup.Sync()
	h.advance(5*time.Second - time.Millisecond)
	h.expectLog("killall web 101")
	h.advance(time.Millisecond)
	h.expectLog("spawn web 102")

	done := make(chan error, 1)
	go func() { done <- h.sup.Stop("web") }()
	h.waitEvent("web", Stopping)
	h.r.end(t, "web", sigTerm)
	for deadline := time.Now().Add(10 * time.Second); j.pending() < 2; { // the crash record's, and now the stop's
		if time.Now().After(deadline) {
			t.Fatal("stop never asked for a barrier")
		}
		time.Sleep(time.Millisecond)
	}
	h.advance(5*time.Second - time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("stop answered (%v) before DurableWait", err)
	default:
	}
	h.clk.Advance(time.Millisecond)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stop not answered after DurableWait")
	}
}

func TestCrashRecord(t *testing.T) {
	t.Parallel()
	j := &fakeJournal{}
	h := newHarnessWith(t, withJournal(j), svc("web"))
	h.sup.StartAll()
	h.sup.Sync()
	h.send(101, "LEASE=task-7")
	h.advance(1500 * time.Millisecond)
	h.r.end(t, "web", sigSegvC)
	for {
		e := <-h.sub.C
		if e.Topic != event.CrashDetected {
			continue
		}
		c := e.Crash
		if c == nil || c.Service != "web" || c.PID != 101 || c.StartTime != 10100 || c.Exit.Class != "signal" ||
			c.Exit.Signal != "SIGSEGV" || !c.Exit.CoreDumped || c.UptimeMS != 1500 || c.Restarts != 0 ||
			len(c.Leases) != 1 || c.Leases[0] != "task-7" || len(c.Output) != 1 || c.Output[0] != "web: boom" ||
			c.Action != "restart in 100ms" {
			b, _ := json.Marshal(c)
			t.Fatalf("crash record %s", b)
		}
		break
	}
	j.release(nil)
}

func TestOperatorCommandWaitsForJournal(t *testing.T) {
	t.Parallel()
	j := &fakeJournal{}
	h := newHarnessWith(t, withJournal(j), svc("web"))
	h.sup.StartAll()
	h.sup.Sync()
	done := make(chan error, 1)
	go func() { done <- h.sup.Restart("web") }()
	// The command is published before it acts: seen before web stops.
	var operator []event.Event
	for stopping := false; !stopping; {
		select {
		case e := <-h.sub.C:
			if e.Topic == event.OperatorCommand {
				operator = append(operator, e)
			}
			stopping = e.Topic == event.ServiceState && e.Service == "web" && e.State == string(Stopping)
		case <-time.After(10 * time.Second):
			t.Fatal("web never began stopping")
		}
	}
	if len(operator) != 1 || operator[0].Service != "web" || operator[0].Message != "restart" {
		t.Fatalf("operator events before the stop: %+v", operator)
	}
	h.r.end(t, "web", sigTerm)
	deadline := time.Now().Add(10 * time.Second)
	for j.pending() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("restart never asked for a barrier")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("restart answered (%v) before its records were durable", err)
	default:
	}
	j.release(nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.expectLog("spawn web 101", "signal web 101 terminated", "killall web 101", "spawn web 102")
}

func TestCheckpointAndBlob(t *testing.T) {
	t.Parallel()
	web, db := svc("web", "db"), svc("db")
	db.Autostart = false
	h := newHarness(t, db, web)
	h.sup.StartAll()
	h.sup.Sync()
	if err := h.sup.SetBlob("web", []byte(`{"cursor":42}`)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]byte{[]byte(`{`), make([]byte, MaxBlob+1)} {
		if err := h.sup.SetBlob("web", bad); !errors.Is(err, apitype.ErrInvalidArgument) {
			t.Fatalf("bad blob: %v", err)
		}
	}
	if err := h.sup.SetBlob("nope", []byte(`1`)); !errors.Is(err, apitype.ErrNotFound) {
		t.Fatalf("unknown service: %v", err)
	}
	st := h.sup.Checkpoint()
	if len(st.Services) != 2 {
		t.Fatalf("%+v", st)
	}
	d, w := st.Services[0], st.Services[1]
	if d.Name != "db" || w.Name != "web" || d.Desired != checkpoint.DesiredRunning || w.Desired != checkpoint.DesiredRunning {
		t.Fatalf("services %+v", st.Services)
	}
	if w.Instance == nil || w.Instance.PID != 102 || w.Instance.StartTime != 10200 || w.Instance.PGID != 102 ||
		string(w.Blob) != `{"cursor":42}` || w.State != string(Running) {
		t.Fatalf("web %+v %+v", w, w.Instance)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- h.sup.Stop("web") }()
	h.waitEvent("web", Stopping)
	h.r.end(t, "web", sigTerm)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	st = h.sup.Checkpoint()
	if w := st.Services[1]; w.Instance != nil || w.Desired != checkpoint.DesiredStopped {
		t.Fatalf("stopped web %+v", w)
	}
}

// TestRestoreAndAdopt is the supervisor's half of recovery: what the
// checkpoint kept is restored, survivors are adopted (not started), their
// watchdogs count from the adoption, and StartAll starts only the rest.
func TestRestoreAndAdopt(t *testing.T) {
	t.Parallel()
	web := notifySvc("web")
	web.Watchdog = time.Second
	flaky := svc("flaky")
	flaky.CrashLoop.Cooldown = 0
	h := newHarness(t, web, svc("db"), flaky, svc("idle"))
	h.r.alive = map[int]bool{500: true}
	now := h.clk.Now()
	h.sup.Restore([]checkpoint.Service{
		{Name: "web", Desired: checkpoint.DesiredRunning, Restarts: 3, Blob: []byte(`{"n":1}`)},
		{Name: "db", Desired: checkpoint.DesiredStopped},
		{Name: "flaky", Desired: checkpoint.DesiredRunning, Tracker: policy.Tracker{Breaker: policy.BreakerOpen, OpenedAt: now}},
		{Name: "gone-from-config", Desired: checkpoint.DesiredRunning},
	})
	if err := h.sup.Adopt("web", checkpoint.Instance{PID: 500, StartTime: 9, PGID: 500, StartedAt: now.Add(-time.Hour), Ready: true}); err != nil {
		t.Fatal(err)
	}
	if err := h.sup.Adopt("idle", checkpoint.Instance{PID: 501, StartTime: 9, PGID: 501, StartedAt: now}); err == nil {
		t.Fatal("adopted a pid that is gone")
	}
	if err := h.sup.Adopt("web", checkpoint.Instance{PID: 500, StartTime: 9, PGID: 500, StartedAt: now}); !errors.Is(err, apitype.ErrFailedPrecondition) {
		t.Fatalf("second adoption of web: %v", err)
	}
	h.sup.StartAll()
	h.expectLog("adopt web 500", "spawn idle 101")
	s := h.expectState("web", Running)
	if s.PID != 500 || s.Restarts != 3 || !s.Ready || s.Reason != reasonAdopted {
		t.Fatalf("adopted web: %+v", s)
	}
	h.expectState("db", Stopped)
	if s := h.expectState("flaky", Failed); s.Breaker != "open" {
		t.Fatalf("flaky breaker %q", s.Breaker)
	}
	if st := h.sup.Checkpoint(); string(st.Services[0].Blob) != `{"n":1}` || st.Services[1].Desired != checkpoint.DesiredStopped {
		t.Fatalf("checkpoint after restore: %+v", st.Services)
	}

	// The watchdog counts from the adoption: a hung survivor is still caught.
	h.advance(2*time.Second - time.Millisecond)
	h.expectLog()
	h.advance(time.Millisecond)
	h.expectLog("signal-main web 500 aborted")

	// An adopted instance's end has no status: lost, a crash, restarted.
	h.r.mu.Lock()
	in := h.r.live["web"]
	delete(h.r.live, "web")
	h.r.mu.Unlock()
	in.onExit(Exit{Lost: true, At: h.clk.Now()})
	h.sup.Sync()
	s = h.expectState("web", Backoff)
	if s.LastExit.Class != "unresponsive" {
		t.Fatalf("a hung adopted instance's end: %+v", s.LastExit)
	}

	// The operator's start of a held service works as ever.
	if err := h.sup.Start("db"); err != nil {
		t.Fatal(err)
	}
	h.expectState("db", Running)
}

// TestLostExitIsACrash: an adopted instance that ends on its own, with
// no status to be had, is classed lost and restarted.
func TestLostExitIsACrash(t *testing.T) {
	t.Parallel()
	h := newHarness(t, svc("web"))
	h.r.alive = map[int]bool{700: true}
	if err := h.sup.Adopt("web", checkpoint.Instance{PID: 700, StartTime: 1, PGID: 700, StartedAt: h.clk.Now()}); err != nil {
		t.Fatal(err)
	}
	h.sup.Sync()
	h.r.mu.Lock()
	in := h.r.live["web"]
	delete(h.r.live, "web")
	h.r.mu.Unlock()
	in.onExit(Exit{Lost: true, At: h.clk.Now()})
	h.sup.Sync()
	s := h.expectState("web", Backoff)
	if s.LastExit.Class != "lost" || s.CrashesInWindow != 1 {
		t.Fatalf("lost exit: %+v %+v", s, s.LastExit)
	}
	h.advance(100 * time.Millisecond)
	h.expectLog("adopt web 700", "killall web 700", "spawn web 101")
}

// TestSafeMode: only essential services and what they depend on start in
// safe mode; leaving it starts the rest; entering it stops them.
func TestSafeMode(t *testing.T) {
	t.Parallel()
	api := svc("api", "db")
	api.Essential = true
	h := newHarness(t, svc("db"), api, svc("web"))
	if err := h.sup.SetSafeMode(true, "three daemon crashes in 60s"); err != nil {
		t.Fatal(err)
	}
	h.sup.StartAll()
	h.expectLog("spawn db 101", "spawn api 102")
	h.expectState("web", Stopped)
	if !h.sup.SafeMode() || !h.sup.Checkpoint().SafeMode {
		t.Fatal("safe mode not reported")
	}
	expectTopic(t, h, event.SafeModeEntered, "three daemon crashes in 60s")
	if err := h.sup.SetSafeMode(false, "operator"); err != nil {
		t.Fatal(err)
	}
	h.expectLog("spawn web 103")
	if h.sup.SafeMode() {
		t.Fatal("still in safe mode")
	}
	expectTopic(t, h, event.SafeModeExited, "operator")

	entered := make(chan error, 1)
	go func() { entered <- h.sup.SetSafeMode(true, "operator") }()
	h.waitEvent("web", Stopping)
	h.r.end(t, "web", sigTerm)
	if err := <-entered; err != nil {
		t.Fatal(err)
	}
	h.sup.Sync()
	h.expectState("web", Stopped)
	h.expectState("db", Running)
	h.expectState("api", Running)
}

// expectTopic finds an event of topic with message among those published.
func expectTopic(t *testing.T, h *harness, topic event.Topic, msg string) {
	t.Helper()
	for len(h.sub.C) > 0 {
		if e := <-h.sub.C; e.Topic == topic && e.Message == msg {
			return
		}
	}
	t.Fatalf("no %s event %q", topic, msg)
}

// TestFlushFollowsEveryStepThatStarted: once after each step of the loop
// that started instances (so before any later step, a status query
// among them), and not after steps that started none.
func TestFlushFollowsEveryStepThatStarted(t *testing.T) {
	t.Parallel()
	var flushes []int // how many service.state events with an instance were published by each flush
	var bus *event.Bus
	var sub *event.Subscription
	published := 0
	h := newHarnessWith(t, func(o *Options) {
		bus = o.Bus
		sub = bus.Subscribe(100)
		o.Flush = func() {
			for len(sub.C) > 0 {
				if e := <-sub.C; e.Instance != nil && e.State == string(Running) {
					published++
				}
			}
			flushes = append(flushes, published)
		}
	}, svc("web"), svc("db"))
	h.sup.StartAll()
	h.expectLog("spawn web 101", "spawn db 102")
	h.status("web")
	h.status("db")
	h.sup.Sync()
	h.r.end(t, "web", exit1)
	h.sup.Sync()           // the exit is handled, its backoff timer armed
	h.advance(time.Second) // well past the backoff: the restart
	h.expectLog("killall web 101", "spawn web 103")
	h.status("web")
	h.sup.Sync()
	// Read on the loop, where Flush ran.
	var got []int
	h.sup.call(func(done func(error)) { got = append(got, flushes...); done(nil) })
	// Here each start is a step of its own: a flush after each, none
	// after the status queries.
	if !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("flushes after %v instances running, want [1 2 3]: one after each start, by then published", got)
	}
}
