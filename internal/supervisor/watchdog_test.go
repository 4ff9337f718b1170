package supervisor

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/notify"
)

func msg(t *testing.T, payload string) notify.Message {
	t.Helper()
	m, err := notify.Parse([]byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// send delivers a datagram from pid and waits for the loop to handle it.
func (h *harness) send(pid int, payload string) {
	h.t.Helper()
	h.sup.Sync() // the instance a test talks for exists first
	h.sup.Notify(pid, msg(h.t, payload))
	h.sup.Sync()
}

func notifySvc(name string, deps ...string) config.Service {
	c := svc(name, deps...)
	c.Ready = config.Readiness{Kind: config.ReadyNotify}
	c.StartTimeout = 30 * time.Second
	c.NotifyAccess = config.NotifyGroup
	return c
}

func TestNotifyReadinessGatesDependents(t *testing.T) {
	h := newHarness(t, notifySvc("db"), svc("api", "db"))
	h.sup.StartAll()
	h.expectLog("spawn db 101")
	s := h.expectState("db", Starting)
	if s.Ready || s.Reason != "waiting for READY=1" {
		t.Fatalf("db before READY=1: %+v", s)
	}
	h.expectState("api", Starting)
	h.send(101, "STATUS=warming up\nREADY=1")
	h.expectLog("spawn api 102")
	s = h.expectState("db", Running)
	if !s.Ready || s.Status != "warming up" {
		t.Fatalf("db after READY=1: %+v", s)
	}
	h.expectState("api", Running)

	h.send(101, "RELOADING=1")
	if h.status("db").Ready {
		t.Fatal("still ready while RELOADING")
	}
	h.send(101, "READY=1")
	if !h.status("db").Ready {
		t.Fatal("not ready again after READY=1")
	}
}

func TestStartTimeoutIsItsOwnCrashClass(t *testing.T) {
	c := notifySvc("slow")
	c.StartTimeout = 5 * time.Second
	h := newHarness(t, c)
	h.sup.StartAll()
	h.expectLog("spawn slow 101")
	h.advance(4 * time.Second)
	h.send(101, "EXTEND_TIMEOUT_USEC=3000000") // now due at 7s
	h.advance(2*time.Second + 999*time.Millisecond)
	h.expectLog()
	h.advance(time.Millisecond)
	h.expectLog("signal slow 101 terminated")
	h.advance(10 * time.Second) // stop_timeout
	h.expectLog("killall slow 101")
	h.r.end(t, "slow", sigKill)
	s := h.expectState("slow", Backoff)
	if s.LastExit.Class != "start_timeout" || s.CrashesInWindow != 1 {
		t.Fatalf("after a start timeout: %+v %+v", s, s.LastExit)
	}
}

func TestWatchdogUnresponsiveGetsAbortThenKill(t *testing.T) {
	c := notifySvc("web")
	c.Watchdog = time.Second
	h := newHarness(t, c)
	h.sup.StartAll()
	h.send(101, "READY=1")
	h.expectLog("spawn web 101")
	// Heartbeats keep it alive however long it runs.
	for i := 0; i < 10; i++ {
		h.advance(1900 * time.Millisecond)
		h.send(101, "WATCHDOG=1")
	}
	h.expectLog()
	if age := h.status("web").HeartbeatAgeMS; age == nil || *age != 0 {
		t.Fatalf("heartbeat_age_ms = %v, want 0", age)
	}
	// It hangs: two intervals after the last heartbeat, to the millisecond.
	h.advance(1999 * time.Millisecond)
	h.expectLog()
	h.advance(time.Millisecond)
	h.expectLog("signal-main web 101 aborted")
	h.advance(10 * time.Second)
	h.expectLog("killall web 101")
	h.r.end(t, "web", sigKill)
	s := h.expectState("web", Backoff)
	if s.LastExit.Class != "unresponsive" {
		t.Fatalf("class = %q, want unresponsive", s.LastExit.Class)
	}
	h.advance(100 * time.Millisecond)
	h.expectLog("killall web 101", "spawn web 102")
}

func TestWatchdogHeartbeatTimeoutWhenMainProcessVanished(t *testing.T) {
	c := notifySvc("web")
	c.Watchdog = time.Second
	h := newHarness(t, c)
	h.sup.pgidOf = func(pid int) (int, bool) { return 101, pid == 555 }
	h.sup.StartAll()
	h.sup.Sync()
	in := h.r.live["web"]
	in.owns[555] = true
	h.send(555, "MAINPID=555\nREADY=1") // a process of its group takes over
	h.r.mu.Lock()
	in.gone[555] = true // and dies where we cannot see its exit
	h.r.mu.Unlock()
	h.r.takeLog()
	h.advance(2 * time.Second)
	h.expectLog("killall web 101")
	h.r.end(t, "web", sigKill)
	if s := h.status("web"); s.LastExit.Class != "heartbeat_timeout" {
		t.Fatalf("class = %q, want heartbeat_timeout", s.LastExit.Class)
	}
}

func TestWatchdogTriggerAndUSecChange(t *testing.T) {
	c := notifySvc("web")
	c.Watchdog = time.Second
	h := newHarness(t, c)
	h.sup.StartAll()
	h.send(101, "READY=1\nWATCHDOG_USEC=5000000")
	h.r.takeLog()
	h.advance(9 * time.Second) // the new 5s interval holds
	h.expectLog()
	h.send(101, "WATCHDOG=trigger")
	h.expectLog("signal-main web 101 aborted")
}

func TestNotifyAccessAndForgery(t *testing.T) {
	m := notifySvc("strict")
	m.NotifyAccess = config.NotifyMain
	m.Watchdog = time.Second
	g := notifySvc("loose")
	h := newHarness(t, m, g)
	groups := map[int]int{900: 101, 901: 102} // helper pids of each service's group
	var mu sync.Mutex
	h.sup.pgidOf = func(pid int) (int, bool) { mu.Lock(); defer mu.Unlock(); p, ok := groups[pid]; return p, ok }
	h.sup.StartAll()
	h.expectLog("spawn strict 101", "spawn loose 102")

	h.send(900, "READY=1")  // not the main process of a notify_access=main service
	h.send(901, "READY=1")  // any process of a group service
	h.send(4242, "READY=1") // nobody's
	h.expectState("strict", Starting)
	h.expectState("loose", Running)
	if unknown, notMain := h.sup.NotifyDrops(); unknown != 1 || notMain != 1 {
		t.Fatalf("drops: unknown %d, not main %d; want 1, 1", unknown, notMain)
	}
	h.send(101, "READY=1")
	h.expectState("strict", Running)

	// loose's processes cannot keep strict alive: heartbeats are
	// attributed by the sender's own group, never by what it claims.
	for i := 0; i < 3; i++ {
		h.advance(900 * time.Millisecond)
		h.send(102, "WATCHDOG=1")
		h.send(901, "WATCHDOG=1")
	}
	h.expectLog("signal-main strict 101 aborted")

	// MAINPID naming a process outside the instance is ignored.
	h.send(102, "MAINPID=1")
	h.send(102, "LEASE=task-7\nLEASE=task-8\nRELEASE=task-7")
	if s := h.status("loose"); !slices.Equal(s.Leases, []string{"task-8"}) {
		t.Fatalf("leases = %v", s.Leases)
	}
}

func TestCheckedReadinessAndLivenessProbe(t *testing.T) {
	c := svc("web")
	c.Ready = config.Readiness{Kind: config.ReadyHTTP, URL: "http://x", Period: 100 * time.Millisecond, Timeout: time.Second}
	c.StartTimeout = time.Minute
	c.Liveness = &config.Probe{Kind: config.ReadyTCP, Address: "x:1", Period: 10 * time.Second,
		Timeout: time.Second, FailureThreshold: 3}
	h := newHarness(t, c, svc("api", "web"))
	var mu sync.Mutex
	results := map[config.ReadyKind][]error{
		config.ReadyHTTP: {errors.New("connection refused"), errors.New("status 503"), nil},
		config.ReadyTCP:  {nil, errors.New("refused"), errors.New("refused"), errors.New("refused")},
	}
	checked := make(chan struct{}, 100)
	h.sup.check = func(_ context.Context, kind config.ReadyKind, _, _ string, _ []string, _ time.Duration) error {
		mu.Lock()
		defer mu.Unlock()
		r := results[kind]
		if len(r) == 0 {
			return nil
		}
		results[kind] = r[1:]
		return r[0]
	}
	h.sup.checkPosted = func() { checked <- struct{}{} } // the result is queued: Sync sees it
	waitCheck := func() {
		t.Helper()
		select {
		case <-checked:
			h.sup.Sync()
		case <-time.After(10 * time.Second):
			t.Fatal("no check ran")
		}
	}
	h.sup.StartAll()
	waitCheck()
	if s := h.expectState("web", Starting); s.Reason != "not ready yet: connection refused" {
		t.Fatalf("reason %q", s.Reason)
	}
	h.advance(100 * time.Millisecond)
	waitCheck()
	h.advance(100 * time.Millisecond)
	waitCheck()
	h.expectState("web", Running)
	h.expectState("api", Running)
	h.r.takeLog()
	// Liveness: pass, then three failures in a row.
	h.advance(0)
	waitCheck()
	for i := 0; i < 3; i++ {
		h.advance(10 * time.Second)
		waitCheck()
	}
	h.expectLog("signal-main web 101 aborted")
}
