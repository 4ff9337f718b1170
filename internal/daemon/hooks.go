package daemon

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/journal"
	"github.com/vigil-dev/vigil/internal/logs"
	"github.com/vigil-dev/vigil/internal/proc"
)

// Hook names, as a crash record lists them and as the config spells them.
const (
	hookOnCrash  = "on_crash"
	hookOnFailed = "on_failed"
)

// hookCatchUp is how far back a new daemon looks for hooks that were due
// when the previous one died.
const hookCatchUp = 24 * time.Hour

// hookJob is one hook due for one crash record.
type hookJob struct {
	seq   uint64 // the crash record's journal sequence number
	hook  string // hookOnCrash or hookOnFailed
	crash apitype.Crash
}

// hookRunner runs crash hooks, never on the event loop: on_crash after
// every crash and on_failed when a crash opens the breaker, each once its
// crash record is durable. Delivery is at least once: the record lists the
// hooks due, a hook.finished event records each run, and a daemon that
// starts runs those the previous daemon left unfinished. Hooks of one
// service run one at a time, in crash order.
type hookRunner struct {
	reaper   *proc.Reaper
	cfg      func() *config.Config
	bus      *event.Bus
	log      *slog.Logger
	stateDir string

	mu      sync.Mutex
	queues  map[string][]hookJob // per service, oldest first
	running map[string]bool      // a worker drains the service's queue
	closed  bool
	wg      sync.WaitGroup
}

// hooksDue lists the hooks svc has for crash c, by the config of now.
func hooksDue(svc config.Service, c *apitype.Crash) []string {
	var due []string
	if len(svc.OnCrash) > 0 {
		due = append(due, hookOnCrash)
	}
	if len(svc.OnFailed) > 0 && c.Action == "manual_action_required" {
		due = append(due, hookOnFailed)
	}
	return due
}

// due queues the hooks of the crash record seq, now durable.
func (h *hookRunner) due(seq uint64, c apitype.Crash) {
	c.Seq = seq
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return // the next daemon finds it unfinished and runs it
	}
	if h.queues == nil {
		h.queues, h.running = map[string][]hookJob{}, map[string]bool{}
	}
	for _, hook := range c.Hooks {
		h.queues[c.Service] = append(h.queues[c.Service], hookJob{seq: seq, hook: hook, crash: c})
	}
	if !h.running[c.Service] && len(h.queues[c.Service]) > 0 {
		h.running[c.Service] = true
		h.wg.Add(1)
		go h.drain(c.Service)
	}
}

func (h *hookRunner) drain(service string) {
	defer h.wg.Done()
	for {
		h.mu.Lock()
		q := h.queues[service]
		if len(q) == 0 || h.closed {
			h.running[service] = false
			h.mu.Unlock()
			return
		}
		job := q[0]
		h.queues[service] = q[1:]
		h.mu.Unlock()
		h.run(job)
	}
}

// close stops starting hooks and waits up to wait for those running; what
// did not finish is run again by the next daemon.
func (h *hookRunner) close(wait time.Duration) {
	h.mu.Lock()
	h.closed = true
	busy := false
	for _, r := range h.running {
		busy = busy || r
	}
	h.mu.Unlock()
	if !busy {
		return
	}
	done := make(chan struct{})
	go func() { h.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
		h.log.Warn("hooks still running at shutdown; the next daemon runs them again")
	}
}

// run runs one hook and publishes (so journals) how it ended.
func (h *hookRunner) run(job hookJob) {
	began := time.Now()
	outcome, err := h.exec(job)
	msg := fmt.Sprintf("%s for crash #%d: %s in %s", job.hook, job.seq, outcome, time.Since(began).Round(time.Millisecond))
	if err != nil {
		h.log.Warn("hook", "service", job.crash.Service, "hook", job.hook, "crash", job.seq, "err", err)
	} else {
		h.log.Info("hook", "service", job.crash.Service, "hook", job.hook, "crash", job.seq, "outcome", outcome)
	}
	h.bus.Publish(event.Event{Time: time.Now(), Topic: event.HookFinished, Service: job.crash.Service,
		Reason: job.hook, CrashSeq: job.seq, Message: msg})
}

