package guardian

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func historyPath(t *testing.T) string { return filepath.Join(t.TempDir(), "guardian-crashes.json") }

func checkMode0600(t *testing.T, path string) {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode() != 0o600 {
		t.Errorf("%s has mode %v, want -rw-------", path, st.Mode())
	}
}

func TestCrashingDaemonIsRestartedWithBackoffAndRecorded(t *testing.T) {
	t.Parallel()
	before := time.Now()
	hist := historyPath(t)
	const delay = 50 * time.Millisecond
	g := startGuardian(t, testConfig{Seq: []string{"crash", "crash", "nobye", "clean"},
		Interval: 10 * time.Millisecond, Timeout: 5 * time.Second, Delay: delay, History: hist})
	if code := g.waitExit(t); code != 0 {
		t.Fatalf("guardian exited with %d, want 0", code)
	}
	g.waitLine(t, "run-ok")
	starts := g.waitLines(t, "started", 4)
	if n := g.count("started"); n != 4 {
		t.Fatalf("%d daemon starts, want 4 (3 crashes, then a clean exit)", n)
	}
	// Start to start includes the daemon's run time, so the backoff is a
	// lower bound. The first restart is immediate.
	for i, want := range []time.Duration{0, delay, 2 * delay} {
		gap := time.Duration(atoi(t, starts[i+1][2]) - atoi(t, starts[i][2]))
		if gap < want {
			t.Errorf("restart %d came %v after the previous start, want >= %v", i+1, gap, want)
		}
	}

	h, err := LoadHistory(hist)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Crashes) != 3 {
		t.Fatalf("history has %d crashes, want 3: %+v", len(h.Crashes), h)
	}
	for i, wantCode := range []int{3, 3, 0} {
		c := h.Crashes[i]
		if c.PID != atoi(t, starts[i][1]) || c.Code != wantCode || c.Reason != ReasonExited || c.Signal != "" {
			t.Errorf("crash %d = %+v, want pid %s code %d reason %q", i, c, starts[i][1], wantCode, ReasonExited)
		}
	}
	if n := h.CrashesSince(before); n != 3 {
		t.Errorf("CrashesSince(test start) = %d, want 3", n)
	}
	if n := h.CrashesSince(h.Crashes[2].At.Add(time.Nanosecond)); n != 0 {
		t.Errorf("CrashesSince(after the last crash) = %d, want 0", n)
	}
	checkMode0600(t, hist)
}

func TestUnresponsiveDaemonIsKilledAndRestarted(t *testing.T) {
	t.Parallel()
	hist := historyPath(t)
	const timeout = time.Second
	g := startGuardian(t, testConfig{Seq: []string{"hang", "serve"},
		Interval: 10 * time.Millisecond, Timeout: timeout, Delay: 10 * time.Millisecond, History: hist})
	hung := g.waitLine(t, "hung")
	starts := g.waitLines(t, "started", 2)
	g.waitLine(t, "ready")
	gap := time.Duration(atoi(t, starts[1][2]) - atoi(t, hung[1]))
	// Killed no earlier than about HeartbeatTimeout after the last heartbeat,
	// and restarted within HeartbeatTimeout + a generous bound.
	if gap < timeout/2 || gap > timeout+3*time.Second {
		t.Errorf("hung daemon restarted %v after its last heartbeat, want about %v", gap, timeout)
	}
	waitGone(t, atoi(t, starts[0][1]))

	h, err := LoadHistory(hist)
	if err != nil {
		t.Fatal(err)
	}
	want := Crash{PID: atoi(t, starts[0][1]), Code: -1, Signal: "SIGKILL", Reason: ReasonUnresponsive}
	if len(h.Crashes) != 1 {
		t.Fatalf("history = %+v, want one crash", h)
	}
	if got := h.Crashes[0]; got.PID != want.PID || got.Code != want.Code || got.Signal != want.Signal || got.Reason != want.Reason {
		t.Errorf("crash = %+v, want %+v", got, want)
	}

	g.signal(t, syscall.SIGTERM)
	if code := g.waitExit(t); code != 0 {
		t.Fatalf("guardian exited with %d, want 0", code)
	}
}

