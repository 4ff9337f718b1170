package session

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/proc"
	"golang.org/x/sys/unix"
)

// The test binary doubles as the processes around a session: TestMain runs
// the behaviour named by SESSION_TEST_HELPER instead of the tests.
//
//	guard       Run(os.Args[1:]); the result goes to $SESSION_TEST_RESULT
//	owner       start a guard (os.Args[1:]), print "guard PID", wait for it
//	owner-exit  start a late-guard, wait until it has started, print its pid, exit
//	late-guard  wait until the parent seen at start-up is gone, then be a guard
//	tty-guard   be a guard, then say whether the terminal is back with us
func TestMain(m *testing.M) {
	switch os.Getenv("SESSION_TEST_HELPER") {
	case "":
		os.Exit(m.Run())
	case "guard":
		os.Exit(guardHelper())
	case "tty-guard":
		code := guardHelper()
		pg, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
		os.WriteFile(os.Getenv("SESSION_TEST_RESULT")+".tty", fmt.Appendf(nil, "foreground=%v", err == nil && pg == unix.Getpgrp()), 0o644)
		os.Exit(code)
	case "owner":
		os.Exit(ownerHelper("guard"))
	case "owner-exit":
		os.Exit(ownerHelper("late-guard"))
	case "late-guard":
		os.NewFile(3, "started").Close() // tells the owner we are past start-up
		deadline := time.Now().Add(10 * time.Second)
		for os.Getppid() == ownerAtInit {
			if time.Now().After(deadline) {
				fmt.Fprintln(os.Stderr, "late-guard: the owner did not exit")
				os.Exit(98)
			}
			time.Sleep(time.Millisecond)
		}
		os.Exit(guardHelper())
	}
	os.Exit(99)
}

// guardHelper runs a session as `vigil run` would and writes how it ended
// to $SESSION_TEST_RESULT.
func guardHelper() int {
	grace, _ := time.ParseDuration(os.Getenv("SESSION_TEST_GRACE"))
	exit, err := Run(context.Background(), Config{Args: os.Args[1:], Grace: grace})
	result := fmt.Sprintf("code=%d owner_gone=%v leftovers=%d killed=%v err=%v\n",
		exit.Code, exit.OwnerGone, exit.Leftovers, exit.Killed, err)
	if p := os.Getenv("SESSION_TEST_RESULT"); p != "" {
		os.WriteFile(p+".tmp", []byte(result), 0o644)
		os.Rename(p+".tmp", p)
	}
	var se *StartError
	switch {
	case errors.As(err, &se):
		return se.Code()
	case err != nil:
		return 1
	}
	return exit.Code
}

func ownerHelper(guard string) int {
	exe, _ := os.Executable()
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Env = append(os.Environ(), "SESSION_TEST_HELPER="+guard)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	var started *os.File
	if guard == "late-guard" {
		r, w, err := os.Pipe()
		if err != nil {
			return 97
		}
		cmd.ExtraFiles, started = []*os.File{w}, r
		defer w.Close()
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "owner:", err)
		return 97
	}
	if started != nil {
		cmd.ExtraFiles[0].Close()
		io.ReadAll(started) // EOF once the guard has closed its end
	}
	fmt.Printf("guard %d\n", cmd.Process.Pid)
	if guard == "late-guard" {
		return 0
	}
	cmd.Wait()
	return 0
}

// env is a test's environment for its helpers: a pid file for CMD to write
// and a result file for the guard.
type env struct {
	t      *testing.T
	dir    string
	pids   string
	result string
	grace  time.Duration
}

func newEnv(t *testing.T) *env {
	dir := t.TempDir()
	e := &env{t: t, dir: dir, pids: filepath.Join(dir, "pids"), result: filepath.Join(dir, "result")}
	// Registered first, so it runs last: whatever else the test's cleanups
	// did (they may have SIGKILLed a guard before it could stop its group),
	// nothing started for the test survives it.
	t.Cleanup(func() { killMarked("PIDFILE=" + e.pids) })
	return e
}

// killMarked SIGKILLs every process whose environment holds marker.
func killMarked(marker string) {
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "environ"))
		if err == nil && strings.Contains("\x00"+string(b), "\x00"+marker+"\x00") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// command returns the test binary as helper, running args.
