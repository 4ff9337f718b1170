package proc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as the child process: TestMain runs the behaviour
// named by PROC_TEST_HELPER instead of the tests.
func TestMain(m *testing.M) {
	switch os.Getenv("PROC_TEST_HELPER") {
	case "":
		os.Exit(m.Run())
	case "exit3":
		os.Exit(3)
	case "subreaper":
		os.Exit(subreaperHelper())
	}
	os.Exit(99)
}

func newReaper(t *testing.T, opts ReaperOptions) *Reaper {
	t.Helper()
	r, err := NewReaper(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// spawn starts spec and returns the process and a channel with its exit;
// the whole instance is killed when the test ends.
func spawn(t *testing.T, r *Reaper, spec Spec) (*Process, chan Exit) {
	t.Helper()
	ch := make(chan Exit, 1)
	p, err := r.Spawn(spec, func(e Exit) { ch <- e })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.KillAll(); p.Release() })
	return p, ch
}

func self(t *testing.T, helper string, args ...string) Spec {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Spec{Service: "test", Path: exe, Args: append([]string{exe}, args...),
		Env: append(os.Environ(), "PROC_TEST_HELPER="+helper)}
}

func sh(script string) Spec {
	return Spec{Service: "test", Path: "/bin/sh", Args: []string{"sh", "-c", script}, Env: os.Environ()}
}

func waitExit(t *testing.T, ch chan Exit) Exit {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no exit within 10s")
		return Exit{}
	}
}

// waitDead waits until none of ids is alive.
func waitDead(t *testing.T, ids ...Identity) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, id := range ids {
		for id.Alive() {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still alive", id.PID)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}

func TestParseStat(t *testing.T) {
	t.Parallel()
	line := "4242 (we ird) (name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100"
	s, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if s.state != 'S' || s.ppid != 1 || s.pgid != 4242 || s.sid != 4242 || s.startTime != 987654 {
		t.Fatalf("parsed %+v", s)
	}
	for _, bad := range []string{"", "12 (x", "12 (x) S 1 2", "12 (x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19"} {
		if _, err := parseStat([]byte(bad)); !errors.Is(err, ErrMalformedStat) {
			t.Errorf("parseStat(%q) = %v, want ErrMalformedStat", bad, err)
		}
	}
}

func TestIdentityAliveAndReused(t *testing.T) {
	t.Parallel()
	r := newReaper(t, ReaperOptions{})
	p, ch := spawn(t, r, Spec{Service: "t", Path: "sleep", Args: []string{"sleep", "1000"}})
	id, err := ReadIdentity(p.PID)
	if err != nil {
		t.Fatal(err)
	}
	if id != p.Identity || !id.Alive() {
		t.Fatalf("identity %+v vs %+v alive=%v", id, p.Identity, id.Alive())
	}
	if (Identity{PID: id.PID, StartTime: id.StartTime + 1}).Alive() {
		t.Fatal("a pid with another start time (reused) counts as alive")
	}
	if Boot() != "" {
		if !(Identity{PID: id.PID, StartTime: id.StartTime}).Alive() {
			t.Fatal("an identity kept without its boot does not count as this boot's")
		}
		if (Identity{PID: id.PID, StartTime: id.StartTime, Boot: "00000000-0000-4000-8000-000000000000"}).Alive() {
			t.Fatal("the same pid and start time of another boot counts as alive")
		}
	}
	p.Signal(syscall.SIGKILL)
	waitExit(t, ch)
	if id.Alive() {
		t.Fatal("alive after exit")
	}
}

func TestExitStatusesArriveExactlyOnce(t *testing.T) {
	t.Parallel()
	r := newReaper(t, ReaperOptions{})
	_, ch := spawn(t, r, self(t, "exit3"))
	if e := waitExit(t, ch); !e.Status.Exited() || e.Status.ExitStatus() != 3 {
		t.Fatalf("exit3: %v", e.Status)
	}
	p, ch := spawn(t, r, sh("kill -SEGV $$"))
	if e := waitExit(t, ch); !e.Status.Signaled() || e.Status.Signal() != syscall.SIGSEGV || e.PID != p.PID {
		t.Fatalf("segv: %v", e.Status)
	}
	p, ch = spawn(t, r, Spec{Service: "t", Path: "sleep", Args: []string{"sleep", "1000"}})
	syscall.Kill(p.PID, syscall.SIGKILL)
	if e := waitExit(t, ch); e.Status.Signal() != syscall.SIGKILL {
		t.Fatalf("kill: %v", e.Status)
	}
	select {
	case e := <-ch:
		t.Fatalf("second exit delivered: %+v", e)
	default:
	}
}

func TestInstantExitsAreNeverLost(t *testing.T) {
	t.Parallel()
	r := newReaper(t, ReaperOptions{})
	const n = 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int]int{}
	wg.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			p, err := r.Spawn(Spec{Service: "t", Path: "/bin/true", Args: []string{"true"}}, func(e Exit) {
				mu.Lock()
				got[e.PID]++
				mu.Unlock()
				wg.Done()
			})
			if err != nil {
				t.Error(err)
				wg.Done()
				return
			}
			_ = p
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("not every exit arrived")
	}
	for pid, c := range got {
		if c != 1 {
			t.Fatalf("pid %d exit delivered %d times", pid, c)
		}
	}
	if len(got) != n {
		t.Fatalf("%d exits for %d spawns", len(got), n)
	}
}

