// Package supervisor is vigil's event loop: the one goroutine that owns every
// service's state. Process exits, timers, reloads and operator commands reach
// it as events; it decides with the pure policy package and acts through a
// Runner it is given, so the same loop is driven by real processes in the
// daemon and by fakes with a manual clock in tests.
//
// Invariants: no other goroutine reads or writes service state; every state
// change is a legal transition (see CanMove) and is published on the event
// bus; planned restarts and operator stops never count as crashes; a service
// starts only once everything it depends on is running and ready, and at
// shutdown stops only once nothing that depends on it is still running.
//
// It deliberately does not spawn processes, open files or read the clock
// itself: those are the Runner's and the Clock's jobs.
package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/checkpoint"
	"github.com/vigil-dev/vigil/internal/clock"
	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/policy"
	"golang.org/x/sys/unix"
)

// Runner starts instances. The daemon's runner forks real processes; tests
// use fakes.
type Runner interface {
	// Start spawns one instance of svc. onExit must be called exactly once,
	// from any goroutine, when the instance's main process has ended. It may
	// come even before Start returns: the supervisor queues it on its loop,
	// which handles it only after Start's result.
	Start(svc *config.Service, onExit func(Exit)) (Instance, error)
	// Adopt takes over ref, a live instance of svc that a previous daemon
	// started; onExit as for Start. A process that is gone, or whose pid
	// now names another process, is an error.
	Adopt(svc *config.Service, ref checkpoint.Instance, onExit func(Exit)) (Instance, error)
}

// Exit is how an instance's main process ended.
type Exit struct {
	Status syscall.WaitStatus
	At     time.Time
	// Lost: an adopted instance ended and its status cannot be known.
	Lost bool
}

// Instance is a started process tree.
type Instance interface {
	PID() int
	// Signal sends sig to the instance's whole process tree.
	Signal(sig syscall.Signal) error
	// KillAll sends SIGKILL to every process still belonging to the
	// instance and reports how many there were.
	KillAll() int
	// Release frees what the runner holds for the instance once it is gone.
	Release()
	// SignalMain sends sig to one process of the instance (its main one).
	SignalMain(pid int, sig syscall.Signal) error
	// Alive reports whether pid still runs (and is not a zombie).
	Alive(pid int) bool
	// Owns reports whether pid is one of the instance's processes.
	Owns(pid int) bool
	// StartTime is the main process's start time (/proc/PID/stat field
	// 22): with the pid, its identity. 0 when unknown.
	StartTime() uint64
	// PGID is the instance's process group.
	PGID() int
	// Cgroup and Token find the instance's processes after a daemon crash
	// (see checkpoint.Instance).
	Cgroup() string
	Token() string
}

// Options configures New. Runner is required; every other zero value works.
type Options struct {
	Services []config.Service
	Runner   Runner
	Clock    clock.Clock    // default clock.Real{}
	Bus      *event.Bus     // default: a private bus nobody listens to
	Logger   *slog.Logger   // default slog.Default()
	Rand     func() float64 // uniform [0,1) for backoff jitter; default math/rand/v2
	// Boot is the kernel's boot id, kept with every instance so that
	// recovery never takes a process of a later boot for one of them.
	Boot string
	// Check runs readiness and liveness checks; nil passes every check.
	Check CheckFunc
	// ProcessGroup resolves a notify sender that is not a main process to
	// its process group; nil accepts datagrams from main processes only.
	ProcessGroup func(pid int) (pgid int, ok bool)
	// Durable calls done, from any goroutine, once everything published on
	// Bus so far is on disk (the journal's barrier). A crash's restart and
	// the answer to an operator command wait for it. Nil: nothing waits.
	Durable func(done func(error))
	// DurableWait bounds that wait: a journal that has not answered by
	// then (a hung disk) is logged and supervision goes on. Default 5s.
	DurableWait time.Duration
	// Flush asks, without waiting, that what was published on Bus so far
	// be written out (write(2), not fsync) now rather than by the
	// journal's writer a moment later. The loop calls it after a step
	// that started instances and before the next step (a status query
	// among them), so that a daemon killed the moment an instance shows
	// as running has its record for the next one to adopt it by. Nil:
	// nothing is asked.
	Flush func()
	// CrashOutput returns the last lines a service wrote, for its crash
	// record; nil records none.
	CrashOutput func(service string) []string
}