func (e *env) command(helper string, args ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	// GORACE: no 1s pause at a successful exit under the race detector.
	cmd.Env = append(os.Environ(), "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0",
		"SESSION_TEST_HELPER="+helper, "PIDFILE="+e.pids,
		"SESSION_TEST_RESULT="+e.result, "SESSION_TEST_GRACE="+e.grace.String())
	cmd.Stderr = os.Stderr
	return cmd
}

// startOwner starts an owner of a guard running args and returns the owner
// and the guard's pid. Everything is killed when the test ends.
func (e *env) startOwner(helper string, args ...string) (*exec.Cmd, proc.Identity) {
	t := e.t
	owner := e.command(helper, args...)
	out, err := owner.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Process.Kill(); owner.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("owner said %q: %v", line, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "guard ")))
	if err != nil {
		t.Fatalf("owner said %q", line)
	}
	guard, err := proc.ReadIdentity(pid)
	if err != nil {
		t.Fatal(err)
	}
	killOnCleanup(t, guard)
	return owner, guard
}

// killOnCleanup SIGKILLs the processes when the test ends, if they still
// run (their identity makes sure no reused pid is hit).
func killOnCleanup(t *testing.T, ids ...proc.Identity) {
	t.Cleanup(func() {
		for _, id := range ids {
			if id.Alive() {
				syscall.Kill(id.PID, syscall.SIGKILL)
			}
		}
	})
}

// waitPIDs waits until CMD has written its pid file (numbers separated by
// spaces) and returns the pids.
func (e *env) waitPIDs() []int {
	t := e.t
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(e.pids)
		if err == nil && strings.HasSuffix(string(b), "\n") { // echo writes it all at once
			var pids []int
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					t.Fatalf("pid file: %q", b)
				}
				pids = append(pids, pid)
			}
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatal("CMD wrote no pid file within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// group returns the identities of the live members of group pgid once it
// has at least n, and kills them when the test ends.
func groupOf(t *testing.T, pgid, n int) []proc.Identity {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ids []proc.Identity
		for _, pid := range members(pgid) {
			if id, err := proc.ReadIdentity(pid); err == nil {
				ids = append(ids, id)
			}
		}
		if len(ids) >= n {
			killOnCleanup(t, ids...)
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %d has %d live members, want %d", pgid, len(ids), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitGone waits until none of ids runs (a zombie has ended) and returns
// how long that took.
func waitGone(t *testing.T, within time.Duration, ids ...proc.Identity) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for _, id := range ids {
		for id.Alive() {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still runs after %v", id.PID, within)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return time.Since(start)
}

func (e *env) readResult() string {
	b, err := os.ReadFile(e.result)
	if err != nil {
		e.t.Fatalf("no result from the guard: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// The must-have: `vigil run -- sh -c 'sleep 1000 & sleep 1000'`
// whose owner is SIGKILLed leaves no process behind within a second.
func TestOwnerKilledStopsTheWholeGroup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		script string
		grace  time.Duration
		bound  time.Duration
		killed bool
	}{
		// SIGTERM is enough: all gone well within a second.
		{"term", `echo $$ > "$PIDFILE"; sleep 1000 & sleep 1000`, 0, time.Second, false},
		// Everything ignores SIGTERM: SIGKILL after the grace period.
		{"kill", `trap "" TERM; echo $$ > "$PIDFILE"; sleep 1000 & sleep 1000`, 300 * time.Millisecond, 300*time.Millisecond + time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.grace = tc.grace
			owner, guard := e.startOwner("owner", "sh", "-c", tc.script)
			pgid := e.waitPIDs()[0]
			// sh and the background sleep (the foreground sleep may be sh
			// itself, exec'd: group membership is checked again at the end).
			ids := groupOf(t, pgid, 2)

			died := time.Now()
			if err := owner.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			owner.Wait()
			waitGone(t, 10*time.Second, append(ids, guard)...)
			took := time.Since(died)
			if took > tc.bound {
				t.Errorf("the group took %v to go after the owner died, want at most %v", took, tc.bound)
			}
			if tc.killed && took < tc.grace {
				t.Errorf("the group went after %v, before the grace period of %v", took, tc.grace)
			}
			if m := members(pgid); len(m) > 0 {
				t.Errorf("group %d still has %v", pgid, m)
			}
			want := fmt.Sprintf("code=%d owner_gone=true leftovers=0 killed=%v err=<nil>", 128+int(syscall.SIGTERM), tc.killed)
			if tc.killed {
				want = fmt.Sprintf("code=%d owner_gone=true leftovers=0 killed=true err=<nil>", 128+int(syscall.SIGKILL))
			}
			if got := e.readResult(); got != want {
				t.Errorf("guard: %s, want %s", got, want)
			}
		})
	}
}

// The owner dies between the guard's start-up, where the owner is noted,
// and the opening of its pidfd: the guard sees it is orphaned and never
// starts CMD.
func TestOwnerDeadBeforeWatched(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner, guard := e.startOwner("owner-exit", "sh", "-c", `echo $$ > "$PIDFILE"; sleep 1000`)
	if err := owner.Wait(); err != nil {
		t.Fatalf("owner: %v", err)
	}
	waitGone(t, 10*time.Second, guard)
	if got, want := e.readResult(), "code=0 owner_gone=true leftovers=0 killed=false err="+ErrOwnerGone.Error(); !strings.HasPrefix(got, want) {
		t.Errorf("guard: %s, want %s…", got, want)
	}
	if b, err := os.ReadFile(e.pids); err == nil {
		t.Errorf("CMD was started (pid %s)", b)
	}
}

func TestExitStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		script string
		code   int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"kill -TERM $$", 128 + int(syscall.SIGTERM)},
		{"kill -KILL $$", 128 + int(syscall.SIGKILL)},
	} {
		t.Run(tc.script, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			cmd := e.command("guard", "sh", "-c", "echo out; echo err >&2; echo $VIGIL_SESSION_NAME; "+tc.script)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				t.Fatal(err)
			}
			if got := cmd.ProcessState.ExitCode(); got != tc.code {
				t.Errorf("exit code %d, want %d", got, tc.code)
			}
			if string(out) != "out\nsh\n" || stderr.String() != "err\n" {
				t.Errorf("stdout %q, stderr %q; want %q, %q", out, stderr.String(), "out\nsh\n", "err\n")
			}
		})
	}
}