func TestChildInheritsOnlyDeclaredDescriptors(t *testing.T) {
	t.Parallel()
	// Some descriptors of our own that must not leak.
	f, err := os.CreateTemp(t.TempDir(), "leak")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rp, wp, _ := os.Pipe()
	defer rp.Close()
	defer wp.Close()
	extra, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()

	out, err := os.Create(filepath.Join(t.TempDir(), "fds"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	r := newReaper(t, ReaperOptions{})
	spec := Spec{Service: "t", Path: "/bin/ls", Args: []string{"ls", "/proc/self/fd"}, Stdout: out, ExtraFiles: []*os.File{extra}}
	_, ch := spawn(t, r, spec)
	waitExit(t, ch)
	b, _ := os.ReadFile(out.Name())
	var fds []int
	for _, s := range strings.Fields(string(b)) {
		n, _ := strconv.Atoi(s)
		fds = append(fds, n)
	}
	// 0-2 are stdio, 3 the extra file, 4 the directory ls reads.
	if fmt.Sprint(fds) != "[0 1 2 3 4]" {
		t.Fatalf("child had descriptors %v, want [0 1 2 3 4]", fds)
	}
}

func TestSpawnFailuresAreClassifiable(t *testing.T) {
	t.Parallel()
	r := newReaper(t, ReaperOptions{})
	_, err := r.Spawn(Spec{Service: "t", Path: "/nonexistent/prog", Args: []string{"prog"}}, func(Exit) {})
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "/nonexistent/prog") {
		t.Fatalf("missing program: %v", err)
	}
	_, err = r.Spawn(Spec{Service: "t", Path: "no-such-program-anywhere", Args: []string{"x"}}, func(Exit) {})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing in PATH: %v", err)
	}
	noexec := filepath.Join(t.TempDir(), "script")
	os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644)
	_, err = r.Spawn(Spec{Service: "t", Path: noexec, Args: []string{"script"}}, func(Exit) {})
	if !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("non-executable: %v", err)
	}
}

func TestStopLeavesNoStray(t *testing.T) {
	t.Parallel()
	modes := []struct {
		name    string
		cgroups bool
	}{{"proc-tree", false}, {"cgroup", true}}
	scripts := map[string]string{
		"background": `sleep 1000 & echo $! > "$PIDFILE"; wait`,
		"setsid":     `setsid sh -c 'echo $$ > "$PIDFILE"; exec sleep 1000' & wait`,
	}
	for _, m := range modes {
		for name, script := range scripts {
			t.Run(m.name+"/"+name, func(t *testing.T) {
				t.Parallel()
				r := newReaper(t, ReaperOptions{Cgroups: m.cgroups})
				if m.cgroups && !r.UsesCgroups() {
					t.Skip("no writable cgroup v2 hierarchy here")
				}
				pidfile := filepath.Join(t.TempDir(), "pid")
				spec := sh(script)
				spec.Env = append(spec.Env, "PIDFILE="+pidfile)
				p, ch := spawn(t, r, spec)
				gc := waitPIDFile(t, pidfile)
				t.Cleanup(func() { syscall.Kill(gc.PID, syscall.SIGKILL) })
				if !contains(p.Members(), gc.PID) {
					t.Fatalf("grandchild %d not among members %v", gc.PID, p.Members())
				}
				if err := p.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				waitExit(t, ch)
				p.KillAll()
				waitDead(t, p.Identity, gc)
				if ms := p.Members(); len(ms) != 0 {
					t.Fatalf("members left: %v", ms)
				}
			})
		}
	}
}

func waitPIDFile(t *testing.T, path string) Identity {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			id, err := ReadIdentity(pid)
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written", path)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func contains(ids []Identity, pid int) bool {
	for _, id := range ids {
		if id.PID == pid {
			return true
		}
	}
	return false
}

// TestSubreaperReapsOrphans runs a helper process that becomes a child
// subreaper (a process-wide setting, so not in the test process itself),
// starts a child that double-forks, and reports the orphan it reaped and
// whether any zombie was left.
func TestSubreaperReapsOrphans(t *testing.T) {
	t.Parallel()
	spec := self(t, "subreaper")
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	spec.Stdout, spec.Stderr = out, out
	r := newReaper(t, ReaperOptions{})
	_, ch := spawn(t, r, spec)
	e := waitExit(t, ch)
	b, _ := os.ReadFile(out.Name())
	if e.Status.ExitStatus() != 0 {
		t.Fatalf("helper failed (%v): %s", e.Status, b)
	}
}