// TestDaemonThatDiesWhileStoppingIsNotRestarted: a daemon that said it is
// stopping every service and then hung (or crashed) is killed as usual,
// but not restarted, and what it left running is ended: the stop it began
// (`vigil down`) is finished, not undone.
func TestDaemonThatDiesWhileStoppingIsNotRestarted(t *testing.T) {
	t.Parallel()
	// 3s: the daemon must get as far as "stopping" within the timeout even
	// on a loaded machine.
	g := startGuardian(t, testConfig{Seq: []string{"stop-hang", "serve"},
		Interval: 10 * time.Millisecond, Timeout: 3 * time.Second, Delay: 10 * time.Millisecond, History: historyPath(t)})
	svc := g.waitLine(t, "orphan-svc")
	g.waitLine(t, "stopping")
	if code := g.waitExit(t); code != 1 {
		t.Fatalf("guardian exited with %d, want 1 (the daemon died while stopping)", code)
	}
	g.waitLine(t, "run-error")
	if n := g.count("started"); n != 1 {
		t.Errorf("%d daemon starts, want 1: a daemon that died while stopping was restarted", n)
	}
	waitGone(t, atoi(t, svc[1]))
}

func TestCleanExitEndsRunWithoutRestart(t *testing.T) {
	t.Parallel()
	hist := historyPath(t)
	g := startGuardian(t, testConfig{Seq: []string{"clean", "crash"}, Interval: 10 * time.Millisecond, History: hist})
	if code := g.waitExit(t); code != 0 {
		t.Fatalf("guardian exited with %d, want 0", code)
	}
	g.waitLine(t, "run-ok")
	if n := g.count("started"); n != 1 {
		t.Errorf("%d daemon starts, want 1", n)
	}
	if _, err := os.Stat(hist); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("history file after a clean run: %v, want none", err)
	}
}

// SIGTERM and SIGINT are forwarded and stop the daemon for good; cancelling
// Run's ctx (SIGUSR1 in the helper) becomes SIGTERM. SIGHUP is only forwarded.
func TestStopIsForwardedAndNotRestarted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		send       syscall.Signal
		daemonGets string
	}{
		{"SIGTERM", syscall.SIGTERM, "SIGTERM"},
		{"SIGINT", syscall.SIGINT, "SIGINT"},
		{"ctx", syscall.SIGUSR1, "SIGTERM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			hist := historyPath(t)
			g := startGuardian(t, testConfig{Seq: []string{"serve"}, Interval: 10 * time.Millisecond, History: hist})
			g.waitLine(t, "ready")
			g.signal(t, syscall.SIGHUP)
			g.waitLine(t, "got SIGHUP")
			g.signal(t, tc.send)
			g.waitLine(t, "got "+tc.daemonGets)
			if code := g.waitExit(t); code != 0 {
				t.Fatalf("guardian exited with %d, want 0", code)
			}
			g.waitLine(t, "run-ok")
			if n := g.count("started"); n != 1 {
				t.Errorf("%d daemon starts, want 1", n)
			}
			if h, err := LoadHistory(hist); err != nil || len(h.Crashes) != 0 {
				t.Errorf("history after a stop = %+v, %v; want no crashes", h, err)
			}
		})
	}
}

