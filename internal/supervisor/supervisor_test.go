package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/checkpoint"
	"github.com/vigil-dev/vigil/internal/clock"
	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/event"
)

// fakeRunner records spawns; tests end instances by hand.
type fakeRunner struct {
	sync  func() // the supervisor's Sync: end() acts on a settled state
	clock *clock.Fake
	mu    sync.Mutex
	pid   int
	log   []string // "spawn web 101", "signal web 101 terminated", "kill web 101"
	live  map[string]*fakeInst
	fail  map[string]error
	// onStart, if set, is called (with mu held) for every spawn.
	onStart func(name string)
	alive   map[int]bool // pids Adopt may take over
}

type fakeInst struct {
	r      *fakeRunner
	name   string
	pid    int
	onExit func(Exit)
	gone   map[int]bool // pids of the instance that vanished
	owns   map[int]bool // other pids of the instance
}

func (r *fakeRunner) Start(svc *config.Service, onExit func(Exit)) (Instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fail[svc.Name]; err != nil {
		r.log = append(r.log, "spawnfail "+svc.Name)
		return nil, err
	}
	r.pid++
	in := &fakeInst{r: r, name: svc.Name, pid: 100 + r.pid, onExit: onExit, gone: map[int]bool{}, owns: map[int]bool{}}
	r.live[svc.Name] = in
	r.log = append(r.log, fmt.Sprintf("spawn %s %d", svc.Name, in.pid))
	if r.onStart != nil {
		r.onStart(svc.Name)
	}
	return in, nil
}

// Adopt takes over a live instance (the previous daemon's): it must be
// listed in alive, as /proc would say.
func (r *fakeRunner) Adopt(svc *config.Service, ref checkpoint.Instance, onExit func(Exit)) (Instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.alive[ref.PID] {
		return nil, fmt.Errorf("pid %d is gone", ref.PID)
	}
	in := &fakeInst{r: r, name: svc.Name, pid: ref.PID, onExit: onExit, gone: map[int]bool{}, owns: map[int]bool{}}
	r.live[svc.Name] = in
	r.log = append(r.log, fmt.Sprintf("adopt %s %d", svc.Name, in.pid))
	return in, nil
}

func (f *fakeInst) PID() int { return f.pid }
func (f *fakeInst) Signal(sig syscall.Signal) error {
	f.r.record(fmt.Sprintf("signal %s %d %s", f.name, f.pid, sig))
	return nil
}
func (f *fakeInst) StartTime() uint64 { return uint64(f.pid) * 100 }
func (f *fakeInst) PGID() int         { return f.pid }
func (f *fakeInst) Cgroup() string    { return "/cg/" + f.name }
func (f *fakeInst) Token() string     { return fmt.Sprint("t", f.pid) }
func (f *fakeInst) KillAll() int      { f.r.record(fmt.Sprintf("killall %s %d", f.name, f.pid)); return 0 }
func (f *fakeInst) Release()          {}
func (f *fakeInst) SignalMain(pid int, sig syscall.Signal) error {
	f.r.record(fmt.Sprintf("signal-main %s %d %s", f.name, pid, sig))
	return nil
}
func (f *fakeInst) Alive(pid int) bool {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	return !f.gone[pid]
}
func (f *fakeInst) Owns(pid int) bool {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	return pid == f.pid || f.owns[pid]
}

func (r *fakeRunner) record(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, s)
}

// end makes the live instance of name exit with status.
func (r *fakeRunner) end(t *testing.T, name string, status syscall.WaitStatus) {
	t.Helper()
	r.sync()
	r.mu.Lock()
	in := r.live[name]
	delete(r.live, name)
	r.mu.Unlock()
	if in == nil {
		t.Fatalf("no live instance of %s", name)
	}
	in.onExit(Exit{Status: status, At: r.clock.Now()})
}

func (r *fakeRunner) takeLog() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.log
	r.log = nil
	return l
}

const (
	exit0    = syscall.WaitStatus(0)
	exit1    = syscall.WaitStatus(1 << 8)
	sigTerm  = syscall.WaitStatus(syscall.SIGTERM)
	sigKill  = syscall.WaitStatus(syscall.SIGKILL)
	sigSegvC = syscall.WaitStatus(syscall.SIGSEGV | 0x80)
)