// exec starts the hook with the crash record on stdin and waits for it,
// killing its process group after the service's hook_timeout.
func (h *hookRunner) exec(job hookJob) (string, error) {
	svc, err := h.cfg().Lookup(job.crash.Service)
	if err != nil {
		return "skipped: the service is no longer configured", err
	}
	argv := svc.OnCrash
	if job.hook == hookOnFailed {
		argv = svc.OnFailed
	}
	if len(argv) == 0 {
		return "skipped: no " + job.hook + " configured now", nil
	}
	record, err := json.Marshal(job.crash)
	if err != nil {
		return "not run", err
	}
	stdin, feed, err := os.Pipe()
	if err != nil {
		return "not run", err
	}
	defer stdin.Close()
	out, err := logs.OpenForChild(h.stateDir, svc.Name) // its output joins the service's log
	if err != nil {
		feed.Close()
		return "not run", err
	}
	defer out.Close()
	cred, err := credential(svc.User, svc.Group)
	if err != nil {
		feed.Close()
		return "not run", err
	}
	exited := make(chan proc.Exit, 1)
	p, err := h.reaper.Spawn(proc.Spec{Service: ".hooks", Path: argv[0], Args: argv, Dir: svc.Dir,
		Env: hookEnv(os.Environ(), *svc, job), Stdin: stdin, Stdout: out, Stderr: out, Credential: cred},
		func(e proc.Exit) { exited <- e })
	if err != nil {
		feed.Close()
		return "could not start: " + err.Error(), err
	}
	go func() { // a hook that does not read its stdin must not block us
		feed.Write(record)
		feed.Close()
	}()
	timer := time.NewTimer(svc.HookTimeout)
	defer timer.Stop()
	select {
	case e := <-exited:
		p.KillAll() // what it left running in its group
		p.Release()
		return describeExit(e.Status), nil
	case <-timer.C:
		p.KillAll()
		e := <-exited
		p.Release()
		return fmt.Sprintf("timed out after %s (%s)", svc.HookTimeout, describeExit(e.Status)),
			fmt.Errorf("%s timed out after %s", job.hook, svc.HookTimeout)
	}
}

// hookEnv is the daemon's environment, the service's own, and the crash's
// essentials, so a shell one-liner needs no JSON parser.
func hookEnv(base []string, svc config.Service, job hookJob) []string {
	c := job.crash
	svc.Watchdog = 0 // a hook is no service: no sd_notify watchdog for it
	env := childEnv(base, &svc, "")
	code, signal := "", c.Exit.Signal
	if c.Exit.Code != nil {
		code = strconv.Itoa(*c.Exit.Code)
	}
	return append(env, "VIGIL_SERVICE="+c.Service, "VIGIL_HOOK="+job.hook, "VIGIL_CLASS="+c.Exit.Class,
		"VIGIL_EXIT_CODE="+code, "VIGIL_SIGNAL="+signal, "VIGIL_LEASES="+strings.Join(c.Leases, ","),
		"VIGIL_CRASH_SEQ="+strconv.FormatUint(job.seq, 10), "VIGIL_PID="+strconv.Itoa(c.PID))
}

func describeExit(ws interface {
	Exited() bool
	ExitStatus() int
	Signaled() bool
}) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("exit %d", ws.ExitStatus())
	case ws.Signaled():
		return "killed by a signal"
	}
	return "ended"
}

// catchUp runs the hooks that crash records of previous daemons (the
// journal up to lastSeq, within hookCatchUp) list as due and that no
// hook.finished event records as run: they were due when a daemon died.
func (h *hookRunner) catchUp(rd *journal.Reader, lastSeq uint64) error {
	if lastSeq == 0 {
		return nil
	}
	recs, _, err := rd.Newest(journal.Query{Types: []journal.Type{journal.TypeCrash, journal.TypeEvent},
		Since: time.Now().Add(-hookCatchUp),
		Match: func(r journal.Record) bool {
			return r.Seq <= lastSeq && (r.Type == journal.TypeCrash || strings.Contains(string(r.Payload), `"topic":"`+string(event.HookFinished)+`"`))
		}})
	if err != nil {
		return err
	}
	type key struct {
		seq  uint64
		hook string
	}
	finished := map[key]bool{}
	var crashes []hookJob
	for i := len(recs) - 1; i >= 0; i-- { // oldest first
		var e event.Event
		if json.Unmarshal(recs[i].Payload, &e) != nil {
			continue
		}
		switch {
		case e.Topic == event.HookFinished:
			finished[key{e.CrashSeq, e.Reason}] = true
		case e.Crash != nil:
			for _, hook := range e.Crash.Hooks {
				crashes = append(crashes, hookJob{seq: recs[i].Seq, hook: hook, crash: *e.Crash})
			}
		}
	}
	for _, j := range crashes {
		if !finished[key{j.seq, j.hook}] {
			h.log.Info("hook was due when the daemon died: running it now", "service", j.crash.Service, "hook", j.hook, "crash", j.seq)
			c := j.crash
			c.Hooks = []string{j.hook}
			h.due(j.seq, c)
		}
	}
	return nil
}
