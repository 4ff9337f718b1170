package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/api"
	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/registry"
)

func TestStatusTable(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	code := func(c int) *int { return &c }
	st := apitype.Status{
		Daemon: apitype.Daemon{PID: 4242, Version: "1.2.3", StartedAt: now.Add(-26 * time.Hour), SafeMode: true},
		Services: []apitype.Service{
			{Name: "web", State: "running", PID: 101, StartedAt: at(-192 * time.Second), Restarts: 2, Breaker: "closed",
				LastExit: &apitype.Exit{Class: "exit_code", Code: code(3)}},
			{Name: "db", State: "failed", Restarts: 5, Breaker: "open",
				LastExit: &apitype.Exit{Class: "signal", Signal: "SIGSEGV", CoreDumped: true}},
			{Name: "worker", State: "backoff", Restarts: 1, Breaker: "closed", NextRestartAt: at(1500 * time.Millisecond),
				LastExit: &apitype.Exit{Class: "signal", Signal: "SIGKILL"}},
			{Name: "cron", State: "stopped", Breaker: "closed", LastExit: &apitype.Exit{Class: "clean", Signal: "SIGTERM"}},
			{Name: "new", State: "starting", PID: 7, StartedAt: at(-300 * time.Millisecond), Breaker: "closed", Reason: "waiting for READY=1"},
		},
	}
	var b bytes.Buffer
	printStatus(&b, st, now)
	want := `vigil 1.2.3, daemon pid 4242, up 1d2h
SAFE MODE: only essential services run (vigil safe-mode exit)
NAME    STATE     PID  UPTIME  RESTARTS  LAST EXIT                     BREAKER  NOTE
web     running   101  3m12s   2         exit_code 3                   closed
db      failed    -    -       5         signal SIGSEGV (core dumped)  open     manual action required: vigil reset db
worker  backoff   -    -       1         signal SIGKILL                closed   restart in 1s
cron    stopped   -    -       0         clean (SIGTERM)               closed
new     starting  7    300ms   0         -                             closed   waiting for READY=1
`
	if got := b.String(); got != want {
		t.Errorf("status table:\n%s\nwant:\n%s", got, want)
	}

	// Without safe mode there is no banner.
	st.Daemon.SafeMode = false
	b.Reset()
	printStatus(&b, st, now)
	if strings.Contains(b.String(), "SAFE MODE") {
		t.Errorf("banner without safe mode:\n%s", b.String())
	}
	// A recovery in progress, or stuck, is said at the top.
	st.Daemon.RecoveryStage = "restoring_failed"
	b.Reset()
	printStatus(&b, st, now)
	if !strings.Contains(b.String(), "\nRECOVERING from the daemon's own crash: restoring_failed (vigil recovery status)\n") {
		t.Errorf("no recovery banner:\n%s", b.String())
	}
}

func TestHuman(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-time.Second:                          "0ms",
		0:                                     "0ms",
		999 * time.Millisecond:                "999ms",
		time.Second:                           "1s",
		59*time.Second + 900*time.Millisecond: "59s",
		time.Minute:                           "1m0s",
		3*time.Minute + 12*time.Second:        "3m12s",
		2*time.Hour + 5*time.Minute:           "2h5m",
		24 * time.Hour:                        "1d0h",
		99*time.Hour + 59*time.Minute:         "4d3h",
	} {
		if got := human(d); got != want {
			t.Errorf("human(%v) = %q, want %q", d, got, want)
		}
	}
}