func svc(name string, deps ...string) config.Service {
	return config.Service{
		Name:        name,
		Command:     []string{"/bin/true"},
		Restart:     config.RestartOnFailure,
		SuccessExit: []int{0},
		StopSignal:  syscall.SIGTERM,
		StopTimeout: 10 * time.Second,
		DependsOn:   deps,
		Autostart:   true,
		Backoff:     config.Backoff{Initial: 100 * time.Millisecond, Max: 30 * time.Second, Multiplier: 2, ResetAfter: 60 * time.Second},
		CrashLoop:   config.CrashLoop{Crashes: 5, Window: 60 * time.Second},
	}
}

type harness struct {
	t   *testing.T
	sup *Supervisor
	r   *fakeRunner
	clk *clock.Fake
	sub *event.Subscription
}

func newHarness(t *testing.T, services ...config.Service) *harness {
	t.Helper()
	return newHarnessWith(t, nil, services...)
}

// newHarnessWith is newHarness with opt changing the supervisor's options.
func newHarnessWith(t *testing.T, opt func(*Options), services ...config.Service) *harness {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	r := &fakeRunner{clock: clk, live: map[string]*fakeInst{}, fail: map[string]error{}}
	bus := &event.Bus{}
	h := &harness{t: t, r: r, clk: clk, sub: bus.Subscribe(1000)}
	r.sync = func() { h.sup.Sync() }
	opts := Options{Services: services, Runner: r, Clock: clk, Bus: bus, Rand: func() float64 { return 0 },
		Logger: slog.New(slog.DiscardHandler)}
	if opt != nil {
		opt(&opts)
	}
	h.sup = New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.sup.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

func (h *harness) advance(d time.Duration) { h.clk.Advance(d); h.sup.Sync() }

func (h *harness) status(name string) apitype.Service {
	h.t.Helper()
	for _, s := range h.sup.Services() {
		if s.Name == name {
			return s
		}
	}
	h.t.Fatalf("no service %s in status", name)
	return apitype.Service{}
}

func (h *harness) expectLog(want ...string) {
	h.t.Helper()
	h.sup.Sync()
	if got := h.r.takeLog(); !slices.Equal(got, want) {
		h.t.Fatalf("runner log\n got %q\nwant %q", got, want)
	}
}

// waitEvent waits for a service.state event moving name to state.
func (h *harness) waitEvent(name string, state State) {
	h.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e := <-h.sub.C:
			if e.Topic == event.ServiceState && e.Service == name && e.State == string(state) {
				return
			}
		case <-timeout:
			h.t.Fatalf("no %s → %s event within 10s", name, state)
		}
	}
}

func (h *harness) expectState(name string, state State) apitype.Service {
	h.t.Helper()
	s := h.status(name)
	if s.State != string(state) {
		h.t.Fatalf("%s state = %q (reason %q), want %q", name, s.State, s.Reason, state)
	}
	return s
}

func TestTransitionTableIsExhaustive(t *testing.T) {
	all := []State{Stopped, Starting, Running, Stopping, Exited, Backoff, Failed}
	legal := map[[2]State]bool{}
	for from, tos := range successors {
		for _, to := range tos {
			legal[[2]State{from, to}] = true
		}
	}
	for _, from := range all {
		if _, ok := successors[from]; !ok {
			t.Errorf("state %q has no successor list", from)
		}
		for _, to := range all {
			if CanMove(from, to) != legal[[2]State{from, to}] {
				t.Errorf("CanMove(%q, %q) disagrees with the table", from, to)
			}
		}
	}
	// A few transitions that must never happen.
	for _, bad := range [][2]State{{Stopped, Running}, {Backoff, Running}, {Failed, Running}, {Exited, Backoff}} {
		if CanMove(bad[0], bad[1]) {
			t.Errorf("CanMove(%q, %q) = true, want false", bad[0], bad[1])
		}
	}
	if (&TransitionError{Service: "web", From: Running, To: Stopped}).Error() != `supervisor: web: invalid transition "running" → "stopped"` {
		t.Error("TransitionError text changed")
	}
}

