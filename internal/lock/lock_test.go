package lock_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/lock"
	"github.com/vigil-dev/vigil/internal/proc"
)

// The test binary doubles as the helper processes (as os/exec's tests do):
// with VIGIL_LOCK_HELPER set it runs that behaviour instead of the tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("VIGIL_LOCK_HELPER"); mode != "" {
		os.Exit(runHelper(mode, os.Getenv("LOCK_DIR"), os.Getenv("LOCK_NAME")))
	}
	os.Exit(m.Run())
}

// runHelper runs one helper behaviour. Helpers that wait, wait for their
// stdin to close, so none outlives a test that dies.
func runHelper(mode, dir, name string) int {
	switch mode {
	case "hold":
		// Take the lock, say so, hold it until stdin closes or a signal.
		l, err := lock.Acquire(context.Background(), dir, name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("acquired %d\n", os.Getpid())
		io.Copy(io.Discard, os.Stdin)
		l.Release()
		return 0
	case "handoff":
		// Take the lock, give its descriptor to a child that waits on
		// stdin, print the child's pid and exit: the child holds the lock.
		l, err := lock.Acquire(context.Background(), dir, name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), "VIGIL_LOCK_HELPER=wait")
		c.Stdin = os.Stdin // not stdout or stderr: the test waits for their EOF
		c.ExtraFiles = []*os.File{l.File()}
		if err := c.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("child %d\n", c.Process.Pid)
		return 0
	case "wait":
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "increment":
		// ROUNDS times: take the lock, then read, pause and write the
		// counter (non-atomic on purpose), with an O_EXCL marker that
		// catches two holders at once.
		rounds, _ := strconv.Atoi(os.Getenv("ROUNDS"))
		counter := filepath.Join(os.Getenv("WORK"), "counter")
		inside := filepath.Join(os.Getenv("WORK"), "inside")
		for range rounds {
			l, err := lock.Acquire(context.Background(), dir, name)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			m, err := os.OpenFile(inside, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				fmt.Fprintln(os.Stderr, "two holders at once:", err)
				return 2
			}
			m.Close()
			b, _ := os.ReadFile(counter)
			n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			time.Sleep(200 * time.Microsecond) // widen the window a lost update needs
			if err := os.WriteFile(counter, []byte(strconv.Itoa(n+1)), 0o600); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			if err := os.Remove(inside); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			l.Release()
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown helper", mode)
	return 1
}

// helper is a helper process; it is killed and reaped when the test ends.
type helper struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	lines    chan string
	stderr   *strings.Builder
	waitOnce sync.Once
	waitErr  error
}

func startHelper(t *testing.T, mode, dir, name string, env ...string) *helper {
	t.Helper()
	c := exec.Command(os.Args[0])
	c.Env = append(os.Environ(), append([]string{"VIGIL_LOCK_HELPER=" + mode, "LOCK_DIR=" + dir, "LOCK_NAME=" + name}, env...)...)
	stdin, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: c, stdin: stdin, lines: make(chan string, 16), stderr: new(strings.Builder)}
	c.Stderr = h.stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	t.Cleanup(func() {
		stdin.Close()
		c.Process.Kill()
		h.wait()
	})
	return h
}

func (h *helper) wait() error {
	h.waitOnce.Do(func() { h.waitErr = h.cmd.Wait() })
	return h.waitErr
}

// line returns the helper's next line of output.
func (h *helper) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-h.lines:
		if !ok {
			t.Fatalf("helper %d ended without a line: %v; stderr: %s", h.cmd.Process.Pid, h.wait(), h.stderr)
		}
		return l
	case <-time.After(10 * time.Second):
		t.Fatalf("helper %d said nothing within 10s", h.cmd.Process.Pid)
	}
	return ""
}

// startHolder starts a helper that holds dir/name and waits until it does.
func startHolder(t *testing.T, dir, name string) *helper {
	t.Helper()
	h := startHelper(t, "hold", dir, name)
	if l := h.line(t); l != fmt.Sprintf("acquired %d", h.cmd.Process.Pid) {
		t.Fatalf("holder said %q", l)
	}
	return h
}