// When CMD exits, what it left in its group is stopped: SIGTERM, and
// SIGKILL after the grace period for what ignores SIGTERM.
func TestLeftoversStoppedWhenCMDExits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		script string
		killed bool
	}{
		{"term", `sleep 1000 & echo $! > "$PIDFILE"`, false},
		{"kill", `(trap "" TERM; exec sleep 1000) & echo $! > "$PIDFILE"`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.grace = 200 * time.Millisecond
			cmd := e.command("guard", "sh", "-c", tc.script)
			start := time.Now()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			pid := e.waitPIDs()[0]
			if id, err := proc.ReadIdentity(pid); err == nil {
				killOnCleanup(t, id)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("guard: %v", err)
			}
			took := time.Since(start)
			// Run returns only once the group is gone.
			if proc.Running(pid) {
				t.Errorf("the leftover %d still runs after the guard exited", pid)
			}
			want := fmt.Sprintf("code=0 owner_gone=false leftovers=1 killed=%v err=<nil>", tc.killed)
			if got := e.readResult(); got != want {
				t.Errorf("guard: %s, want %s", got, want)
			}
			if tc.killed && took < e.grace {
				t.Errorf("the guard exited after %v, before the grace period of %v", took, e.grace)
			}
		})
	}
}

// Signals sent to the guard reach CMD, and do not end the guard.
func TestSignalsForwarded(t *testing.T) {
	t.Parallel()
	const script = `trap "exit 5" INT; trap "exit 7" TERM; trap "exit 9" HUP; trap "exit 11" USR1
echo ready
while :; do sleep 1; done`
	for sig, code := range map[syscall.Signal]int{syscall.SIGINT: 5, syscall.SIGTERM: 7, syscall.SIGHUP: 9, syscall.SIGUSR1: 11} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			cmd := e.command("guard", "sh", "-c", script)
			cmd.Stderr = nil // the shell reports how its sleep ended
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			if line, err := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
				t.Fatalf("CMD said %q, %v", line, err)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			if got := cmd.ProcessState.ExitCode(); got != code {
				t.Errorf("exit code %d (%v), want %d", got, cmd.ProcessState, code)
			}
		})
	}
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	noexec := filepath.Join(dir, "noexec")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		is   error
	}{
		{[]string{"vigil-no-such-command"}, 127, ErrNotFound},
		{[]string{filepath.Join(dir, "missing")}, 127, syscall.ENOENT},
		{[]string{noexec}, 126, syscall.EACCES},
		{[]string{dir}, 126, syscall.EACCES},
	} {
		_, err := Run(context.Background(), Config{Args: tc.args})
		var se *StartError
		if !errors.As(err, &se) || se.Code() != tc.code || !errors.Is(err, tc.is) {
			t.Errorf("Run(%q): %v, want a StartError (%v) with code %d", tc.args, err, tc.is, tc.code)
		}
	}
	if _, err := Run(context.Background(), Config{}); err != ErrNoCommand {
		t.Errorf("Run with no command: %v, want %v", err, ErrNoCommand)
	}
}