func TestStartsInDependencyOrderAndStopsInReverse(t *testing.T) {
	h := newHarness(t, svc("web", "api"), svc("api", "db"), svc("db"))
	h.sup.StartAll()
	h.expectLog("spawn db 101", "spawn api 102", "spawn web 103")

	done := make(chan struct{})
	go func() { h.sup.StopAll(); close(done) }()
	h.waitEvent("web", Stopping)
	h.expectLog("signal web 103 terminated")
	h.r.end(t, "web", sigTerm)
	h.expectLog("killall web 103", "signal api 102 terminated")
	h.r.end(t, "api", sigTerm)
	h.expectLog("killall api 102", "signal db 101 terminated")
	h.r.end(t, "db", sigTerm)
	<-done
	s := h.expectState("db", Stopped)
	if s.LastExit == nil || s.LastExit.Class != "stopped" {
		t.Fatalf("db last_exit = %+v, want class stopped", s.LastExit)
	}
}

func TestCrashRestartsWithGrowingBackoffAndRecovers(t *testing.T) {
	h := newHarness(t, svc("web"))
	h.sup.StartAll()
	h.expectLog("spawn web 101")

	h.r.end(t, "web", exit1)
	s := h.expectState("web", Backoff)
	if s.Recovery != "observed_failure" || s.NextRestartAt == nil || s.NextRestartAt.Sub(h.clk.Now()) != 100*time.Millisecond {
		t.Fatalf("after crash: %+v", s)
	}
	if s.LastExit.Class != "exit_code" || *s.LastExit.Code != 1 {
		t.Fatalf("last_exit = %+v", s.LastExit)
	}
	h.expectLog("killall web 101")
	h.advance(99 * time.Millisecond)
	h.expectLog()
	h.advance(time.Millisecond)
	h.expectLog("spawn web 102")
	s = h.expectState("web", Running)
	if s.Restarts != 1 || s.Recovery != "recovery_started" {
		t.Fatalf("after restart: restarts=%d recovery=%s", s.Restarts, s.Recovery)
	}

	h.r.end(t, "web", sigSegvC)
	s = h.expectState("web", Backoff)
	if s.NextRestartAt.Sub(h.clk.Now()) != 200*time.Millisecond {
		t.Fatalf("second delay = %v, want 200ms", s.NextRestartAt.Sub(h.clk.Now()))
	}
	if s.LastExit.Class != "signal" || s.LastExit.Signal != "SIGSEGV" || !s.LastExit.CoreDumped {
		t.Fatalf("last_exit = %+v", s.LastExit)
	}
	h.advance(200 * time.Millisecond)
	h.expectLog("killall web 102", "spawn web 103")
	h.advance(60 * time.Second)
	if s = h.status("web"); s.Recovery != "recovered" {
		t.Fatalf("recovery after reset_after = %q, want recovered", s.Recovery)
	}
	// Up for reset_after: the next crash starts the backoff again at initial.
	h.r.end(t, "web", exit1)
	if s = h.status("web"); s.NextRestartAt.Sub(h.clk.Now()) != 100*time.Millisecond {
		t.Fatalf("delay after a stable run = %v, want 100ms", s.NextRestartAt.Sub(h.clk.Now()))
	}
}

func TestBreakerTripsAfterExactlyNCrashesAndResetRestarts(t *testing.T) {
	c := svc("web")
	c.Backoff.Initial = 0
	c.CrashLoop = config.CrashLoop{Crashes: 3, Window: 10 * time.Second}
	h := newHarness(t, c)
	h.sup.StartAll()
	h.expectLog("spawn web 101")
	h.r.end(t, "web", exit1)
	h.expectLog("killall web 101", "spawn web 102")
	h.r.end(t, "web", exit1)
	h.expectLog("killall web 102", "spawn web 103")
	h.r.end(t, "web", exit1)
	h.expectLog("killall web 103")
	s := h.expectState("web", Failed)
	if s.Recovery != "manual_action_required" || s.Breaker != "open" || s.CrashesInWindow != 3 || s.Restarts != 2 {
		t.Fatalf("after trip: %+v", s)
	}
	if err := h.sup.Start("web"); !errors.Is(err, apitype.ErrFailedPrecondition) {
		t.Fatalf("Start on a failed service: %v, want failed_precondition", err)
	}
	h.advance(time.Hour)
	h.expectLog() // no cooldown: stays failed
	if err := h.sup.Reset("web"); err != nil {
		t.Fatal(err)
	}
	h.expectLog("spawn web 104")
	s = h.expectState("web", Running)
	if s.Breaker != "closed" || s.Restarts != 0 || s.CrashesInWindow != 0 {
		t.Fatalf("after reset: %+v", s)
	}
}

