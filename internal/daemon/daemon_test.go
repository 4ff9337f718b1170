package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/api/client"
	"github.com/vigil-dev/vigil/internal/daemon"
)

// TestMain lets the test binary act as a client from another user: with
// DAEMON_TEST_STATUS set it asks that socket for the status and prints the
// error it gets.
func TestMain(m *testing.M) {
	recoveryHelper()
	helperMain()
	if sock := os.Getenv("DAEMON_TEST_STATUS"); sock != "" {
		_, err := (&client.Client{SocketPath: sock}).Status(context.Background())
		fmt.Println(err)
		if errors.Is(err, apitype.ErrPermissionDenied) {
			os.Exit(0)
		}
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// project is a daemon running in this test process on a temp project.
type project struct {
	t      *testing.T
	dir    string
	config string
	c      *client.Client
	stop   func() // stops the daemon and waits for it; idempotent
}

// startProject writes toml as the project's vigil.toml and runs a daemon on
// it until the test ends. The daemon does not become a subreaper here: the
// test binary waits for children of its own.
func startProject(t *testing.T, toml string) *project {
	t.Helper()
	return startProjectIn(t, t.TempDir(), toml, nil)
}

// startProjectIn is startProject in dir (which may hold a previous
// daemon's state), with opt changing the daemon's options.
func startProjectIn(t *testing.T, dir, toml string, opt func(*daemon.Options)) *project {
	t.Helper()
	p := &project{t: t, dir: dir, config: filepath.Join(dir, "vigil.toml")}
	p.write(toml)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan error, 1)
	done := make(chan error, 1)
	opts := daemon.Options{ConfigPath: p.config, NoSubreaper: true, Ready: func(err error) { ready <- err }}
	if opt != nil {
		opt(&opts)
	}
	go func() { done <- daemon.Run(ctx, opts) }()
	if err := <-ready; err != nil {
		cancel()
		t.Fatalf("daemon did not start: %v", err)
	}
	var once sync.Once
	p.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("daemon.Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("daemon did not stop within 30s")
			}
		})
	}
	t.Cleanup(p.stop)
	p.c = &client.Client{SocketPath: filepath.Join(dir, ".vigil", "vigil.sock")}
	return p
}

func (p *project) write(toml string) {
	p.t.Helper()
	if err := os.WriteFile(p.config, []byte(toml), 0o600); err != nil {
		p.t.Fatal(err)
	}
}

func (p *project) status() apitype.Status {
	p.t.Helper()
	st, err := p.c.Status(context.Background())
	if err != nil {
		p.t.Fatal(err)
	}
	return st
}

func (p *project) service(name string) apitype.Service {
	p.t.Helper()
	for _, s := range p.status().Services {
		if s.Name == name {
			return s
		}
	}
	p.t.Fatalf("no service %q", name)
	return apitype.Service{}
}