// waitFor polls cond until it holds, failing after 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waiters counts the processes blocked in flock on path (the "->" lines
// of /proc/locks).
func waiters(t *testing.T, path string) int {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	ino := strconv.FormatUint(fi.Sys().(*syscall.Stat_t).Ino, 10)
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) > 6 && f[1] == "->" && f[2] == "FLOCK" && strings.HasSuffix(f[6], ":"+ino) {
			n++
		}
	}
	return n
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// A holder killed with SIGKILL mid-work frees the lock at once: a waiter
// has it well within 100 ms of the holder's death, and a try right after
// the death succeeds.
func TestKilledHolderFreesAtOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path, _ := lock.Path(dir, "job")
	h := startHolder(t, dir, "job")

	got := make(chan time.Time, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := lock.Acquire(ctxTimeout(t, 30*time.Second), dir, "job")
		if err != nil {
			errc <- err
			return
		}
		got <- time.Now()
		l.Release()
	}()
	waitFor(t, "the waiter blocks in flock", func() bool { return waiters(t, path) == 1 })

	h.cmd.Process.Kill()
	h.wait()
	dead := time.Now()
	select {
	case at := <-got:
		if d := at.Sub(dead); d > 100*time.Millisecond {
			t.Fatalf("acquired %v after the holder died, want < 100ms", d)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never got the lock")
	}

	// No waiter: the next try right after the death succeeds.
	h = startHolder(t, dir, "job")
	h.cmd.Process.Kill()
	h.wait()
	l, err := lock.TryAcquire(dir, "job")
	if err != nil {
		t.Fatalf("right after the holder's death: %v", err)
	}
	l.Release()
}

// 16 processes that each increment a counter non-atomically under the
// lock end with exactly their total, and never two hold it at once.
func TestMutualExclusion(t *testing.T) {
	t.Parallel()
	dir, work := t.TempDir(), t.TempDir()
	const procs, rounds = 16, 10
	var hs []*helper
	for range procs {
		hs = append(hs, startHelper(t, "increment", dir, "counter", "WORK="+work, "ROUNDS="+strconv.Itoa(rounds)))
	}
	for _, h := range hs {
		if err := h.wait(); err != nil {
			t.Fatalf("helper %d: %v; stderr: %s", h.cmd.Process.Pid, err, h.stderr)
		}
	}
	b, err := os.ReadFile(filepath.Join(work, "counter"))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b); got != strconv.Itoa(procs*rounds) {
		t.Fatalf("counter = %s, want %d", got, procs*rounds)
	}
}

var heldMsg = regexp.MustCompile(`^lock "job" is held by pid (\d+) \(since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d, \d+s ago\)$`)

// A try on a held lock fails at once, naming the holder from the kernel;
// a timed wait fails after its timeout with the same.
func TestHeld(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := startHolder(t, dir, "job")
	pid := h.cmd.Process.Pid
	id, err := proc.ReadIdentity(pid)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	_, err = lock.TryAcquire(dir, "job")
	if d := time.Since(start); d > time.Second {
		t.Errorf("a try took %v", d)
	}
	var he *lock.HeldError
	if !errors.As(err, &he) || !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("TryAcquire on a held lock: %v, want a HeldError", err)
	}
	m := heldMsg.FindStringSubmatch(err.Error())
	if m == nil || m[1] != strconv.Itoa(pid) {
		t.Errorf("message %q, want it to match %s with pid %d", err, heldMsg, pid)
	}
	if he.Holder.PID != pid || he.Holder.Exited || he.Holder.StartTime != id.StartTime {
		t.Errorf("holder %+v, want pid %d start time %d", he.Holder, pid, id.StartTime)
	}
	if since := time.Since(he.Holder.Since); since < 0 || since > time.Minute {
		t.Errorf("held since %v, %v ago", he.Holder.Since, since)
	}

	start = time.Now()
	_, err = lock.Acquire(ctxTimeout(t, 50*time.Millisecond), dir, "job")
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("a 50ms wait gave up after %v", d)
	}
	if !errors.Is(err, lock.ErrHeld) || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &he) || he.Holder.PID != pid {
		t.Fatalf("timed out wait: %v (%+v)", err, he)
	}

	// The abandoned wait gives the lock back once it gets it.
	h.stdin.Close()
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	l, err := lock.Acquire(ctxTimeout(t, 10*time.Second), dir, "job")
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}

// A lock handed to a child stays held after the process that took it
// exits, says so, and is free once the child dies.
func TestInherited(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := startHelper(t, "handoff", dir, "job")
	var child int
	if _, err := fmt.Sscanf(h.line(t), "child %d", &child); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}

	_, err := lock.TryAcquire(dir, "job")
	var he *lock.HeldError
	if !errors.As(err, &he) || he.Holder.PID != h.cmd.Process.Pid || !he.Holder.Exited {
		t.Fatalf("TryAcquire: %v (%+v), want held, inherited from pid %d", err, he, h.cmd.Process.Pid)
	}
	want := fmt.Sprintf(`lock "job" is held by a process that inherited it from pid %d, which has exited`, h.cmd.Process.Pid)
	if err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
	ls, err := lock.List(dir, time.Now())
	if err != nil || len(ls) != 1 || ls[0].State != "held" || !ls[0].Exited {
		t.Errorf("List: %+v, %v", ls, err)
	}

	h.stdin.Close() // the child's stdin too: it exits
	l, err := lock.Acquire(ctxTimeout(t, 10*time.Second), dir, "job")
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}