// fakeRegistrar records what a guard tells it.
type fakeRegistrar struct {
	fail       bool
	registered chan Info
	beats      chan string
	ended      chan Exit
}

func newFake(fail bool) *fakeRegistrar {
	return &fakeRegistrar{fail: fail, registered: make(chan Info, 1), beats: make(chan string, 100), ended: make(chan Exit, 1)}
}

func (f *fakeRegistrar) Register(ctx context.Context, info Info) (string, error) {
	f.registered <- info
	if f.fail {
		return "", errors.New("registry: unavailable")
	}
	return "s1", nil
}

func (f *fakeRegistrar) Heartbeat(ctx context.Context, id string) error {
	select {
	case f.beats <- id:
	default:
	}
	return nil
}

func (f *fakeRegistrar) End(ctx context.Context, id string, exit Exit) error {
	f.ended <- exit
	return nil
}

// runInProcess runs a session in the test process with a pipe as CMD's
// stdin, and returns the write end and a channel with the outcome.
func runInProcess(t *testing.T, ctx context.Context, cfg Config) (*os.File, chan error, *Exit) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { devnull.Close() })
	cfg.Stdin, cfg.Stdout, cfg.Stderr = r, devnull, devnull
	done := make(chan error, 1)
	finished := make(chan struct{})
	var exit Exit
	go func() {
		defer close(finished)
		var err error
		exit, err = Run(ctx, cfg)
		done <- err
	}()
	t.Cleanup(func() {
		w.Close()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	})
	return w, done, &exit
}

func wait[T any](t *testing.T, ch chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
		var zero T
		return zero
	}
}

func TestRegistrar(t *testing.T) {
	t.Parallel()
	reg := newFake(false)
	stdin, done, exit := runInProcess(t, context.Background(), Config{
		Args: []string{"sh", "-c", "read x; exit 3"}, Name: "agent-7",
		Heartbeat: 5 * time.Millisecond, Registrar: reg,
	})
	info := wait(t, reg.registered, "Register")
	if info.Name != "agent-7" || info.CMD.PID == 0 || info.CMD.StartTime == 0 || info.PGID != info.CMD.PID ||
		info.Guard.PID != os.Getpid() || info.OwnerPID != os.Getppid() || info.Heartbeat != 5*time.Millisecond {
		t.Errorf("Register got %+v", info)
	}
	for range 2 {
		if id := wait(t, reg.beats, "heartbeat"); id != "s1" {
			t.Errorf("heartbeat for %q, want s1", id)
		}
	}
	stdin.Close() // CMD reads EOF and exits 3
	if err := wait(t, done, "end of Run"); err != nil {
		t.Fatal(err)
	}
	end := wait(t, reg.ended, "End")
	if end.Code != 3 || exit.Code != 3 || end.At.IsZero() {
		t.Errorf("End got %+v, Run returned %+v; want code 3", end, *exit)
	}
}

// A registrar that fails changes nothing for the session.
func TestFailingRegistrar(t *testing.T) {
	t.Parallel()
	reg := newFake(true)
	stdin, done, exit := runInProcess(t, context.Background(), Config{
		Args: []string{"sh", "-c", "read x; exit 4"}, Heartbeat: time.Millisecond, Registrar: reg,
	})
	wait(t, reg.registered, "Register")
	stdin.Close()
	if err := wait(t, done, "end of Run"); err != nil || exit.Code != 4 {
		t.Fatalf("Run: %+v, %v; want code 4", *exit, err)
	}
	if len(reg.beats) != 0 || len(reg.ended) != 0 {
		t.Errorf("after a failed Register: %d heartbeats, %d ends", len(reg.beats), len(reg.ended))
	}
}