// Supervisor runs the event loop. Create it with New, run Run in a
// goroutine, then call its methods from anywhere.
type Supervisor struct {
	runner Runner
	clock  clock.Clock
	bus    *event.Bus
	log    *slog.Logger
	rand   func() float64
	check  CheckFunc
	pgidOf func(int) (int, bool)
	boot   string
	// checkPosted, in tests, learns that a check's result is on the loop's
	// queue, where Sync will see it.
	checkPosted func()
	// durable, durableWait, flush and crashOutput: see Options.
	durable     func(done func(error))
	durableWait time.Duration
	flush       func()
	crashOutput func(string) []string

	// pids maps the main pid of every live instance to its *heartbeat,
	// for the notify server's goroutine; only the loop adds and removes.
	pids          sync.Map
	notifyUnknown atomic.Uint64
	notifyNotMain atomic.Uint64

	qmu   sync.Mutex
	queue []func()
	wake  chan struct{}

	// Owned by the loop goroutine only.
	kickQueued bool // a kick is posted to continue a large start
	turnSpawns int  // spawns in this turn of the loop, for kickBatch
	unflushed  bool // an instance started since Options.Flush was last called
	batchLeft  int  // events after this one in the batch the loop is running
	services   map[string]*service
	order      []string            // config order
	dependents map[string][]string // reverse depends_on
	stopAll    bool
	allStopped []func()
	safeMode   bool // only essential services are started
}

type service struct {
	cfg      config.Service
	pol      policy.Policy
	state    State
	reason   string
	want     bool // the operator wants it running
	removed  bool // dropped by a reload: forget it once stopped
	inst     *instance
	tracker  policy.Tracker
	restarts int
	lastExit *apitype.Exit
	recovery Recovery

	ready      bool   // running and ready (READY=1, a passing check, or spawned)
	statusText string // last STATUS=

	nextRestartAt time.Time
	restartTimer  clock.Timer
	restartGen    uint64 // bumped on every schedule and cancel: a stale restart never fires
	stableTimer   clock.Timer

	// A planned restart in progress: start again once the exit is seen,
	// with newCfg when a reload changed the service.
	planned bool
	newCfg  *config.Service

	onStopped []func(error)
	onStarted []func(error)

	// unjournaled counts crash records not yet durable; a restart that
	// comes due before they are waits in deferredRestart.
	unjournaled     int
	deferredRestart func()
	blob            []byte // the service's own state, for the checkpoint

	// held: the operator stopped it before the daemon's crash, so
	// StartAll leaves it stopped; start, restart and reset clear it.
	held bool
}

type instance struct {
	h             Instance
	pid           int
	mainPID       int // MAINPID= may name another of its processes
	startedAt     time.Time
	stopRequested bool
	failClass     policy.Class // set when vigil ends it as hung or not ready in time
	leases        []string

	watchdog      time.Duration // 0: no watchdog
	hb            *heartbeat    // set at spawn
	probeFailures int

	killTimer, startTimer, checkTimer, wdTimer, probeTimer clock.Timer
	killDeadline, startDeadline                            time.Time
}

// New returns a supervisor for services; nothing starts until StartAll or Start.
func New(opts Options) *Supervisor {
	s := &Supervisor{
		runner:      opts.Runner,
		clock:       opts.Clock,
		bus:         opts.Bus,
		log:         opts.Logger,
		rand:        opts.Rand,
		check:       opts.Check,
		pgidOf:      opts.ProcessGroup,
		boot:        opts.Boot,
		durable:     opts.Durable,
		durableWait: opts.DurableWait,
		flush:       opts.Flush,

		crashOutput: opts.CrashOutput,
		wake:        make(chan struct{}, 1),
		services:    make(map[string]*service),
	}
	if s.clock == nil {
		s.clock = clock.Real{}
	}
	if s.bus == nil {
		s.bus = &event.Bus{}
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.rand == nil {
		s.rand = rand.Float64
	}
	if s.durableWait <= 0 {
		s.durableWait = 5 * time.Second
	}
	for _, c := range opts.Services {
		s.add(c)
	}
	s.indexDependents()
	return s
}

// Run processes events until ctx is done. Call StopAll first for a
// graceful end: Run does not stop services by itself.
func (s *Supervisor) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		for {
			s.qmu.Lock()
			batch := s.queue
			s.queue = nil
			s.qmu.Unlock()
			if len(batch) == 0 {
				break
			}
			for i, f := range batch {
				s.turnSpawns, s.batchLeft = 0, len(batch)-1-i
				f()
				if s.unflushed && s.flush != nil {
					s.unflushed = false
					s.flush()
				}
			}
		}
	}
}