// Close leaves the lock to a child that inherited the descriptor;
// Release frees it at once, child or not.
func TestCloseAndRelease(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, release := range []bool{false, true} {
		l, err := lock.TryAcquire(dir, "job")
		if err != nil {
			t.Fatal(err)
		}
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), "VIGIL_LOCK_HELPER=wait")
		stdin, err := c.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		c.ExtraFiles = []*os.File{l.File()}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); c.Process.Kill(); c.Wait() })
		if release {
			if err := l.Release(); err != nil {
				t.Fatal(err)
			}
			m, err := lock.TryAcquire(dir, "job")
			if err != nil {
				t.Fatalf("after Release, with the child alive: %v", err)
			}
			m.Release()
			continue
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		var he *lock.HeldError
		if _, err := lock.TryAcquire(dir, "job"); !errors.As(err, &he) || he.Holder.PID != os.Getpid() {
			t.Fatalf("after Close, with the child alive: %v, want held (taken by pid %d)", err, os.Getpid())
		}
		stdin.Close()
		c.Wait()
		m, err := lock.TryAcquire(dir, "job")
		if err != nil {
			t.Fatalf("after the child exited: %v", err)
		}
		m.Release()
	}
}

// List shows each lock held or free, with the holder's pid, start time,
// since when it holds it and the path, without disturbing any lock.
func TestList(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if ls, err := lock.List(filepath.Join(dir, "none"), time.Now()); err != nil || len(ls) != 0 {
		t.Fatalf("List of a missing dir: %v, %v", ls, err)
	}
	l, err := lock.TryAcquire(dir, "free")
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	before := time.Now()
	h := startHolder(t, dir, "held")
	after := time.Now()
	os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o600)
	os.Symlink("free.lock", filepath.Join(dir, "sym.lock"))

	now := after.Add(time.Second)
	ls, err := lock.List(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 2 {
		t.Fatalf("List: %+v, want free and held", ls)
	}
	free, held := ls[0], ls[1]
	if free != (lock.Status{Name: "free", State: "free", Path: filepath.Join(dir, "free.lock")}) {
		t.Errorf("free: %+v", free)
	}
	id, _ := proc.ReadIdentity(h.cmd.Process.Pid)
	if held.Name != "held" || held.State != "held" || held.PID != id.PID || held.StartTime != id.StartTime ||
		held.Exited || held.Path != filepath.Join(dir, "held.lock") {
		t.Errorf("held: %+v, want pid %d start time %d", held, id.PID, id.StartTime)
	}
	if held.Since.Before(before.Add(-time.Millisecond)) || held.Since.After(after) ||
		held.AgeMS != now.Sub(held.Since).Milliseconds() {
		t.Errorf("held since %v (age %dms), want between %v and %v", held.Since, held.AgeMS, before, after)
	}
	if held.StartedAt.IsZero() || held.StartedAt.After(held.Since.Add(2*time.Second)) {
		t.Errorf("holder started at %v, after it took the lock at %v", held.StartedAt, held.Since)
	}
	b, _ := json.Marshal(ls)
	for _, key := range []string{`"name":"held"`, `"state":"held"`, `"pid":`, `"start_time":`, `"since":`, `"age_ms":`, `"path":`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("JSON %s lacks %s", b, key)
		}
	}
	if strings.Contains(string(b), `{"name":"free","state":"free","pid"`) {
		t.Errorf("a free lock has a pid in %s", b)
	}
	// Listing took nothing: the holder's lock is still its own.
	if _, err := lock.TryAcquire(dir, "held"); !errors.Is(err, lock.ErrHeld) {
		t.Errorf("after List: %v", err)
	}
}