// Cancelling Run's context ends the session as the owner's death does.
func TestContextCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := newFake(false)
	_, done, exit := runInProcess(t, ctx, Config{
		Args: []string{"sh", "-c", "sleep 1000 & sleep 1000"}, Registrar: reg,
	})
	info := wait(t, reg.registered, "Register")
	ids := groupOf(t, info.PGID, 2)
	cancel()
	if err := wait(t, done, "end of Run"); err != nil {
		t.Fatal(err)
	}
	if !exit.OwnerGone || exit.Code != 128+int(syscall.SIGTERM) {
		t.Errorf("Run returned %+v", *exit)
	}
	waitGone(t, time.Second, ids...)
}

func TestSessionEnv(t *testing.T) {
	t.Parallel()
	got := sessionEnv([]string{"A=1", NameEnv + "=old", "B=2"}, "new")
	if strings.Join(got, " ") != "A=1 B=2 "+NameEnv+"=new" {
		t.Errorf("sessionEnv: %q", got)
	}
}

// openPTY returns a new pseudo-terminal's two ends.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	rc, err := m.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	rc.Control(func(fd uintptr) {
		if err = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); err == nil {
			n, err = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

// screen collects what is written to a terminal.
type screen struct {
	mu      sync.Mutex
	text    strings.Builder
	changed chan struct{}
}

func newScreen(master *os.File) *screen {
	sc := &screen{changed: make(chan struct{}, 1)}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			sc.mu.Lock()
			sc.text.Write(buf[:n])
			sc.mu.Unlock()
			select {
			case sc.changed <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	return sc
}

// waitFor waits until the screen shows s.
func (sc *screen) waitFor(t *testing.T, s string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		sc.mu.Lock()
		text := sc.text.String()
		sc.mu.Unlock()
		if strings.Contains(text, s) {
			return
		}
		select {
		case <-sc.changed:
		case <-deadline:
			t.Fatalf("the terminal never showed %q; it shows %q", s, text)
		}
	}
}

// waitComm waits until pid runs the program named comm.
func waitComm(t *testing.T, pid int, comm string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.TrimSpace(string(b)) == comm {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d runs %q, not %s, after 10s (%v)", pid, b, comm, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// On a terminal, CMD is in the foreground: it can read the terminal, the
// terminal's Ctrl-C reaches it, Ctrl-Z stops and (the guard's process group
// being orphaned, so it cannot stop itself) the guard continues it; and the
// guard has the terminal back once CMD ends.
func TestInteractive(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, script string
		keys         []string // sent once the terminal shows "ready"
		show         string
		code         int
	}{
		{"read", `echo ready; read x; echo "got $x"; exit 4`, []string{"hello\n"}, "got hello", 4},
		// The keys go once sleep runs: a shell interrupted while it starts a
		// command waits for that command before it acts on the interrupt.
		{"ctrl-c", `echo $$ > "$PIDFILE"; echo ready; exec sleep 1000`, []string{"\x03"}, "", 128 + int(syscall.SIGINT)},
		{"ctrl-z", `echo ready; read x; echo "got $x"; exit 4`, []string{"\x1a", "again\n"}, "got again", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			master, slave := openPTY(t)
			sc := newScreen(master)
			e := newEnv(t)
			cmd := e.command("tty-guard", "sh", "-c", tc.script)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			slave.Close()
			sc.waitFor(t, "ready")
			if strings.Contains(tc.script, "exec sleep") {
				waitComm(t, e.waitPIDs()[0], "sleep")
			}
			for _, k := range tc.keys {
				if _, err := master.WriteString(k); err != nil {
					t.Fatal(err)
				}
			}
			sc.waitFor(t, tc.show)
			cmd.Wait()
			if got := cmd.ProcessState.ExitCode(); got != tc.code {
				t.Errorf("exit code %d (%v), want %d", got, cmd.ProcessState, tc.code)
			}
			if b, _ := os.ReadFile(e.result + ".tty"); string(b) != "foreground=true" {
				t.Errorf("after the session: %q, want the guard in the foreground again", b)
			}
		})
	}
}
