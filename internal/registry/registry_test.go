package registry

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func reg(t *testing.T, r *Registry, pid int, at time.Time) Session {
	t.Helper()
	s, err := r.Register(Session{Name: fmt.Sprint("s", pid), PID: pid, StartTime: 100, Groups: []Group{{PGID: pid, LeaderStart: 100}}}, at, 5*time.Second, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRegisterValidates(t *testing.T) {
	t.Parallel()
	var r Registry
	for _, s := range []Session{{PID: 0, StartTime: 1}, {PID: 5, StartTime: 0}, {PID: 5, StartTime: 1, Groups: []Group{{PGID: 1}}}} {
		if _, err := r.Register(s, t0, time.Second, time.Second); !errors.Is(err, ErrInvalid) {
			t.Errorf("Register(%+v) = %v, want ErrInvalid", s, err)
		}
	}
	s := reg(t, &r, 10, t0)
	if s.ID == "" || s.Heartbeat != 5*time.Second || s.StaleAfter != 30*time.Second || !s.LastSeen.Equal(t0) {
		t.Fatalf("registered %+v", s)
	}
	if err := r.Heartbeat("nope", t0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("heartbeat of an unknown session: %v", err)
	}
	if _, err := r.Remove(s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Remove(s.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	var r Registry
	dead := reg(t, &r, 10, t0)
	stale := reg(t, &r, 11, t0)
	fresh := reg(t, &r, 12, t0)
	alive := func(pid int, start uint64) bool { return pid != 10 }
	now := t0.Add(31 * time.Second)
	if err := r.Heartbeat(fresh.ID, now.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	got := r.Sweep(now, alive, false)
	if len(got) != 2 {
		t.Fatalf("decisions %+v", got)
	}
	byID := map[string]Decision{}
	for _, d := range got {
		byID[d.Session.ID] = d
	}
	if d := byID[dead.ID]; d.Verdict != Dead || !d.Kill {
		t.Errorf("dead owner: %+v", d)
	}
	if d := byID[stale.ID]; d.Verdict != Stale || d.Kill {
		t.Errorf("stale session under report: %+v", d)
	}
	if _, ok := r.Get(dead.ID); ok {
		t.Error("a dead session is still registered")
	}
	if s, ok := r.Get(stale.ID); !ok || !s.Stale {
		t.Errorf("a reported stale session: %+v, %v", s, ok)
	}
	// Reported once, not at every sweep; a heartbeat clears it.
	if got := r.Sweep(now.Add(time.Second), alive, false); len(got) != 0 {
		t.Fatalf("stale reported twice: %+v", got)
	}
	r.Heartbeat(stale.ID, now.Add(2*time.Second))
	if s, _ := r.Get(stale.ID); s.Stale {
		t.Error("a heartbeat did not clear stale")
	}
	// stale_action = "kill": removed and killed.
	got = r.Sweep(now.Add(time.Minute), alive, true)
	if len(got) != 2 || !got[0].Kill || !got[1].Kill {
		t.Fatalf("kill-stale sweep %+v", got)
	}
	if n := len(r.List()); n != 0 {
		t.Fatalf("%d sessions left", n)
	}
}

func TestRestoreGivesGrace(t *testing.T) {
	t.Parallel()
	var r, back Registry
	s := reg(t, &r, 10, t0)
	back.Restore(r.List(), t0.Add(time.Hour))
	got, ok := back.Get(s.ID)
	if !ok || !got.LastSeen.Equal(t0.Add(time.Hour)) || got.Name != s.Name {
		t.Fatalf("restored %+v", got)
	}
	if d := back.Sweep(t0.Add(time.Hour+time.Second), func(int, uint64) bool { return true }, false); len(d) != 0 {
		t.Fatalf("a restored session is stale at once: %+v", d)
	}
}

// TestConcurrent: 64 registrants, 100 rounds each, against listers: no
// registration is lost and no listed session is ever half written.
func TestConcurrent(t *testing.T) {
	t.Parallel()
	var r Registry
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var listErr error
	var listMu sync.Mutex
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, s := range r.List() {
				if s.ID == "" || s.Name != fmt.Sprint("s", s.PID) || len(s.Groups) != 1 || s.Groups[0].PGID != s.PID {
					listMu.Lock()
					listErr = fmt.Errorf("torn session %+v", s)
					listMu.Unlock()
				}
			}
		}
	}()
	ids := make([][]string, 64)
	for w := range 64 {
		wg.Go(func() {
			for i := range 100 {
				s := reg(t, &r, 1000+w*100+i, t0)
				ids[w] = append(ids[w], s.ID)
				r.Heartbeat(s.ID, t0.Add(time.Second))
			}
		})
	}
	wg.Wait()
	close(stop)
	if listErr != nil {
		t.Fatal(listErr)
	}
	if n := len(r.List()); n != 6400 {
		t.Fatalf("%d sessions registered, want 6400", n)
	}
	for _, w := range ids {
		for _, id := range w {
			if _, ok := r.Get(id); !ok {
				t.Fatalf("registration %s lost", id)
			}
		}
	}
}

func BenchmarkSweep1000(b *testing.B) {
	var r Registry
	for i := range 1000 {
		r.Register(Session{Name: "s", PID: 1000 + i, StartTime: 1}, t0, time.Second, time.Hour)
	}
	alive := func(int, uint64) bool { return true }
	for b.Loop() {
		r.Sweep(t0.Add(time.Second), alive, false)
	}
}