func TestCrashesSpreadWiderThanTheWindowNeverTrip(t *testing.T) {
	c := svc("web")
	c.Backoff.Initial = 0
	c.CrashLoop = config.CrashLoop{Crashes: 3, Window: 10 * time.Second}
	h := newHarness(t, c)
	h.sup.StartAll()
	for i := 0; i < 20; i++ {
		h.advance(6 * time.Second)
		h.r.end(t, "web", exit1)
		h.sup.Sync()
		h.expectState("web", Running)
	}
	h.r.takeLog()
}

func TestStopEscalatesToKillAfterStopTimeout(t *testing.T) {
	h := newHarness(t, svc("web"))
	h.sup.StartAll()
	h.expectLog("spawn web 101")
	done := make(chan error, 1)
	go func() { done <- h.sup.Stop("web") }()
	h.waitEvent("web", Stopping)
	h.expectLog("signal web 101 terminated")
	h.expectState("web", Stopping)
	h.advance(10*time.Second - time.Millisecond)
	h.expectLog()
	h.advance(time.Millisecond)
	h.expectLog("killall web 101")
	h.r.end(t, "web", sigKill)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s := h.expectState("web", Stopped)
	if s.LastExit.Class != "stopped" || s.Restarts != 0 || s.CrashesInWindow != 0 {
		t.Fatalf("a stop counted as a crash: %+v", s)
	}
	h.advance(time.Hour)
	h.expectLog("killall web 101")
}

func TestPlannedRestartIsNotACrash(t *testing.T) {
	h := newHarness(t, svc("web"))
	h.sup.StartAll()
	h.expectLog("spawn web 101")
	done := make(chan error, 1)
	go func() { done <- h.sup.Restart("web") }()
	h.waitEvent("web", Stopping)
	h.expectLog("signal web 101 terminated")
	if s := h.status("web"); s.Recovery != "planned_restart" {
		t.Fatalf("recovery during restart = %q", s.Recovery)
	}
	h.r.end(t, "web", exit1) // even a non-zero exit while stopping is "stopped"
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.expectLog("killall web 101", "spawn web 102")
	s := h.expectState("web", Running)
	if s.Restarts != 0 || s.CrashesInWindow != 0 || s.Recovery != "healthy" || s.LastExit.Class != "stopped" {
		t.Fatalf("after planned restart: %+v", s)
	}
}

func TestCleanExitUnderOnFailureStaysExited(t *testing.T) {
	c := svc("job")
	h := newHarness(t, c)
	h.sup.StartAll()
	h.r.end(t, "job", exit0)
	s := h.expectState("job", Exited)
	if s.LastExit.Class != "clean" || s.Recovery != "healthy" {
		t.Fatalf("%+v", s)
	}
	if err := h.sup.Start("job"); err != nil {
		t.Fatal(err)
	}
	h.expectState("job", Running)
}

func TestSpawnFailureGoesThroughBackoffAndBreaker(t *testing.T) {
	c := svc("bad")
	c.Backoff.Initial = 0
	c.CrashLoop = config.CrashLoop{Crashes: 4, Window: time.Minute}
	h := newHarness(t, c)
	h.r.fail["bad"] = errors.New("exec: no such file")
	h.sup.StartAll()
	h.waitEvent("bad", Failed)
	h.expectLog("spawnfail bad", "spawnfail bad", "spawnfail bad", "spawnfail bad")
	s := h.expectState("bad", Failed)
	if s.LastExit.Class != "spawn_failed" || s.LastExit.Error == "" {
		t.Fatalf("%+v", s.LastExit)
	}
}