func subreaperHelper() int {
	if err := SetChildSubreaper(); err != nil {
		fmt.Println(err)
		return 1
	}
	orphans := make(chan Exit, 100)
	r, _ := NewReaper(ReaperOptions{ReapAll: true, Orphan: func(e Exit) { orphans <- e }})
	defer r.Close()
	for i := 0; i < 100; i++ {
		ch := make(chan Exit, 1)
		// The shell exits at once; its background child becomes our orphan.
		if _, err := r.Spawn(Spec{Service: "t", Path: "/bin/sh", Args: []string{"sh", "-c", "sleep 0.01 & exit 1"}},
			func(e Exit) { ch <- e }); err != nil {
			fmt.Println(err)
			return 1
		}
		<-ch
	}
	for i := 0; i < 100; i++ {
		select {
		case <-orphans:
		case <-time.After(10 * time.Second):
			fmt.Printf("only %d orphans reaped\n", i)
			return 1
		}
	}
	if z := zombiesOf(os.Getpid()); len(z) > 0 {
		fmt.Printf("zombies left: %v\n", z)
		return 1
	}
	return 0
}

func zombiesOf(parent int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := readStat(pid); err == nil && s.ppid == parent && s.state == 'Z' {
			out = append(out, pid)
		}
	}
	return out
}

func TestNoZombieAfterManyCrashCycles(t *testing.T) {
	t.Parallel()
	r := newReaper(t, ReaperOptions{})
	for i := 0; i < 100; i++ {
		_, ch := spawn(t, r, Spec{Service: "t", Path: "/bin/sh", Args: []string{"sh", "-c", "exit 1"}})
		waitExit(t, ch)
	}
	if z := zombiesOf(os.Getpid()); len(z) > 0 {
		// Other parallel tests may have a child between exit and reap; only
		// a zombie that persists is a leak.
		time.Sleep(0)
		for _, pid := range z {
			if s, err := readStat(pid); err == nil && s.state == 'Z' {
				deadline := time.Now().Add(2 * time.Second)
				for time.Now().Before(deadline) {
					if s, err := readStat(pid); err != nil || s.state != 'Z' {
						break
					}
					time.Sleep(2 * time.Millisecond)
				}
				if s, err := readStat(pid); err == nil && s.state == 'Z' {
					t.Fatalf("zombie %d left behind", pid)
				}
			}
		}
	}
}

func BenchmarkSpawnExit(b *testing.B) {
	r, _ := NewReaper(ReaperOptions{})
	defer r.Close()
	ch := make(chan Exit, 1)
	for b.Loop() {
		if _, err := r.Spawn(Spec{Service: "b", Path: "/bin/true", Args: []string{"true"}}, func(e Exit) { ch <- e }); err != nil {
			b.Fatal(err)
		}
		<-ch
	}
}

// TestStoppingManyReadsProcOnce: without cgroups, stopping 20 instances
// (their stop signal, then the check for leftovers after each exit) reads
// /proc a few times in all, not once or more per instance: the readings
// are shared where that is sound. Not parallel, so that no other test
// reads /proc meanwhile.
func TestStoppingManyReadsProcOnce(t *testing.T) {
	r := newReaper(t, ReaperOptions{})
	const n = 20
	var ps []*Process
	var chs []chan Exit
	for range n {
		p, ch := spawn(t, r, Spec{Service: "t", Path: "sleep", Args: []string{"sleep", "1000"}})
		ps, chs = append(ps, p), append(chs, ch)
	}
	before := tableReads.Load()
	for _, p := range ps {
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, ch := range chs { // all ended before the first check, as after a stop signal
		waitExit(t, ch)
	}
	for i, p := range ps {
		if k := p.KillAll(); k != 0 {
			t.Fatalf("instance %d: KillAll found %d leftovers of a plain sleep", i, k)
		}
	}
	if reads := tableReads.Load() - before; reads > 6 {
		t.Fatalf("%d readings of /proc to stop %d instances; want a few, shared", reads, n)
	}
}

// TestKillAllDoesNotTrustAReadingFromBeforeTheInstance: a reading of /proc
// taken before an instance began does not show its main process; that
// must not pass for "the main process had ended", or a stray outside the
// process group would be missed.
func TestKillAllDoesNotTrustAReadingFromBeforeTheInstance(t *testing.T) {
	r := newReaper(t, ReaperOptions{})
	readTable()
	pidfile := filepath.Join(t.TempDir(), "pid")
	spec := sh(`setsid sh -c 'echo $$ > "$PIDFILE"; exec sleep 1000' & wait`)
	spec.Env = append(spec.Env, "PIDFILE="+pidfile)
	p, ch := spawn(t, r, spec)
	stray := waitPIDFile(t, pidfile)
	t.Cleanup(func() { syscall.Kill(stray.PID, syscall.SIGKILL) })
	if n := p.KillAll(); n < 2 {
		t.Fatalf("KillAll found %d processes; want the main one and its setsid'd stray", n)
	}
	waitExit(t, ch)
	waitDead(t, stray)
}