// post queues f to run on the loop. It never blocks, so the reaper and
// timers can call it from anywhere.
func (s *Supervisor) post(f func()) {
	s.qmu.Lock()
	s.queue = append(s.queue, f)
	s.qmu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// call runs f on the loop and waits for it to report through done, which
// f may keep and call later (for example once a stop has completed).
func (s *Supervisor) call(f func(done func(error))) error {
	ch := make(chan error, 1)
	s.post(func() {
		f(func(err error) { ch <- err })
	})
	return <-ch
}

// Sync returns once the loop is idle: every event posted before it, and
// every event those posted in turn (a zero-delay restart), has been
// processed. It is the round-trip that tests use instead of sleeping.
func (s *Supervisor) Sync() {
	for {
		idle := false
		_ = s.call(func(done func(error)) {
			s.qmu.Lock()
			idle = len(s.queue) == 0 && s.batchLeft == 0
			s.qmu.Unlock()
			done(nil)
		})
		if idle {
			return
		}
	}
}

// Services returns the status projection of every service, in config order.
func (s *Supervisor) Services() []apitype.Service {
	var out []apitype.Service
	_ = s.call(func(done func(error)) {
		out = make([]apitype.Service, 0, len(s.order))
		now := s.clock.Now()
		for _, name := range s.order {
			out = append(out, s.project(s.services[name], now))
		}
		done(nil)
	})
	return out
}

// StartAll starts every autostart service in dependency order.
func (s *Supervisor) StartAll() {
	s.post(func() {
		s.stopAll = false
		for _, name := range s.order {
			svc := s.services[name]
			if svc.cfg.Autostart && svc.state == Stopped && !svc.held && (svc.cfg.Essential || !s.safeMode) {
				s.want(svc)
			}
		}
		s.kick()
	})
}

// StopAll stops every service, dependents before what they depend on, and
// returns once nothing runs.
func (s *Supervisor) StopAll() {
	_ = s.call(func(done func(error)) {
		s.stopAll = true
		for _, svc := range s.services {
			svc.want = false
			svc.planned = false
		}
		s.allStopped = append(s.allStopped, func() { done(nil) })
		s.kickStop()
	})
}

// Start starts a stopped or exited service (and what it depends on). It
// returns once the instance is spawned, or at once when it must wait for a
// dependency.
func (s *Supervisor) Start(name string) error {
	return s.onService(name, "start", true, func(svc *service, done func(error)) {
		switch svc.state {
		case Stopped, Exited, Failed:
			svc.onStarted = append(svc.onStarted, done)
			s.startNow(svc)
		default:
			svc.want = true
			done(nil)
		}
	})
}

// Stop stops a service and returns once its instance has exited.
func (s *Supervisor) Stop(name string) error {
	return s.onService(name, "stop", false, func(svc *service, done func(error)) {
		svc.want = false
		svc.planned = false
		svc.onStopped = append(svc.onStopped, done)
		s.stop(svc)
	})
}

// Restart is a planned restart: stop then start, never counted as a crash.
// It returns once the new instance has been spawned.
func (s *Supervisor) Restart(name string) error {
	return s.onService(name, "restart", true, func(svc *service, done func(error)) {
		svc.want, svc.held = true, false
		svc.onStarted = append(svc.onStarted, done)
		s.restart(svc)
	})
}

// Reset closes the crash-loop breaker, clears the crash and restart counts,
// and starts the service again if the breaker had stopped it.
func (s *Supervisor) Reset(name string) error {
	return s.onService(name, "reset", false, func(svc *service, done func(error)) {
		svc.tracker.Reset()
		svc.restarts = 0
		switch svc.state {
		case Failed, Backoff:
			svc.onStarted = append(svc.onStarted, done)
			svc.recovery = Healthy
			s.startNow(svc)
		default:
			if svc.state == Running {
				svc.recovery = Healthy
			}
			done(nil)
		}
	})
}

// Reload applies a new set of service definitions: new services start,
// removed ones stop, changed ones restart (planned), and every unchanged
// service is left untouched.
func (s *Supervisor) Reload(services []config.Service) apitype.ReloadResult {
	res := apitype.ReloadResult{Added: []string{}, Removed: []string{}, Changed: []string{}, Unchanged: []string{}}
	_ = s.call(func(done func(error)) {
		keep := make(map[string]bool, len(services))
		for _, c := range services {
			keep[c.Name] = true
		}
		for _, name := range s.order {
			if !keep[name] {
				res.Removed = append(res.Removed, name)
				svc := s.services[name]
				svc.removed = true
				svc.want = false
				svc.planned = false
				s.stop(svc)
			}
		}
		s.order = s.order[:0]
		for _, c := range services {
			old, ok := s.services[c.Name]
			switch {
			case !ok || old.removed:
				if ok { // removed earlier and still stopping: replace it when gone
					delete(s.services, c.Name)
				}
				res.Added = append(res.Added, c.Name)
				s.add(c)
			case old.cfg.Equal(c):
				res.Unchanged = append(res.Unchanged, c.Name)
				s.order = append(s.order, c.Name)
			default:
				res.Changed = append(res.Changed, c.Name)
				s.order = append(s.order, c.Name)
				s.change(old, c)
			}
		}
		s.indexDependents()
		for _, name := range res.Added {
			if svc := s.services[name]; svc.cfg.Autostart && !s.stopAll {
				s.want(svc)
			}
		}
		s.bus.Publish(event.Event{Time: s.clock.Now(), Topic: event.OperatorCommand, Message: "reload"})
		s.kick()
		done(nil)
	})
	s.WaitDurable()
	return res
}

func (s *Supervisor) add(c config.Service) {
	s.services[c.Name] = &service{
		cfg:      c,
		pol:      policyOf(c),
		state:    Stopped,
		recovery: Healthy,
		tracker:  policy.Tracker{Breaker: policy.BreakerClosed},
	}
	s.order = append(s.order, c.Name)
}

// change applies a changed definition: a running service restarts with it.
func (s *Supervisor) change(svc *service, c config.Service) {
	if svc.inst == nil {
		svc.cfg, svc.pol = c, policyOf(c)
		return
	}
	cc := c
	svc.newCfg = &cc
	s.restart(svc)
}

func (s *Supervisor) indexDependents() {
	s.dependents = make(map[string][]string)
	for _, name := range s.order {
		for _, d := range s.services[name].cfg.DependsOn {
			s.dependents[d] = append(s.dependents[d], name)
		}
	}
}

// onService runs f on the loop for the service called name; an unknown name,
// or with refuseFailed a service whose breaker is open, is answered at once.
//
// The command is published (and so journaled) before it acts, and the
// answer waits until everything it caused is durable.
func (s *Supervisor) onService(name, command string, refuseFailed bool, f func(svc *service, done func(error))) error {
	err := s.call(func(done func(error)) {
		svc, err := s.lookup(name)
		switch {
		case err != nil:
			done(err)
		case refuseFailed && svc.tracker.Breaker == policy.BreakerOpen:
			done(apitype.Errorf(apitype.CodeFailedPrecondition,
				"service %q is failed (crash loop): run `vigil reset %s` to start it again", name, name))
		default:
			s.bus.Publish(event.Event{Time: s.clock.Now(), Topic: event.OperatorCommand, Service: name, Message: command})
			f(svc, done)
		}
	})
	s.WaitDurable()
	return err
}

// WaitDurable returns once everything published so far is on disk, or
// after Options.DurableWait. A journal that cannot write is reported by
// the daemon; the command it follows has happened either way, so its
// answer stands.
func (s *Supervisor) WaitDurable() { s.Await(s.durable) }

// Await is WaitDurable for another barrier of the journal's: it calls
// barrier and returns once barrier calls back, or after
// Options.DurableWait. The daemon uses it for the changes it publishes
// itself (sessions).
func (s *Supervisor) Await(barrier func(done func(error))) {
	if barrier == nil {
		return
	}
	expired := make(chan struct{})
	t := s.clock.AfterFunc(s.durableWait, func() { close(expired) })
	defer t.Stop()
	c := make(chan error, 1)
	barrier(func(err error) { c <- err })
	select {
	case err := <-c:
		if err != nil {
			s.log.Error("operator command not journaled", "err", err)
		}
	case <-expired:
		s.log.Error("operator command not journaled", "err", errDurableTimeout(s.durableWait))
	}
}

func (s *Supervisor) lookup(name string) (*service, error) {
	svc, ok := s.services[name]
	if !ok || svc.removed {
		return nil, apitype.Errorf(apitype.CodeNotFound, "unknown service %q", name)
	}
	return svc, nil
}

// want marks svc and everything it depends on as wanted, moving stopped
// ones to Starting; kick then spawns them as their dependencies allow.
func (s *Supervisor) want(svc *service) {
	svc.want, svc.held = true, false
	switch svc.state {
	case Stopped, Exited, Failed:
		s.move(svc, Starting, "")
	}
	for _, d := range svc.cfg.DependsOn {
		if dep, ok := s.services[d]; ok && !dep.removed && !dep.want {
			s.want(dep)
		}
	}
}

// kickBatch is how many spawns one turn of the loop makes. A fork and exec
// takes one to a few milliseconds, so a thousand services started at once
// would otherwise hold the loop for seconds while watchdog deadlines,
// exits and API calls wait behind them; one spawn per turn costs only a
// queued function each.
const kickBatch = 1

// kick spawns every wanted service whose dependencies are ready, at most
// kickBatch in this turn of the loop; the rest follow in the next turns.
func (s *Supervisor) kick() {
	for progress := true; progress; {
		progress = false
		for _, name := range s.order {
			svc := s.services[name]
			if svc.state != Starting || svc.inst != nil || !svc.want {
				continue
			}
			if blocker := s.blocker(svc); blocker != "" {
				svc.reason = "waiting for " + blocker
				continue
			}
			if s.turnSpawns >= kickBatch {
				if !s.kickQueued {
					s.kickQueued = true
					s.post(func() { s.kickQueued = false; s.kick() })
				}
				return
			}
			s.turnSpawns++ // shared with the kicks a spawn may nest (a dependent made ready)
			s.spawn(svc)
			progress = progress || svc.state == Running
		}
	}
}

// blocker names the first dependency of svc that is not running and ready.
func (s *Supervisor) blocker(svc *service) string {
	for _, d := range svc.cfg.DependsOn {
		dep, ok := s.services[d]
		if !ok || dep.state != Running {
			return d
		}
	}
	return ""
}

func (s *Supervisor) spawn(svc *service) {
	inst := &instance{startedAt: s.clock.Now()}
	h, err := s.runner.Start(&svc.cfg, func(e Exit) {
		s.post(func() { s.exited(svc, inst, e) })
	})
	if err != nil {
		s.spawnFailed(svc, err)
		return
	}
	inst.h, inst.pid = h, h.PID()
	svc.inst = inst
	svc.nextRestartAt = time.Time{}
	switch svc.recovery {
	case ObservedFailure, RecoveryFailed:
		svc.recovery = RecoveryStarted
	case PlannedRestart:
		svc.recovery = Healthy
	}
	if svc.recovery == RecoveryStarted || svc.tracker.Breaker == policy.BreakerHalfOpen {
		s.armStableTimer(svc, inst)
	}
	s.log.Info("started", "service", svc.cfg.Name, "pid", inst.pid)
	s.unflushed = true
	s.afterSpawn(svc, inst)
}

// armStableTimer marks the instance as having recovered once it has stayed
// up for backoff.reset_after. Only a recovering instance gets one, so a
// healthy idle system has no timers at all.
func (s *Supervisor) armStableTimer(svc *service, inst *instance) {
	d := svc.pol.Backoff.ResetAfter
	svc.stableTimer = s.clock.AfterFunc(d, func() {
		s.post(func() {
			if svc.inst != inst {
				return
			}
			svc.tracker.OnStable()
			if svc.recovery == RecoveryStarted {
				svc.recovery = Recovered
			}
			s.publish(svc, event.ServiceState, svc.state, "stable for "+d.String())
		})
	})
}

func (s *Supervisor) spawnFailed(svc *service, err error) {
	now := s.clock.Now()
	s.log.Warn("spawn failed", "service", svc.cfg.Name, "err", err)
	svc.lastExit = &apitype.Exit{Class: string(policy.ClassSpawnFailed), At: now, Error: err.Error()}
	d := svc.tracker.OnExit(svc.pol, policy.Exit{Class: policy.ClassSpawnFailed}, 0, now, s.rand())
	s.publishCrash(svc, nil, now, d) // the record first, then what is done about it
	s.decided(svc, policy.ClassSpawnFailed, d)
	s.finishStarted(svc, apitype.Errorf(apitype.CodeFailedPrecondition, "%s: %v", svc.cfg.Name, err))
}

// exited handles the end of an instance's main process.
func (s *Supervisor) exited(svc *service, inst *instance, e Exit) {
	if svc.inst != inst {
		return
	}
	svc.inst = nil
	svc.ready = false
	s.pids.Delete(inst.pid)
	inst.endTimers()
	stopTimer(&svc.stableTimer)
	if n := inst.h.KillAll(); n > 0 {
		s.log.Info("killed leftover processes", "service", svc.cfg.Name, "pid", inst.pid, "count", n)
	}
	inst.h.Release()

	pe := policy.Classify(e.Status, inst.stopRequested, svc.cfg.SuccessExit)
	if e.Lost && !inst.stopRequested {
		pe = policy.Exit{Class: policy.ClassLost}
	}
	if inst.failClass != "" && !inst.stopRequested {
		pe.Class = inst.failClass
	}
	svc.lastExit = apiExit(pe, e.At)
	s.log.Info("exited", "service", svc.cfg.Name, "pid", inst.pid, "class", pe.Class)

	if inst.stopRequested {
		s.stoppedOnPurpose(svc)
		return
	}
	d := svc.tracker.OnExit(svc.pol, pe, e.At.Sub(inst.startedAt), e.At, s.rand())
	if s.stopAll || !svc.want {
		d.Restart = false
	}
	if pe.Class.IsCrash() {
		s.publishCrash(svc, inst, e.At, d) // the record first, then what is done about it
	}
	s.decided(svc, pe.Class, d)
	s.afterExit()
}

// stoppedOnPurpose finishes a stop or the first half of a planned restart.
func (s *Supervisor) stoppedOnPurpose(svc *service) {
	if svc.planned && svc.want && !s.stopAll {
		svc.planned = false
		if svc.newCfg != nil {
			svc.cfg, svc.pol, svc.newCfg = *svc.newCfg, policyOf(*svc.newCfg), nil
		}
		s.move(svc, Starting, "planned restart")
		s.kick()
	} else {
		svc.planned = false
		s.move(svc, Stopped, "")
		s.finishStopped(svc)
	}
	s.afterExit()
}

// decided carries out the policy's decision about an ended instance.
func (s *Supervisor) decided(svc *service, class policy.Class, d policy.Decision) {
	now := s.clock.Now()
	switch {
	case d.Tripped || svc.tracker.Breaker == policy.BreakerOpen:
		s.failed(svc, d.Reason)
		s.bus.Publish(event.Event{Time: now, Topic: event.BreakerTripped, Service: svc.cfg.Name,
			Reason: string(d.Reason), Exit: svc.lastExit})
		s.log.Warn("crash loop: manual action required", "service", svc.cfg.Name,
			"crashes", svc.tracker.CrashesInWindow(svc.pol, now))
	case d.Restart:
		if class.IsCrash() {
			svc.recovery = ObservedFailure
		}
		s.move(svc, Backoff, string(d.Reason))
		s.scheduleRestart(svc, d.Delay, func() {
			svc.restarts++
			s.move(svc, Starting, "")
		})
	default:
		if class.IsCrash() {
			svc.recovery = RecoveryFailed
		}
		s.move(svc, Exited, string(d.Reason))
		s.finishStopped(svc)
	}
}

// failed parks svc with its breaker open until an operator's reset, or
// until its cooldown lets one trial start through.
func (s *Supervisor) failed(svc *service, reason policy.Reason) {
	now := s.clock.Now()
	svc.recovery = ManualActionRequired
	s.move(svc, Failed, string(reason))
	if until, ok := svc.tracker.CooldownDue(svc.pol); ok {
		s.scheduleRestart(svc, until.Sub(now), func() {
			svc.tracker.HalfOpen()
			s.move(svc, Starting, string(policy.ReasonHalfOpenTrial))
		})
	}
}

// scheduleRestart runs begin and then kick after delay. A zero delay is
// queued rather than run inline, so a crash loop with no backoff neither
// recurses nor starves other events.
func (s *Supervisor) scheduleRestart(svc *service, delay time.Duration, begin func()) {
	s.cancelRestartTimer(svc)
	gen := svc.restartGen
	var fire func()
	fire = func() {
		if svc.restartGen != gen {
			return
		}
		if svc.unjournaled > 0 {
			// A crash record is not durable yet: the restart waits for it.
			svc.deferredRestart = fire
			return
		}
		svc.restartTimer = nil
		svc.nextRestartAt = time.Time{}
		if !svc.want || svc.removed || s.stopAll {
			return
		}
		begin()
		s.kick()
	}
	if delay <= 0 {
		s.post(fire)
		return
	}
	svc.nextRestartAt = s.clock.Now().Add(delay)
	svc.restartTimer = s.clock.AfterFunc(delay, func() { s.post(fire) })
}

func (s *Supervisor) cancelRestartTimer(svc *service) {
	svc.restartGen++
	stopTimer(&svc.restartTimer)
	svc.nextRestartAt = time.Time{}
}

// stop ends svc's instance (or its pending start or restart).
func (s *Supervisor) stop(svc *service) {
	switch {
	case svc.inst != nil:
		s.signalStop(svc)
	case svc.state == Stopping:
	default:
		s.cancelRestartTimer(svc)
		if svc.state != Stopped {
			s.move(svc, Stopped, "")
		}
		s.finishStopped(svc)
		s.afterExit()
	}
}

// restart begins a planned restart of svc.
func (s *Supervisor) restart(svc *service) {
	svc.planned = true
	switch {
	case svc.inst != nil:
		svc.recovery = PlannedRestart
		s.signalStop(svc)
	case svc.state == Stopping:
	default:
		svc.planned = false
		s.cancelRestartTimer(svc)
		if svc.newCfg != nil {
			svc.cfg, svc.pol, svc.newCfg = *svc.newCfg, policyOf(*svc.newCfg), nil
		}
		if svc.state == Starting {
			s.finishStarted(svc, nil) // still waiting for a dependency
			return
		}
		s.startNow(svc)
	}
}

// startNow moves a service that has no instance to Starting at once,
// skipping any pending backoff, and spawns it if its dependencies allow.
func (s *Supervisor) startNow(svc *service) {
	s.cancelRestartTimer(svc)
	if svc.state == Backoff {
		s.move(svc, Starting, "")
	}
	s.want(svc)
	s.kick()
	if svc.inst == nil && svc.state == Starting {
		s.finishStarted(svc, nil) // waiting for a dependency
	}
}

// signalStop sends the stop signal to the instance's tree and arms the
// SIGKILL escalation.
func (s *Supervisor) signalStop(svc *service) {
	inst := svc.inst
	if inst.stopRequested {
		return
	}
	inst.stopRequested = true
	inst.endTimers()
	svc.ready = false
	s.move(svc, Stopping, "")
	if err := inst.h.Signal(svc.cfg.StopSignal); err != nil {
		s.log.Warn("stop signal failed", "service", svc.cfg.Name, "pid", inst.pid, "err", err)
	}
	s.armKill(svc, inst, svc.cfg.StopTimeout)
}

// afterExit re-evaluates what waits on a service going away: dependents'
// starts, and an ordered shutdown.
func (s *Supervisor) afterExit() {
	if s.stopAll {
		s.kickStop()
	}
	for name, svc := range s.services {
		if svc.removed && svc.inst == nil && !svc.state.active() {
			if cur := s.services[name]; cur == svc {
				delete(s.services, name)
			}
		}
	}
}

// kickStop stops every service that nothing running depends on any more,
// and reports completion once nothing is left.
func (s *Supervisor) kickStop() {
	busy := false
	for _, svc := range s.services {
		if svc.inst == nil && svc.state != Stopping {
			if svc.state == Starting || svc.state == Backoff {
				s.stop(svc)
			}
			continue
		}
		busy = true
		if svc.inst != nil && !svc.inst.stopRequested && !s.hasActiveDependent(svc) {
			s.signalStop(svc)
		}
	}
	if !busy {
		for _, f := range s.allStopped {
			f()
		}
		s.allStopped = nil
	}
}

func (s *Supervisor) hasActiveDependent(svc *service) bool {
	for _, d := range s.dependents[svc.cfg.Name] {
		if dep, ok := s.services[d]; ok && dep.inst != nil {
			return true
		}
	}
	return false
}

func (s *Supervisor) move(svc *service, to State, reason string) {
	from := svc.state
	if from == to {
		svc.reason = reason
		return
	}
	if !CanMove(from, to) {
		err := &TransitionError{Service: svc.cfg.Name, From: from, To: to}
		s.log.Error(err.Error())
		return
	}
	svc.state, svc.reason = to, reason
	s.publish(svc, event.ServiceState, from, reason)
}

func (s *Supervisor) publish(svc *service, topic event.Topic, from State, msg string) {
	e := event.Event{Time: s.clock.Now(), Topic: topic, Service: svc.cfg.Name, State: string(svc.state),
		From: string(from), Reason: svc.reason, Message: msg}
	if svc.inst != nil {
		e.PID = svc.inst.pid
		if topic == event.ServiceState {
			e.Instance = svc.inst.ref(svc, s.boot)
		}
	}
	s.bus.Publish(e)
}

// publishCrash publishes the crash record of inst (nil when the spawn
// itself failed), which the daemon journals; a restart that comes due
// before the record is durable waits for it, so no crash is ever acted
// upon without being on disk.
func (s *Supervisor) publishCrash(svc *service, inst *instance, at time.Time, d policy.Decision) {
	c := &apitype.Crash{
		Service:   svc.cfg.Name,
		Exit:      *svc.lastExit,
		StartedAt: at,
		Restarts:  svc.restarts,
		Action:    crashAction(svc, d),
		Output:    []string{},
		Leases:    []string{},
	}
	if inst != nil {
		c.PID, c.StartTime, c.StartedAt = inst.pid, inst.h.StartTime(), inst.startedAt
		c.UptimeMS = at.Sub(inst.startedAt).Milliseconds()
		c.Leases = append(c.Leases, inst.leases...)
	}
	if s.crashOutput != nil {
		c.Output = s.crashOutput(svc.cfg.Name)
	}
	s.bus.Publish(event.Event{Time: s.clock.Now(), Topic: event.CrashDetected, Service: svc.cfg.Name,
		PID: c.PID, Exit: svc.lastExit, Crash: c})
	if s.durable == nil {
		return
	}
	// The restart waits for the record, but not for ever: a disk that
	// hangs must not stop supervision. Whichever comes first settles it.
	svc.unjournaled++
	settled := false
	var timer clock.Timer
	settle := func(err error) {
		if settled {
			return
		}
		settled = true
		if timer != nil {
			timer.Stop()
		}
		if err != nil {
			s.log.Error("crash record not journaled", "service", svc.cfg.Name, "pid", c.PID, "err", err)
		}
		if svc.unjournaled--; svc.unjournaled == 0 && svc.deferredRestart != nil {
			f := svc.deferredRestart
			svc.deferredRestart = nil
			f()
		}
	}
	timer = s.clock.AfterFunc(s.durableWait, func() {
		s.post(func() { settle(errDurableTimeout(s.durableWait)) })
	})
	s.durable(func(err error) { s.post(func() { settle(err) }) })
}

// errDurableTimeout: the journal did not confirm a record within d.
func errDurableTimeout(d time.Duration) error {
	return fmt.Errorf("not durable within %s: the disk is stalled; going on without it", d)
}

// crashAction says what vigil does about a crash, for its record: what
// decided will do with d.
func crashAction(svc *service, d policy.Decision) string {
	switch {
	case d.Tripped || svc.tracker.Breaker == policy.BreakerOpen:
		return string(policy.ReasonManualActionRequired)
	case d.Restart:
		return "restart in " + d.Delay.Round(time.Millisecond).String()
	}
	return "left down: " + string(d.Reason)
}

func (s *Supervisor) finishStarted(svc *service, err error) {
	for _, f := range svc.onStarted {
		f(err)
	}
	svc.onStarted = nil
}

func (s *Supervisor) finishStopped(svc *service) {
	for _, f := range svc.onStopped {
		f(nil)
	}
	svc.onStopped = nil
	if svc.state != Starting {
		s.finishStarted(svc, nil)
	}
}

func (s *Supervisor) project(svc *service, now time.Time) apitype.Service {
	out := apitype.Service{
		Name:            svc.cfg.Name,
		State:           string(svc.state),
		Ready:           svc.ready && svc.state == Running,
		Restarts:        svc.restarts,
		LastExit:        svc.lastExit,
		Recovery:        string(svc.recovery),
		Breaker:         string(svc.tracker.Breaker),
		CrashesInWindow: svc.tracker.CrashesInWindow(svc.pol, now),
		Reason:          svc.reason,
		Status:          svc.statusText,
		Leases:          []string{},
	}
	if inst := svc.inst; inst != nil {
		out.PID = inst.pid
		t := inst.startedAt
		out.StartedAt = &t
		out.Leases = slices.Clone(inst.leases)
		if inst.watchdog > 0 && svc.state == Running {
			age := now.Sub(inst.hb.at()).Milliseconds()
			out.HeartbeatAgeMS = &age
		}
	}
	if !svc.nextRestartAt.IsZero() {
		t := svc.nextRestartAt
		out.NextRestartAt = &t
	}
	return out
}

func policyOf(c config.Service) policy.Policy {
	return policy.Policy{
		Restart:     policy.Restart(c.Restart),
		SuccessExit: c.SuccessExit,
		Backoff: policy.Backoff{
			Initial:    c.Backoff.Initial,
			Max:        c.Backoff.Max,
			Multiplier: c.Backoff.Multiplier,
			Jitter:     c.Backoff.Jitter,
			ResetAfter: c.Backoff.ResetAfter,
		},
		CrashLoop: policy.CrashLoop{
			Crashes:  c.CrashLoop.Crashes,
			Window:   c.CrashLoop.Window,
			Cooldown: c.CrashLoop.Cooldown,
		},
	}
}

func apiExit(e policy.Exit, at time.Time) *apitype.Exit {
	out := &apitype.Exit{Class: string(e.Class), CoreDumped: e.CoreDumped, At: at}
	if e.Exited {
		code := e.Code
		out.Code = &code
	} else if e.Signal != 0 {
		out.Signal = unix.SignalName(e.Signal)
	}
	return out
}

func stopTimer(t *clock.Timer) {
	if *t != nil {
		(*t).Stop()
		*t = nil
	}
}

// Checkpoint returns what a checkpoint keeps of every service: what the
// operator wants, breaker and backoff state, the live instance, its blob.
func (s *Supervisor) Checkpoint() checkpoint.State {
	var st checkpoint.State
	_ = s.call(func(done func(error)) {
		st.SafeMode = s.safeMode
		st.Services = make([]checkpoint.Service, 0, len(s.order))
		for _, name := range s.order {
			svc := s.services[name]
			cs := checkpoint.Service{
				Name:          name,
				Desired:       checkpoint.DesiredStopped,
				State:         string(svc.state),
				Restarts:      svc.restarts,
				Tracker:       svc.tracker,
				NextRestartAt: svc.nextRestartAt,
				Blob:          svc.blob,
			}
			cs.Tracker.Crashes = slices.Clone(cs.Tracker.Crashes)
			if svc.want {
				cs.Desired = checkpoint.DesiredRunning
			}
			if inst := svc.inst; inst != nil {
				cs.Instance = inst.ref(svc, s.boot)
			}
			st.Services = append(st.Services, cs)
		}
		done(nil)
	})
	return st
}

// ref describes inst for the checkpoint and the journal: enough to find
// and adopt it after the daemon's own death, in boot boot.
func (inst *instance) ref(svc *service, boot string) *checkpoint.Instance {
	r := &checkpoint.Instance{
		PID:       inst.pid,
		StartTime: inst.h.StartTime(),
		PGID:      inst.h.PGID(),
		StartedAt: inst.startedAt,
		Ready:     svc.ready,
		Leases:    slices.Clone(inst.leases),
		Cgroup:    inst.h.Cgroup(),
		Token:     inst.h.Token(),
		Boot:      boot,
	}
	if inst.mainPID != inst.pid {
		r.MainPID = inst.mainPID
	}
	return r
}

// MaxBlob is the largest per-service state blob SetBlob accepts.
const MaxBlob = 64 << 10

// SetBlob stores a service's own state (any JSON value) to be kept in
// every checkpoint; null clears it.
func (s *Supervisor) SetBlob(name string, blob []byte) error {
	if len(blob) > MaxBlob {
		return apitype.Errorf(apitype.CodeInvalidArgument, "state of %q is %d bytes; the limit is %d", name, len(blob), MaxBlob)
	}
	if !json.Valid(blob) {
		return apitype.Errorf(apitype.CodeInvalidArgument, "state of %q is not valid JSON", name)
	}
	if string(blob) == "null" {
		blob = nil
	}
	return s.call(func(done func(error)) {
		svc, err := s.lookup(name)
		if err == nil {
			svc.blob = slices.Clone(blob)
		}
		done(err)
	})
}