// run runs the command tree in-process and returns its exit code, stdout
// and stderr.
func run(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := Run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir() // --state-dir keeps these away from any config
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"frobnicate"}, 2, `vigil: unknown command "frobnicate"; see vigil help`},
		{[]string{"stauts"}, 2, `vigil: unknown command "stauts"; did you mean "status" or "start"?`},
		{[]string{"status", "web"}, 2, "vigil: status takes no arguments (usage: vigil status [--json] [flags])"},
		{[]string{"status", "--bogus"}, 2, "vigil: unknown flag: --bogus"},
		{[]string{"start"}, 2, "vigil: start takes exactly one service name (usage: vigil start NAME [flags])"},
		{[]string{"stop", "a", "b"}, 2, "vigil: stop takes exactly one service name (usage: vigil stop NAME [flags])"},
		{[]string{"restart"}, 2, "vigil: restart takes exactly one service name (usage: vigil restart NAME [flags])"},
		{[]string{"reset", "a", "b"}, 2, "vigil: reset takes exactly one service name (usage: vigil reset NAME [flags])"},
		{[]string{"logs"}, 2, "vigil: logs takes exactly one service name (usage: vigil logs NAME [-n N] [-f] [flags])"},
		{[]string{"logs", "web", "-n"}, 2, "vigil: flag needs an argument: 'n' in -n"},
		{[]string{"reload", "now"}, 2, "vigil: reload takes no arguments (usage: vigil reload [flags])"},
		{[]string{"down", "now"}, 2, "vigil: down takes no arguments (usage: vigil down [flags])"},
		{[]string{"up", "web"}, 2, "vigil: up takes no arguments (usage: vigil up [-d] [flags])"},
		{[]string{"check", "x"}, 2, "vigil: check takes no arguments (usage: vigil check [flags])"},
		{[]string{"--state-dir", dir, "status"}, 1, "vigil: daemon is not running (no socket at " + filepath.Join(dir, "vigil.sock") + ")"},
		{[]string{"--state-dir", dir, "stop", "web"}, 1, "vigil: daemon is not running (no socket at " + filepath.Join(dir, "vigil.sock") + ")"},
	} {
		code, stdout, stderr := run(tc.args...)
		if code != tc.code || stderr != tc.stderr+"\n" || stdout != "" {
			t.Errorf("vigil %s: exit %d, stderr %q, stdout %q; want exit %d, stderr %q",
				strings.Join(tc.args, " "), code, stderr, stdout, tc.code, tc.stderr)
		}
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := run("version")
	if code != 0 || stdout != "vigil "+Version+"\n" || stderr != "" {
		t.Fatalf("version: exit %d, %q, %q", code, stdout, stderr)
	}
}

// fakeDaemon is an api.Controller that answers from fixed values and
// records the operator's commands.
type fakeDaemon struct {
	status apitype.Status
	mu     sync.Mutex
	calls  []string
}

func (f *fakeDaemon) record(c string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
	return nil
}

func (f *fakeDaemon) Status() apitype.Status { return f.status }
func (f *fakeDaemon) Start(name string) error {
	if name != "web" {
		return apitype.Errorf(apitype.CodeNotFound, "unknown service %q", name)
	}
	return f.record("start " + name)
}
func (f *fakeDaemon) Stop(name string) error    { return f.record("stop " + name) }
func (f *fakeDaemon) Restart(name string) error { return f.record("restart " + name) }
func (f *fakeDaemon) Reset(name string) error   { return f.record("reset " + name) }
func (f *fakeDaemon) Reload() (apitype.ReloadResult, error) {
	return apitype.ReloadResult{Added: []string{"db", "cache"}, Changed: []string{"web"}, Unchanged: []string{"a", "b"}}, f.record("reload")
}
func (f *fakeDaemon) Shutdown() {}
func (f *fakeDaemon) Checkpoint(ctx context.Context) (apitype.CheckpointInfo, error) {
	return apitype.CheckpointInfo{Path: "/s/checkpoint.json", Generation: 4, Size: 812, DurationMS: 1.5}, f.record("checkpoint")
}
func (f *fakeDaemon) Recovery() (apitype.Recovery, error) {
	return apitype.Recovery{Stage: "restoring", Attempt: 2, LastError: "boom", History: []apitype.RecoveryTransition{
		{From: "crashed", To: "detecting", Attempt: 1, At: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}}}, f.record("recovery")
}
func (f *fakeDaemon) RetryRecovery(ctx context.Context) (apitype.Recovery, error) {
	return apitype.Recovery{Stage: "live", History: []apitype.RecoveryTransition{}}, f.record("retry")
}
func (f *fakeDaemon) RegisterSession(req apitype.SessionRequest) (apitype.Session, error) {
	f.record("register " + req.Name)
	return apitype.Session{ID: "abc123", Name: req.Name, PID: req.PID, StartTime: 7}, nil
}
func (f *fakeDaemon) HeartbeatSession(id string) error { f.record("heartbeat " + id); return nil }
func (f *fakeDaemon) EndSession(id string) error       { f.record("end " + id); return nil }
func (f *fakeDaemon) Sessions() []apitype.Session {
	return []apitype.Session{{ID: "abc123", Name: "agent", PID: 42, StartTime: 7, Groups: []registry.Group{{PGID: 43}}}}
}
func (f *fakeDaemon) Cleanup(ctx context.Context) (apitype.Cleanup, error) {
	f.record("gc")
	return apitype.Cleanup{Removed: []apitype.CleanedSession{{Session: apitype.Session{ID: "x", Name: "gone", PID: 9}, Verdict: "dead", Killed: []int{10, 11}}},
		Stale: []apitype.Session{}, Killed: 2}, nil
}
func (f *fakeDaemon) SetSafeMode(on bool) error {
	f.record(fmt.Sprint("safe-mode ", on))
	return nil
}
func (f *fakeDaemon) SetState(name string, state []byte) error {
	return f.record("state " + name + " " + string(state))
}