// Orphans of a dead daemon are reparented to the guardian, reaped (no
// zombie), and their statuses reach the next daemon: one that died while no
// daemon ran (queued) and one that died while the next daemon ran. The same
// holds when the guardian is PID 1 of a pid namespace, as in a container.
func TestOrphansAreReapedAndReportedToTheNextDaemon(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		attr *syscall.SysProcAttr
	}{
		{"subreaper", &syscall.SysProcAttr{Setpgid: true}},
		{"pid1", &syscall.SysProcAttr{Setpgid: true, Cloneflags: syscall.CLONE_NEWPID}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := startGuardianAttr(t, testConfig{Seq: []string{"orphan", "serve"},
				Interval: 10 * time.Millisecond, Delay: 200 * time.Millisecond}, tc.attr)
			// Each orphan line holds the pid as the guardian sees it, then as we do.
			a, b := g.waitLine(t, "orphan-a"), g.waitLine(t, "orphan-b")
			if tc.attr.Cloneflags != 0 && a[1] == a[2] {
				t.Fatalf("orphan pid %s is the same inside and outside: no pid namespace", a[1])
			}
			g.waitLine(t, "ready")
			const exit7 = "1792" // wait status of exit code 7

			g.waitLine(t, "recv exit "+a[1]+" "+exit7)
			waitGone(t, atoi(t, a[2]))

			if ppid := procField(t, atoi(t, b[2]), "PPid"); ppid != strconv.Itoa(g.cmd.Process.Pid) {
				t.Errorf("orphan %s has parent %s, want the guardian %d", b[2], ppid, g.cmd.Process.Pid)
			}
			if err := syscall.Kill(atoi(t, b[2]), syscall.SIGUSR1); err != nil {
				t.Fatal(err)
			}
			g.waitLine(t, "recv exit "+b[1]+" "+exit7)
			waitGone(t, atoi(t, b[2]))

			g.signal(t, syscall.SIGTERM)
			if code := g.waitExit(t); code != 0 {
				t.Fatalf("guardian exited with %d, want 0", code)
			}
		})
	}
}

func TestDamagedHistoryIsReplaced(t *testing.T) {
	t.Parallel()
	hist := historyPath(t)
	if err := os.WriteFile(hist, []byte(`{"crashes":[{"at":`), 0o644); err != nil {
		t.Fatal(err)
	}
	g := startGuardian(t, testConfig{Seq: []string{"crash", "clean"}, Interval: 10 * time.Millisecond,
		Delay: time.Millisecond, History: hist})
	if code := g.waitExit(t); code != 0 {
		t.Fatalf("guardian exited with %d, want 0", code)
	}
	h, err := LoadHistory(hist)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Crashes) != 1 || h.Crashes[0].Code != 3 {
		t.Errorf("history = %+v, want the one new crash", h)
	}
	checkMode0600(t, hist)
	if log, _ := os.ReadFile(g.errLog); !strings.Contains(string(log), "damaged crash history") {
		t.Errorf("the damaged file was not logged; stderr:\n%s", log)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(hist), ".*tmp*")); len(left) != 0 {
		t.Errorf("temp files left behind: %v", left)
	}
}

// A daemon that exits with ExitNoRestart chose to: it could not start and a
// restart would fail the same way. Run returns an error at once, with no
// further start and no crash recorded for it; earlier crashes, including a
// daemon the heartbeat timeout killed, are still restarted as usual.
func TestExitNoRestartIsNotRestarted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		seq     []string
		timeout time.Duration
		crashes []string // reasons of the recorded crashes, one per earlier start
	}{
		{"first", []string{"nostart", "clean"}, 0, nil},
		{"after-crash", []string{"crash", "nostart", "clean"}, 0, []string{ReasonExited}},
		// 3s: each later daemon (a -race test binary) must get going within
		// the timeout even on a loaded machine, or it is killed before it
		// can exit 78.
		{"after-timeout-kill", []string{"hang", "nostart", "clean"}, 3 * time.Second, []string{ReasonUnresponsive}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			hist := historyPath(t)
			g := startGuardian(t, testConfig{Seq: tc.seq, Interval: 10 * time.Millisecond, Timeout: tc.timeout,
				Delay: 10 * time.Millisecond, History: hist})
			if code := g.waitExit(t); code != 1 {
				t.Fatalf("guardian exited with %d, want 1", code)
			}
			if l := strings.Join(g.waitLine(t, "run-error"), " "); !strings.Contains(l, "exit 78") || !strings.Contains(l, "not restarting") {
				t.Errorf("error line %q, want one about exit 78 and not restarting", l)
			}
			// The guardian has exited: every line is in.
			starts := g.waitLines(t, "started", len(tc.crashes)+1)
			if n := g.count("started"); n != len(tc.crashes)+1 {
				t.Fatalf("%d daemon starts, want %d", n, len(tc.crashes)+1)
			}
			h, err := LoadHistory(hist)
			if err != nil {
				t.Fatal(err)
			}
			if len(h.Crashes) != len(tc.crashes) {
				t.Fatalf("history = %+v, want %d crashes (none for the exit 78)", h, len(tc.crashes))
			}
			for i, reason := range tc.crashes {
				if c := h.Crashes[i]; c.PID != atoi(t, starts[i][1]) || c.Reason != reason || c.Code == ExitNoRestart {
					t.Errorf("crash %d = %+v, want pid %s reason %q", i, c, starts[i][1], reason)
				}
			}
		})
	}
}

