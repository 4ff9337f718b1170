package proc

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestAdopt: a second reaper (the next daemon) adopts an instance the
// first one started, sees it end through its pidfd, and can kill every
// process of it, background children included.
func TestAdopt(t *testing.T) {
	t.Parallel()
	first := newReaper(t, ReaperOptions{Cgroups: true})
	orig, _ := spawn(t, first, Spec{Service: "adoptee", Path: "/bin/sh",
		Args: []string{"sh", "-c", "sleep 1000 & exec sleep 1000"}})
	a := Adoptee{Service: "adoptee", Identity: orig.Identity, PGID: orig.PGID, Cgroup: orig.Cgroup(), Token: orig.Token()}
	if first.UsesCgroups() != (a.Cgroup != "") {
		t.Fatalf("cgroup %q with cgroups %v", a.Cgroup, first.UsesCgroups())
	}
	waitMembers(t, orig, 2)

	next := newReaper(t, ReaperOptions{})
	ended := make(chan Exit, 1)
	adopted, err := next.Adopt(a, func(e Exit) { ended <- e })
	if err != nil {
		t.Fatal(err)
	}
	if got := len(adopted.Members()); got != 2 {
		t.Fatalf("adopted instance has %d members, want 2", got)
	}
	select {
	case e := <-ended:
		t.Fatalf("exit %+v before the process ended", e)
	default:
	}
	began := time.Now()
	if n := adopted.KillAll(); n != 2 {
		t.Fatalf("KillAll killed %d processes, want 2", n)
	}
	select {
	case e := <-ended:
		if !e.Lost || e.PID != a.PID || e.Status != 0 {
			t.Fatalf("exit %+v, want a lost exit of pid %d", e, a.PID)
		}
		if d := time.Since(began); d > 2*time.Second {
			t.Fatalf("exit seen %v after the kill", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the adopted process's end was not seen within 10s")
	}
	waitMembers(t, orig, 0)
	adopted.Release()
	if a.Cgroup != "" {
		if _, err := os.Stat(a.Cgroup); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the dead daemon's cgroup %s is still there after the adopted instance ended: %v", a.Cgroup, err)
		}
	}
}

// TestAdoptRefusesAReusedPid: an identity whose start time does not match
// is another process now, and a pid that is gone is gone.
func TestAdoptRefusesAReusedPid(t *testing.T) {
	t.Parallel()
	r := newReaper(t, ReaperOptions{})
	p, _ := spawn(t, r, Spec{Service: "x", Path: "/bin/sleep", Args: []string{"sleep", "1000"}})
	reused := Adoptee{Service: "x", Identity: Identity{PID: p.PID, StartTime: p.StartTime + 1}, PGID: p.PGID}
	if _, err := r.Adopt(reused, func(Exit) { t.Error("exit of a process never adopted") }); !errors.Is(err, ErrGone) {
		t.Fatalf("adopting a reused pid: %v", err)
	}
	p.KillAll()
	gone := Adoptee{Service: "x", Identity: p.Identity, PGID: p.PGID}
	deadline := time.Now().Add(10 * time.Second)
	for gone.Identity.Alive() {
		if time.Now().After(deadline) {
			t.Fatal("killed process still alive")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := r.Adopt(gone, func(Exit) { t.Error("exit of a process never adopted") }); !errors.Is(err, ErrGone) {
		t.Fatalf("adopting a dead pid: %v", err)
	}
}

func waitMembers(t *testing.T, p *Process, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(p.Members()) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d members, want %d", len(p.Members()), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestKillLeftovers: what is left of a dead instance (its main process
// gone, a background child still running) is found by cgroup or token and
// killed; a process that only shares the old process group is not.
func TestKillLeftovers(t *testing.T) {
	t.Parallel()
	for _, cgroups := range []bool{true, false} {
		r := newReaper(t, ReaperOptions{Cgroups: cgroups})
		p, exited := spawn(t, r, Spec{Service: "left", Path: "/bin/sh",
			Args: []string{"sh", "-c", "sleep 1000 & echo $! >/dev/null; exit 0"}})
		<-exited
		waitMembers(t, p, 1)
		a := Adoptee{Service: "left", Identity: p.Identity, PGID: p.PGID, Cgroup: p.Cgroup(), Token: p.Token()}
		if n := KillLeftovers(a); n != 1 {
			t.Fatalf("cgroups %v: KillLeftovers found %d processes, want the background sleep", cgroups, n)
		}
		waitMembers(t, p, 0)
		// Nothing of it is left: a second call finds nothing.
		if n := KillLeftovers(Adoptee{Service: "left", PGID: p.PGID, Token: p.Token()}); n != 0 {
			t.Fatalf("cgroups %v: %d leftovers after the kill", cgroups, n)
		}
	}
}

// TestStaleCgroupRootsRemoved: a dead daemon's empty cgroups are removed
// when the next reaper makes its own; a live one's and a populated one's
// are left alone.
func TestStaleCgroupRootsRemoved(t *testing.T) {
	root := newCgroupRoot()
	if root == nil {
		t.Skip("no writable cgroup v2 hierarchy")
	}
	root.remove()
	parent := filepath.Dir(root.dir)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(parent, fmt.Sprintf("vigil.%d.1", dead.Process.Pid))
	mine := filepath.Join(parent, fmt.Sprintf("vigil.%d.999", os.Getpid()))
	for _, d := range []string{filepath.Join(stale, "web"), filepath.Join(mine, "web")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { removeEmptyTree(stale); removeEmptyTree(mine) })
	next := newCgroupRoot()
	if next == nil {
		t.Fatal("no cgroup root the second time")
	}
	t.Cleanup(next.remove)
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale root %s of a dead daemon still there: %v", stale, err)
	}
	if _, err := os.Stat(filepath.Join(mine, "web")); err != nil {
		t.Errorf("a live daemon's cgroup was removed: %v", err)
	}
}

// TestStrays: a process with the project's token that no record names is
// a stray; one the caller knows, one of another project, one of the
// calling daemon's own and one a reaper of the project started here are
// not.
func TestStrays(t *testing.T) {
	t.Parallel()
	project := fmt.Sprintf("strays%d", os.Getpid())
	// os.StartProcess, not os/exec, which would keep only the last of
	// duplicate variables.
	sleeper := func(tokens ...string) *os.Process {
		t.Helper()
		env := append(os.Environ(), "VIGIL_SERVICE=web")
		for _, token := range tokens {
			env = append(env, "VIGIL_INSTANCE="+token)
		}
		p, err := os.StartProcess("/bin/sleep", []string{"sleep", "1000"}, &os.ProcAttr{Env: env})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Kill(); p.Wait() })
		return p
	}
	const deadDaemon = 1 << 30 // above pid_max: no daemon of this pid runs
	stray := sleeper(fmt.Sprintf("%s.%d.1", project, deadDaemon))
	sleeper(fmt.Sprintf("%s.%d.2", project, deadDaemon))      // known
	sleeper(fmt.Sprintf("other%s.%d.1", project, deadDaemon)) // another project
	sleeper(fmt.Sprintf("%s.%d.1", project, os.Getpid()))     // the caller's own
	// Started by a vigil that runs as a service of another: the outer
	// instance's token comes first.
	nested := sleeper(fmt.Sprintf("outer%s.%d.1", project, deadDaemon), fmt.Sprintf("%s.%d.3", project, deadDaemon))
	r := newReaper(t, ReaperOptions{Project: project})
	p, _ := spawn(t, r, Spec{Service: "mine", Path: "/bin/sleep", Args: []string{"sleep", "1000"}})
	if want := fmt.Sprintf("%s.%d.", project, os.Getpid()); !strings.HasPrefix(p.Token(), want) {
		t.Fatalf("token %q, want the prefix %q", p.Token(), want)
	}
	known := fmt.Sprintf("%s.%d.2", project, deadDaemon)
	got := Strays(project, func(token string) bool { return token == known })
	want := []Stray{{PID: stray.Pid, Token: fmt.Sprintf("%s.%d.1", project, deadDaemon), Service: "web"},
		{PID: nested.Pid, Token: fmt.Sprintf("%s.%d.3", project, deadDaemon), Service: "web"}}
	slices.SortFunc(got, func(a, b Stray) int { return cmp.Compare(a.Token, b.Token) })
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Strays = %+v, want %+v", got, want)
	}
	if got := Strays("", func(string) bool { return false }); len(got) != 0 {
		t.Fatalf("Strays of no project = %+v, want none", got)
	}
	// Its leftovers are found by either token.
	for _, token := range []string{fmt.Sprintf("outer%s.%d.1", project, deadDaemon), fmt.Sprintf("%s.%d.3", project, deadDaemon)} {
		if got := withToken(token); !slices.Equal(got, []int{nested.Pid}) {
			t.Errorf("withToken(%s) = %v, want [%d]", token, got, nested.Pid)
		}
	}
}