func TestCooldownHalfOpensForOneTrial(t *testing.T) {
	c := svc("web")
	c.Backoff.Initial = 0
	c.CrashLoop = config.CrashLoop{Crashes: 2, Window: time.Minute, Cooldown: 5 * time.Minute}
	h := newHarness(t, c)
	h.sup.StartAll()
	h.r.end(t, "web", exit1)
	h.sup.Sync()
	h.r.end(t, "web", exit1)
	h.expectState("web", Failed)
	h.r.takeLog()
	h.advance(5 * time.Minute)
	h.expectLog("spawn web 103")
	if s := h.expectState("web", Running); s.Breaker != "half_open" {
		t.Fatalf("breaker = %q, want half_open", s.Breaker)
	}
	h.r.end(t, "web", exit1) // the trial crashes: open again at once
	h.expectState("web", Failed)
	h.advance(5 * time.Minute)
	h.advance(60 * time.Second) // the trial survives reset_after
	if s := h.expectState("web", Running); s.Breaker != "closed" {
		t.Fatalf("breaker after a stable trial = %q, want closed", s.Breaker)
	}
}

func TestReloadTouchesOnlyWhatChanged(t *testing.T) {
	h := newHarness(t, svc("a"), svc("b"), svc("c"))
	h.sup.StartAll()
	h.expectLog("spawn a 101", "spawn b 102", "spawn c 103")

	b2 := svc("b")
	b2.Command = []string{"/bin/false"}
	done := make(chan apitype.ReloadResult, 1)
	go func() { done <- h.sup.Reload([]config.Service{svc("a"), b2, svc("d")}) }()
	res := <-done
	if !slices.Equal(res.Unchanged, []string{"a"}) || !slices.Equal(res.Changed, []string{"b"}) ||
		!slices.Equal(res.Added, []string{"d"}) || !slices.Equal(res.Removed, []string{"c"}) {
		t.Fatalf("reload result %+v", res)
	}
	h.expectLog("signal c 103 terminated", "signal b 102 terminated", "spawn d 104")
	h.r.end(t, "b", sigTerm)
	h.r.end(t, "c", sigTerm)
	h.expectLog("killall b 102", "spawn b 105", "killall c 103")
	var names []string
	for _, s := range h.sup.Services() {
		names = append(names, s.Name+":"+s.State)
	}
	if !slices.Equal(names, []string{"a:running", "b:running", "d:running"}) {
		t.Fatalf("services after reload: %v", names)
	}
	if err := h.sup.Stop("c"); !errors.Is(err, apitype.ErrNotFound) {
		t.Fatalf("Stop of a removed service: %v", err)
	}
}

func TestDependentWaitsForFailedDependency(t *testing.T) {
	h := newHarness(t, svc("web", "db"), svc("db"))
	h.r.fail["db"] = errors.New("boom")
	h.sup.StartAll()
	h.expectLog("spawnfail db")
	s := h.expectState("web", Starting)
	if s.Reason != "waiting for db" || s.PID != 0 {
		t.Fatalf("web = %+v", s)
	}
	delete(h.r.fail, "db")
	h.advance(100 * time.Millisecond)
	h.expectLog("spawn db 101", "spawn web 102")
}

// TestLargeStartLetsOtherEventsIn: a start of many services spawns
// kickBatch of them per turn of the loop, so an event that arrives
// meanwhile (a watchdog deadline, an exit, an API call) waits for one
// batch, not for every spawn.
func TestLargeStartLetsOtherEventsIn(t *testing.T) {
	var services []config.Service
	for i := range 100 {
		services = append(services, svc(fmt.Sprintf("s%03d", i)))
	}
	h := newHarness(t, services...)
	h.r.onStart = func(name string) {
		if name == "s000" {
			h.sup.post(func() { h.r.log = append(h.r.log, "other event") }) // runs on the loop; mu is free then
		}
	}
	h.sup.StartAll()
	h.sup.Sync()
	log := h.r.takeLog()
	if len(log) != 101 || slices.Index(log, "other event") != kickBatch {
		t.Fatalf("the other event ran at %d of %d: %q", slices.Index(log, "other event"), len(log), log)
	}
	for _, s := range h.sup.Services() {
		if s.State != string(Running) {
			t.Fatalf("%s is %s after the start", s.Name, s.State)
		}
	}
}