// waitFor polls status until cond holds for name, failing after timeout.
func (p *project) waitFor(name string, timeout time.Duration, what string, cond func(apitype.Service) bool) apitype.Service {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := p.service(name)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: not %s within %v; last status %+v (last_exit %+v)", name, what, timeout, s, s.LastExit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func running(s apitype.Service) bool { return s.State == "running" && s.PID != 0 }

// waitGone waits until no process of ids is alive.
func waitGone(t *testing.T, timeout time.Duration, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still alive after %v", pid, timeout)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// alive reports whether pid runs and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}

func readPID(t *testing.T, path string, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(path)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written within %v", path, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestExitClassificationWithRealProcesses(t *testing.T) {
	t.Parallel()
	p := startProject(t, `
[services.clean]
command = ["/bin/sh", "-c", "exit 0"]
[services.code3]
command = ["/bin/sh", "-c", "exit 3"]
restart = "never"
[services.segv]
command = "ulimit -c unlimited; kill -SEGV $$"
restart = "never"
[services.killed]
command = ["sleep", "1000"]
restart = "never"
[services.termed]
command = ["sleep", "1000"]
[services.stopped]
command = ["sleep", "1000"]
`)
	s := p.waitFor("clean", 10*time.Second, "exited", func(s apitype.Service) bool { return s.State == "exited" })
	if s.LastExit.Class != "clean" || *s.LastExit.Code != 0 {
		t.Errorf("clean: last_exit %+v", s.LastExit)
	}
	s = p.waitFor("code3", 10*time.Second, "exited", func(s apitype.Service) bool { return s.State == "exited" })
	if s.LastExit.Class != "exit_code" || *s.LastExit.Code != 3 {
		t.Errorf("code3: last_exit %+v", s.LastExit)
	}
	s = p.waitFor("segv", 10*time.Second, "exited", func(s apitype.Service) bool { return s.State == "exited" })
	if s.LastExit.Class != "signal" || s.LastExit.Signal != "SIGSEGV" || !s.LastExit.CoreDumped {
		t.Errorf("segv: last_exit %+v (core_pattern may forbid cores)", s.LastExit)
	}

	k := p.waitFor("killed", 10*time.Second, "running", running)
	if err := syscall.Kill(k.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s = p.waitFor("killed", 10*time.Second, "exited", func(s apitype.Service) bool { return s.State == "exited" })
	if s.LastExit.Class != "signal" || s.LastExit.Signal != "SIGKILL" {
		t.Errorf("killed: last_exit %+v", s.LastExit)
	}

	tm := p.waitFor("termed", 10*time.Second, "running", running)
	if err := syscall.Kill(tm.PID, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s = p.waitFor("termed", 10*time.Second, "exited", func(s apitype.Service) bool { return s.State == "exited" })
	if s.LastExit.Class != "clean" || s.LastExit.Signal != "SIGTERM" || s.Restarts != 0 {
		t.Errorf("termed from outside: %+v last_exit %+v", s, s.LastExit)
	}

	p.waitFor("stopped", 10*time.Second, "running", running)
	if err := p.c.Stop(context.Background(), "stopped"); err != nil {
		t.Fatal(err)
	}
	s = p.service("stopped")
	if s.State != "stopped" || s.LastExit.Class != "stopped" || s.PID != 0 {
		t.Errorf("stopped by vigil: %+v last_exit %+v", s, s.LastExit)
	}
}

func TestCrashLoopTripsBreakerThenResetRestarts(t *testing.T) {
	t.Parallel()
	p := startProject(t, `
[services.bad]
command = ["/bin/sh", "-c", "exit 1"]
[services.bad.backoff]
initial = "0s"
[services.bad.crash_loop]
crashes = 4
window = "1h"
`)
	s := p.waitFor("bad", 10*time.Second, "failed", func(s apitype.Service) bool { return s.State == "failed" })
	if s.Recovery != "manual_action_required" || s.Breaker != "open" || s.CrashesInWindow != 4 || s.Restarts != 3 {
		t.Fatalf("after the loop: %+v", s)
	}
	if err := p.c.Start(context.Background(), "bad"); !errors.Is(err, apitype.ErrFailedPrecondition) {
		t.Fatalf("start of a failed service: %v", err)
	}
	if err := p.c.Reset(context.Background(), "bad"); err != nil {
		t.Fatal(err)
	}
	// Reset restarts it; it loops again and trips again after exactly 4 crashes.
	s = p.waitFor("bad", 10*time.Second, "failed again", func(s apitype.Service) bool {
		return s.State == "failed" && s.CrashesInWindow == 4
	})
	if s.Restarts != 3 {
		t.Fatalf("restarts after reset = %d, want 3", s.Restarts)
	}
}

func TestStopLeavesNoGrandchildEvenAfterSetsid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, cmd string }{
		{"background", `sleep 1000 & echo $! > bg.pid; wait`},
		{"setsid", `setsid sh -c 'echo $$ > bg.pid; exec sleep 1000' & wait`},
		{"double-fork-setsid", `(setsid sh -c 'echo $$ > bg.pid; exec sleep 1000' &); sleep 1000`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startProject(t, fmt.Sprintf("[services.svc]\ncommand = %q\n", tc.cmd))
			s := p.waitFor("svc", 10*time.Second, "running", running)
			grandchild := readPID(t, filepath.Join(p.dir, "bg.pid"), 10*time.Second)
			if !alive(grandchild) {
				t.Fatalf("grandchild %d not running", grandchild)
			}
			t.Cleanup(func() { syscall.Kill(grandchild, syscall.SIGKILL) })
			if err := p.c.Stop(context.Background(), "svc"); err != nil {
				t.Fatal(err)
			}
			waitGone(t, 5*time.Second, s.PID, grandchild)
		})
	}
}

func TestPlannedRestartIsNotCountedAndReloadTouchesOnlyTheChanged(t *testing.T) {
	t.Parallel()
	const base = `
[services.a]
command = ["sleep", "1000"]
[services.b]
command = ["sleep", "1000"]
[services.c]
command = ["sleep", "1000"]
`
	p := startProject(t, base)
	a := p.waitFor("a", 10*time.Second, "running", running)
	b := p.waitFor("b", 10*time.Second, "running", running)
	c := p.waitFor("c", 10*time.Second, "running", running)

	if err := p.c.Restart(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	a2 := p.service("a")
	if a2.PID == a.PID || a2.State != "running" || a2.Restarts != 0 || a2.CrashesInWindow != 0 || a2.LastExit.Class != "stopped" {
		t.Fatalf("after restart: %+v last_exit %+v", a2, a2.LastExit)
	}
	waitGone(t, 5*time.Second, a.PID)

	p.write(strings.Replace(base, "[services.b]\ncommand = [\"sleep\", \"1000\"]", "[services.b]\ncommand = [\"sleep\", \"2000\"]", 1) +
		"[services.d]\ncommand = [\"sleep\", \"1000\"]\n")
	res, err := p.c.Reload(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res.Changed, res.Added, res.Removed) != "[b] [d] []" {
		t.Fatalf("reload: %+v", res)
	}
	b2 := p.waitFor("b", 10*time.Second, "restarted", func(s apitype.Service) bool { return running(s) && s.PID != b.PID })
	if b2.Restarts != 0 {
		t.Errorf("a reload restart counted: %+v", b2)
	}
	p.waitFor("d", 10*time.Second, "running", running)
	if got := p.service("a").PID; got != a2.PID {
		t.Errorf("a was touched by the reload: pid %d → %d", a2.PID, got)
	}
	if got := p.service("c").PID; got != c.PID {
		t.Errorf("c was touched by the reload: pid %d → %d", c.PID, got)
	}

	// A broken config changes nothing.
	p.write("[services.a]\ncomand = []\n")
	if _, err := p.c.Reload(context.Background()); !errors.Is(err, apitype.ErrInvalidArgument) {
		t.Fatalf("reload of a bad config: %v", err)
	}
	if got := p.service("c").PID; got != c.PID {
		t.Errorf("a failed reload touched c")
	}
}

func TestChildInheritsOnlyStdioAndNoSecretsLeak(t *testing.T) {
	t.Parallel()
	p := startProject(t, `
[services.fds]
command = "ls /proc/self/fd > fds.txt; echo done; sleep 1000"
env = { API_TOKEN = "hunter2-secret-value" }
`)
	p.waitFor("fds", 10*time.Second, "running", running)
	deadline := time.Now().Add(10 * time.Second)
	var fds []string
	for {
		b, _ := os.ReadFile(filepath.Join(p.dir, "fds.txt"))
		if fds = strings.Fields(string(b)); len(fds) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("fds.txt not written")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// ls itself opens one descriptor for /proc/self/fd; the shell has 0-2 and
	// the one ls reads with.
	for _, fd := range fds {
		n, _ := strconv.Atoi(fd)
		if n > 3 {
			t.Errorf("child inherited fd %d (fds %v)", n, fds)
		}
	}
	st := p.status()
	b := fmt.Sprintf("%+v", st)
	if strings.Contains(b, "hunter2") {
		t.Fatal("a secret environment value appears in status")
	}
}

func TestSecondDaemonIsRefused(t *testing.T) {
	t.Parallel()
	p := startProject(t, "[services.a]\ncommand = [\"sleep\", \"1000\"]\n")
	err := daemon.Run(context.Background(), daemon.Options{ConfigPath: p.config, NoSubreaper: true})
	if !errors.Is(err, daemon.ErrAlreadyRunning) {
		t.Fatalf("second daemon: %v, want ErrAlreadyRunning", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Errorf("error does not say who holds the lock: %v", err)
	}
}

func TestServiceRunsAsConfiguredUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch users")
	}
	p := startProject(t, `
[services.who]
command = "id -u; id -g; exec sleep 1000"
user = "nobody"
cwd = "/" # the test's temp dir is root's alone
`)
	p.waitFor("who", 10*time.Second, "running", running)
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(p.dir, ".vigil", "logs", "who.log"))
		if f := strings.Fields(string(b)); len(f) == 2 {
			if f[0] != "65534" {
				t.Fatalf("service ran as uid %s, want 65534 (nobody)", f[0])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no id output in the log: %q", b)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestAnotherUserIsRefused(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	p := startProject(t, "[services.a]\ncommand = [\"sleep\", \"1000\"]\n")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary must be readable by nobody: copy it somewhere it is.
	dir, err := os.MkdirTemp("", "vigil-other-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "daemon.test")
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	var out []byte
	for attempt := 1; ; attempt++ {
		cmd := exec.Command(bin)
		cmd.Env = []string{"DAEMON_TEST_STATUS=" + p.c.SocketPath}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err = cmd.CombinedOutput()
		// A process another test forks between WriteFile's open and close
		// holds the copy open for writing until it execs: ETXTBSY, briefly.
		if !errors.Is(err, syscall.ETXTBSY) || attempt == 50 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("another user was not refused with permission denied: %v: %s", err, out)
	}
	if !strings.Contains(string(out), "permission denied on "+p.c.SocketPath+": the daemon belongs to another user") {
		t.Fatalf("message: %s", out)
	}
}

// TestServiceEnvReplacesInherited: a variable the service sets replaces
// the daemon's own, not a duplicate after it, which getenv would not see.
func TestServiceEnvReplacesInherited(t *testing.T) {
	t.Parallel()
	if os.Getenv("HOME") == "" {
		t.Skip("HOME is not set for the daemon to pass on")
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "env.out")
	p := startProject(t, fmt.Sprintf(`
[services.show]
command = "env | grep -c '^HOME=' > %[1]s; printenv HOME >> %[1]s"
restart = "never"
env = { HOME = "/from-config" }
`, out))
	p.waitFor("show", 10*time.Second, "exited", func(s apitype.Service) bool { return s.State == "exited" })
	b, err := os.ReadFile(out)
	if err != nil || string(b) != "1\n/from-config\n" {
		t.Fatalf("the service saw %q (%v), want one HOME, the config's", b, err)
	}
}