// TestCommandsAgainstAnAPIServer runs the client commands against the real
// API server on a real socket, backed by a fake controller.
func TestCommandsAgainstAnAPIServer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := api.Listen(filepath.Join(dir, "vigil.sock"))
	if err != nil {
		t.Fatal(err)
	}
	code := 3
	f := &fakeDaemon{status: apitype.Status{
		Daemon:   apitype.Daemon{PID: 99, Version: "x", StartedAt: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC), RecoveryStage: "live"},
		Services: []apitype.Service{{Name: "web", State: "exited", LastExit: &apitype.Exit{Class: "exit_code", Code: &code}, Breaker: "closed", Leases: []string{}}},
	}}
	srv := api.NewServer(f, slog.New(slog.DiscardHandler))
	go srv.Serve(l)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })

	// status --json is exactly the wire struct, indented.
	exit, stdout, stderr := run("--state-dir", dir, "status", "--json")
	want, _ := json.MarshalIndent(f.status, "", "  ")
	if exit != 0 || stdout != string(want)+"\n" || stderr != "" {
		t.Fatalf("status --json: exit %d, stderr %q, stdout:\n%s\nwant:\n%s", exit, stderr, stdout, want)
	}
	var back apitype.Status
	if err := json.Unmarshal([]byte(stdout), &back); err != nil || *back.Services[0].LastExit.Code != 3 {
		t.Fatalf("status --json does not decode back: %v", err)
	}

	for _, tc := range []struct {
		args   []string
		exit   int
		stdout string
		stderr string
	}{
		{[]string{"start", "web"}, 0, "vigil: web: started\n", ""},
		{[]string{"stop", "web"}, 0, "vigil: web: stopped\n", ""},
		{[]string{"restart", "web"}, 0, "vigil: web: restarted\n", ""},
		{[]string{"reset", "web"}, 0, "vigil: web: reset\n", ""},
		{[]string{"start", "nope"}, 1, "", "vigil: unknown service \"nope\"\n"},
		{[]string{"reload"}, 0, "vigil: reloaded: added db cache, removed none, changed web, unchanged 2\n", ""},
		{[]string{"checkpoint", "now"}, 0, "vigil: checkpoint written: /s/checkpoint.json, generation 4, 812 bytes in 1.50ms\n", ""},
		{[]string{"recovery", "status"}, 0, "recovery: restoring (attempt 2): boom\n  " +
			time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC).Local().Format("15:04:05.000") + "  crashed → detecting  attempt 1\n", ""},
		{[]string{"recovery", "retry"}, 0, "recovery: live (no recovery in progress)\n", ""},
		{[]string{"safe-mode", "enter"}, 0, "vigil: safe mode on: only essential services run (vigil safe-mode exit brings the rest back)\n", ""},
		{[]string{"safe-mode", "exit"}, 0, "vigil: safe mode off: every service runs again\n", ""},
		{[]string{"session", "register", "--name", "agent", "--pid", "42"}, 0, "abc123\n", ""},
		{[]string{"session", "heartbeat", "abc123"}, 0, "", ""},
		{[]string{"session", "end", "abc123"}, 0, "vigil: session abc123: ended\n", ""},
		{[]string{"session", "register"}, 2, "", "vigil: session register needs --name\n"},
		{[]string{"gc"}, 0, "removed gone (dead, owner pid 9): killed 2 processes\nvigil: gc: 1 sessions removed, 0 stale, 2 processes killed, 0 free lock files removed\n", ""},
	} {
		exit, stdout, stderr := run(append([]string{"--state-dir", dir}, tc.args...)...)
		if exit != tc.exit || stdout != tc.stdout || stderr != tc.stderr {
			t.Errorf("vigil %s: exit %d, stdout %q, stderr %q; want %d, %q, %q",
				strings.Join(tc.args, " "), exit, stdout, stderr, tc.exit, tc.stdout, tc.stderr)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := strings.Join(f.calls, ", "); got != "start web, stop web, restart web, reset web, reload, checkpoint, recovery, retry, safe-mode true, safe-mode false, register agent, heartbeat abc123, end abc123, gc" {
		t.Errorf("the daemon was asked: %s", got)
	}
}

func TestLastLinesReadsOnlyTheTail(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "daemon.log")
	var b strings.Builder
	for i := range 5000 { // ~50 KiB, more than lastLines reads
		fmt.Fprintf(&b, "line %d\n", i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := lastLines(path, 3), path+" ends with: line 4997 / line 4998 / line 4999"; got != want {
		t.Fatalf("lastLines = %q, want %q", got, want)
	}
	missing := filepath.Join(t.TempDir(), "none.log")
	if got := lastLines(missing, 3); got != "no log at "+missing {
		t.Fatalf("lastLines of a missing file = %q", got)
	}
}