// Sweep removes the lock files no one holds, keeps held ones, leaves
// anything that is not a lock file alone.
func TestSweep(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if rm, err := lock.Sweep(filepath.Join(dir, "none")); err != nil || rm != nil {
		t.Fatalf("Sweep of a missing dir: %v, %v", rm, err)
	}
	for _, n := range []string{"a", "b"} {
		l, err := lock.TryAcquire(dir, n)
		if err != nil {
			t.Fatal(err)
		}
		l.Release()
	}
	startHolder(t, dir, "c")
	mine, err := lock.TryAcquire(dir, "d") // held by this process
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Release()
	os.WriteFile(filepath.Join(dir, "target"), []byte("keep"), 0o600)
	os.Symlink("target", filepath.Join(dir, "s.lock"))

	rm, err := lock.Sweep(dir)
	if !errors.Is(err, lock.ErrRefused) || strings.Contains(err.Error(), "\n") {
		t.Errorf("Sweep error %q, want one line about the symlink", err)
	}
	if !slices.Equal(rm, []string{"a", "b"}) {
		t.Errorf("Sweep removed %v, want [a b]", rm)
	}
	var left []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if want := []string{"c.lock", "d.lock", "s.lock", "target"}; !slices.Equal(left, want) {
		t.Errorf("left %v, want %v", left, want)
	}
}

// Processes taking the lock over and over while Sweep unlinks its file
// in between still never hold it two at once (the inode check).
func TestSweepRace(t *testing.T) {
	t.Parallel()
	dir, work := t.TempDir(), t.TempDir()
	const procs, rounds = 8, 25
	var hs []*helper
	for range procs {
		hs = append(hs, startHelper(t, "increment", dir, "counter", "WORK="+work, "ROUNDS="+strconv.Itoa(rounds)))
	}
	done := make(chan struct{})
	swept := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-done:
				swept <- n
				return
			default:
			}
			rm, _ := lock.Sweep(dir)
			n += len(rm)
		}
	}()
	for _, h := range hs {
		if err := h.wait(); err != nil {
			t.Fatalf("helper %d: %v; stderr: %s", h.cmd.Process.Pid, err, h.stderr)
		}
	}
	close(done)
	t.Logf("%d lock files swept during the run", <-swept)
	b, err := os.ReadFile(filepath.Join(work, "counter"))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b); got != strconv.Itoa(procs*rounds) {
		t.Fatalf("counter = %s, want %d", got, procs*rounds)
	}
}

// Bad names are refused with one line saying the rule; good ones work.
func TestNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, n := range []string{"", ".hidden", "..", "../x", "a/b", "-x", "a b", "ü", strings.Repeat("a", 65), "a\nb"} {
		_, err := lock.TryAcquire(dir, n)
		if !errors.Is(err, lock.ErrBadName) {
			t.Errorf("%q: %v, want ErrBadName", n, err)
			continue
		}
		if strings.Count(err.Error(), "\n") != 0 || !strings.Contains(err.Error(), "names are 1 to 64") {
			t.Errorf("%q: message %q", n, err)
		}
	}
	for _, n := range []string{"a", "A-b_c.d", "0.lock", strings.Repeat("z", 64)} {
		l, err := lock.TryAcquire(dir, n)
		if err != nil {
			t.Errorf("%q: %v", n, err)
			continue
		}
		l.Release()
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 4 {
		t.Errorf("%d files for 4 good names", len(ents))
	}
}

// A lock file that is a symlink (or not a regular file), and a lock
// directory that is a symlink, are refused and never followed; files and
// directories are created private.
func TestRefused(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	dir := filepath.Join(base, "state", "locks")
	l, err := lock.TryAcquire(dir, "ok")
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	for path, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, l.Path(): 0o600} {
		if fi, err := os.Lstat(path); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, fi.Mode(), err, want)
		}
	}

	target := filepath.Join(base, "target")
	os.WriteFile(target, []byte("precious"), 0o644)
	os.Symlink(target, filepath.Join(dir, "sym.lock"))
	syscall.Mkfifo(filepath.Join(dir, "fifo.lock"), 0o600)
	os.Mkdir(filepath.Join(dir, "dir.lock"), 0o700)
	for n, want := range map[string]string{"sym": "is a symlink", "fifo": "is a special file", "dir": "is a directory"} {
		_, err := lock.TryAcquire(dir, n)
		if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line saying it %s", n, err, want)
		}
	}
	if b, _ := os.ReadFile(target); string(b) != "precious" {
		t.Errorf("the symlink's target was written: %q", b)
	}

	os.Mkdir(filepath.Join(base, "linkdir"), 0o700)
	os.Symlink(filepath.Join(base, "linkdir"), filepath.Join(base, "dirlink"))
	_, err = lock.TryAcquire(filepath.Join(base, "dirlink"), "x")
	if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "lock directory") {
		t.Errorf("a symlinked lock directory: %v", err)
	}
}