// ExtraFiles go to every daemon as fds 3, …, with the link right after them.
// With ExtraFilesOnce only the first daemon gets them: the guardian closes its
// copy once that daemon has started, so a readiness pipe's reader sees EOF as
// soon as that daemon is gone while the guardian runs on, and later daemons
// get the null device there (writable, as the pipe was).
func TestExtraFilesOnceGoToTheFirstDaemonOnly(t *testing.T) {
	t.Parallel()
	for _, once := range []bool{true, false} {
		t.Run("once="+strconv.FormatBool(once), func(t *testing.T) {
			t.Parallel()
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			g := startGuardian(t, testConfig{Seq: []string{"ready-then-crash", "null-fd3"}, Interval: 10 * time.Millisecond,
				Delay: 10 * time.Millisecond, Once: once, extraFiles: []*os.File{w}})
			w.Close() // the guardian has its own copy
			lines := g.waitLines(t, "fd3 ", 2)
			starts := g.waitLines(t, "started", 2)
			g.waitLine(t, "ready")
			const rest = "null=false link=4 write=ok"
			if l := lines[0]; !strings.HasPrefix(l[1], "pipe:") || strings.Join(l[2:], " ") != rest {
				t.Errorf("first daemon: %q, want fd 3 a pipe and %q", strings.Join(l, " "), rest)
			}
			want := "fd3 /dev/null null=true link=4 write=ok"
			if !once {
				want = "fd3 " + lines[0][1] + " " + rest // the same pipe again
			}
			if got := strings.Join(lines[1], " "); got != want {
				t.Errorf("second daemon: %q, want %q", got, want)
			}

			wantData := "ok"
			if once {
				// The second daemon still runs (and so does the guardian),
				// yet nothing holds the write end any more.
				if procState(atoi(t, starts[1][1])) == "" {
					t.Fatalf("the second daemon %s is gone", starts[1][1])
				}
			} else {
				// Everyone keeps the write end until the guardian is done.
				wantData = "okx"
				g.signal(t, syscall.SIGTERM)
				if code := g.waitExit(t); code != 0 {
					t.Fatalf("guardian exited with %d, want 0", code)
				}
			}
			r.SetReadDeadline(time.Now().Add(waitLimit))
			if b, err := io.ReadAll(r); err != nil || string(b) != wantData {
				t.Errorf("the pipe's reader got %q, %v; want %q, EOF", b, err, wantData)
			}
			select {
			case <-g.exited:
				if once {
					t.Fatalf("guardian exited with %d before it was told to stop", g.code)
				}
			default:
			}
			if once {
				g.signal(t, syscall.SIGTERM)
				if code := g.waitExit(t); code != 0 {
					t.Fatalf("guardian exited with %d, want 0", code)
				}
			}
		})
	}
}

func TestDaemonThatCannotStartIsAnError(t *testing.T) {
	t.Parallel()
	g := startGuardian(t, testConfig{Seq: []string{"clean"}, Path: "/nonexistent/vigil"})
	if code := g.waitExit(t); code != 1 {
		t.Fatalf("guardian exited with %d, want 1", code)
	}
	if l := g.waitLine(t, "run-error"); !strings.Contains(strings.Join(l, " "), "guardian: start daemon") {
		t.Errorf("error line %q", l)
	}
}

// The guardian's dependency budget: the standard library and x/sys only.
func TestImportsOnlyStdlibAndXSys(t *testing.T) {
	t.Parallel()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/vigil-dev/vigil/internal/guardian" && !strings.HasPrefix(p, "golang.org/x/sys/") {
			t.Errorf("guardian depends on %s; only the standard library and golang.org/x/sys are allowed", p)
		}
	}
}

// procField is a field of /proc/pid/status.
func procField(t *testing.T, pid int, name string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", name, pid)
	return ""
}
