package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/api"
	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/api/client"
	"github.com/vigil-dev/vigil/internal/registry"
)

// helperEnv makes the test binary a client that calls Status on the socket
// named by its value and prints the error it got as JSON (an empty object
// when none); the peer-credential test runs it as another user.
const helperEnv = "VIGIL_API_TEST_STATUS_OF"

func TestMain(m *testing.M) {
	if sock := os.Getenv(helperEnv); sock != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := (&client.Client{SocketPath: sock}).Status(ctx)
		var got apitype.Error
		var ae *apitype.Error
		switch {
		case errors.As(err, &ae):
			got = *ae
		case err != nil:
			got = apitype.Error{Code: "not an *apitype.Error", Message: err.Error()}
		}
		json.NewEncoder(os.Stdout).Encode(got)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fake is a Controller that records what it was asked. A service name that
// is an error code ("not_found", …) makes the verb fail with that class;
// "plain" fails with an error that is not an *apitype.Error, "wrapped" with
// a not_found wrapped in context; any other name succeeds.
type fake struct {
	mu       sync.Mutex
	calls    []string
	shutdown chan struct{}
}

func (f *fake) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func (f *fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fake) verb(verb, name string) error {
	f.record(verb + " " + name)
	switch code := apitype.ErrorCode(name); code {
	case "plain":
		return errors.New("disk on fire")
	case "wrapped":
		return fmt.Errorf("supervisor: %s %s: %w", verb, name, apitype.Errorf(apitype.CodeNotFound, "gone"))
	case apitype.CodeNotFound, apitype.CodeAlreadyExists, apitype.CodeFailedPrecondition, apitype.CodeInvalidArgument,
		apitype.CodeUnavailable, apitype.CodePermissionDenied, apitype.CodeInternal:
		return apitype.Errorf(code, "%s refused: %s", verb, name)
	}
	return nil
}

func (f *fake) Status() apitype.Status {
	f.record("status")
	return apitype.Status{Daemon: apitype.Daemon{PID: 42}, Services: []apitype.Service{{Name: "web", State: "running"}}}
}
func (f *fake) Start(name string) error   { return f.verb("start", name) }
func (f *fake) Stop(name string) error    { return f.verb("stop", name) }
func (f *fake) Restart(name string) error { return f.verb("restart", name) }
func (f *fake) Reset(name string) error   { return f.verb("reset", name) }
func (f *fake) Reload() (apitype.ReloadResult, error) {
	f.record("reload")
	return apitype.ReloadResult{Added: []string{"db"}, Changed: []string{"web"}}, nil
}
func (f *fake) Shutdown() { f.record("shutdown"); close(f.shutdown) }
func (f *fake) Checkpoint(ctx context.Context) (apitype.CheckpointInfo, error) {
	f.record("checkpoint")
	return apitype.CheckpointInfo{Generation: 7, Size: 123}, nil
}
func (f *fake) Recovery() (apitype.Recovery, error) {
	f.record("recovery")
	return apitype.Recovery{Stage: "live", History: []apitype.RecoveryTransition{}}, nil
}
func (f *fake) RetryRecovery(ctx context.Context) (apitype.Recovery, error) {
	f.record("retry")
	return apitype.Recovery{}, apitype.Errorf(apitype.CodeFailedPrecondition, "recovery is live: nothing to retry")
}
func (f *fake) RegisterSession(req apitype.SessionRequest) (apitype.Session, error) {
	f.record("register " + req.Name)
	return apitype.Session{ID: "abc123", Name: req.Name, PID: req.PID, StartTime: 7}, nil
}
func (f *fake) HeartbeatSession(id string) error { f.record("heartbeat " + id); return nil }
func (f *fake) EndSession(id string) error       { f.record("end " + id); return nil }
func (f *fake) Sessions() []apitype.Session {
	return []apitype.Session{{ID: "abc123", Name: "agent", PID: 42, StartTime: 7, Groups: []registry.Group{{PGID: 43}}}}
}
func (f *fake) Cleanup(ctx context.Context) (apitype.Cleanup, error) {
	f.record("gc")
	return apitype.Cleanup{Removed: []apitype.CleanedSession{{Session: apitype.Session{ID: "x", Name: "gone", PID: 9}, Verdict: "dead", Killed: []int{10, 11}}},
		Stale: []apitype.Session{}, Killed: 2}, nil
}
func (f *fake) SetSafeMode(on bool) error {
	f.record(fmt.Sprint("safe-mode ", on))
	return nil
}
func (f *fake) SetState(name string, state []byte) error {
	f.record("state " + name + " " + string(state))
	return f.verb("state", name)
}

// logRecorder is a slog.Handler that keeps every message with its attributes.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	line := rec.Message
	rec.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, line)
	return nil
}

func (r *logRecorder) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

// serve runs a server for a fresh fake on sock (in a new temp dir when
// empty) until the test ends.
func serve(t *testing.T, sock string) (*client.Client, *fake, *logRecorder, string) {
	t.Helper()
	if sock == "" {
		sock = filepath.Join(t.TempDir(), "vigil.sock")
	}
	l, err := api.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fake{shutdown: make(chan struct{})}
	rec := &logRecorder{}
	srv := api.NewServer(f, slog.New(rec))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return &client.Client{SocketPath: sock}, f, rec, sock
}

// rawHTTP is a plain HTTP client on the socket, to see status codes.
func rawHTTP(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
}

func TestEveryRoute(t *testing.T) {
	t.Parallel()
	c, f, _, sock := serve(t, "")
	ctx := context.Background()

	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode %v (%v), want a socket with mode 0600", fi.Mode(), err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	st, err := c.Status(ctx)
	if err != nil || st.Daemon.PID != 42 || len(st.Services) != 1 || st.Services[0].State != "running" {
		t.Fatalf("status %+v, %v", st, err)
	}
	for _, verb := range []func(context.Context, string) error{c.Start, c.Stop, c.Restart, c.Reset} {
		if err := verb(ctx, "web"); err != nil {
			t.Fatal(err)
		}
	}
	res, err := c.Reload(ctx)
	if err != nil || fmt.Sprint(res.Added, res.Changed) != "[db] [web]" {
		t.Fatalf("reload %+v, %v", res, err)
	}
	if info, err := c.Checkpoint(ctx); err != nil || info.Generation != 7 {
		t.Fatalf("checkpoint %+v, %v", info, err)
	}
	if err := c.SetState(ctx, "web", []byte(`{"cursor":12}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetState(ctx, "invalid_argument", []byte(`x`)); !errors.Is(err, apitype.ErrInvalidArgument) {
		t.Fatalf("set state error: %v", err)
	}
	if err := c.SetSafeMode(ctx, true); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Recovery(ctx); err != nil || st.Stage != "live" {
		t.Fatalf("recovery %+v, %v", st, err)
	}
	if _, err := c.RetryRecovery(ctx); !errors.Is(err, apitype.ErrFailedPrecondition) {
		t.Fatalf("retry error: %v", err)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	<-f.shutdown
	want := `status start web stop web restart web reset web reload checkpoint state web {"cursor":12} state web ` +
		`state invalid_argument x state invalid_argument safe-mode true recovery retry shutdown`
	if got := strings.Join(f.Calls(), " "); got != want {
		t.Fatalf("controller saw %q, want %q", got, want)
	}

	// A name that needs escaping reaches the controller as it was given.
	if err := c.Start(ctx, "a/b c"); err != nil {
		t.Fatalf("start a/b c: %v", err)
	}
	if calls := f.Calls(); calls[len(calls)-1] != "start a/b c" {
		t.Fatalf("escaped name arrived as %q", calls[len(calls)-1])
	}

	// Wrong method and unknown path: JSON errors, nothing called.
	n := len(f.Calls())
	for _, r := range []struct{ method, path string }{{"GET", "/v1/shutdown"}, {"POST", "/v1/nothing"}, {"DELETE", "/v1/services/web/start"}} {
		req, _ := http.NewRequest(r.method, "http://vigil"+r.path, nil)
		resp, err := rawHTTP(sock).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var ae apitype.Error
		err = json.NewDecoder(resp.Body).Decode(&ae)
		resp.Body.Close()
		if err != nil || resp.StatusCode/100 != 4 || ae.Code == "" {
			t.Fatalf("%s %s: %s %+v (%v)", r.method, r.path, resp.Status, ae, err)
		}
	}
	if len(f.Calls()) != n {
		t.Fatalf("a bad request reached the controller: %v", f.Calls()[n:])
	}
}

func TestErrorClassesCrossTheSocket(t *testing.T) {
	t.Parallel()
	c, _, _, sock := serve(t, "")
	ctx := context.Background()
	for _, tc := range []struct {
		name     string // also the code the fake fails with
		status   int
		sentinel error
		code     apitype.ErrorCode
		message  string
	}{
		{"not_found", 404, apitype.ErrNotFound, apitype.CodeNotFound, "restart refused: not_found"},
		{"already_exists", 409, apitype.ErrAlreadyExists, apitype.CodeAlreadyExists, "restart refused: already_exists"},
		{"failed_precondition", 409, apitype.ErrFailedPrecondition, apitype.CodeFailedPrecondition, "restart refused: failed_precondition"},
		{"invalid_argument", 400, apitype.ErrInvalidArgument, apitype.CodeInvalidArgument, "restart refused: invalid_argument"},
		{"unavailable", 503, apitype.ErrUnavailable, apitype.CodeUnavailable, "restart refused: unavailable"},
		{"permission_denied", 403, apitype.ErrPermissionDenied, apitype.CodePermissionDenied, "restart refused: permission_denied"},
		{"internal", 500, nil, apitype.CodeInternal, "restart refused: internal"},
		{"plain", 500, nil, apitype.CodeInternal, "disk on fire"},
		{"wrapped", 404, apitype.ErrNotFound, apitype.CodeNotFound, "supervisor: restart wrapped: gone"},
	} {
		resp, err := rawHTTP(sock).Post("http://vigil/v1/services/"+tc.name+"/restart", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		var body apitype.Error
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != tc.status || body.Code != tc.code || body.Message != tc.message {
			t.Errorf("%s: HTTP %d %+v (%v), want %d %s %q", tc.name, resp.StatusCode, body, err, tc.status, tc.code, tc.message)
		}

		err = c.Restart(ctx, tc.name)
		var ae *apitype.Error
		if !errors.As(err, &ae) || ae.Code != tc.code || ae.Message != tc.message {
			t.Errorf("%s: client got %#v, want %s %q", tc.name, err, tc.code, tc.message)
		}
		if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
			t.Errorf("%s: errors.Is(%v, %v) is false", tc.name, err, tc.sentinel)
		}
		if errors.Is(err, apitype.ErrNotFound) != (tc.code == apitype.CodeNotFound) {
			t.Errorf("%s: errors.Is(err, ErrNotFound) = %v", tc.name, !(tc.code == apitype.CodeNotFound))
		}
	}
}

func TestNoDaemonIsUnavailable(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "vigil.sock")
	err := (&client.Client{SocketPath: sock}).Ping(context.Background())
	if !errors.Is(err, apitype.ErrUnavailable) || err.Error() != "daemon is not running (no socket at "+sock+")" {
		t.Fatalf("ping without a daemon: %v", err)
	}
	// A stale socket file (nobody listening) says the same.
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	err = (&client.Client{SocketPath: sock}).Ping(context.Background())
	if !errors.Is(err, apitype.ErrUnavailable) || err.Error() != "daemon is not running (no socket at "+sock+")" {
		t.Fatalf("ping of a stale socket: %v", err)
	}
	// A server on the same path replaces the stale socket and answers.
	c, _, _, _ := serve(t, sock)
	if err := c.Ping(context.Background()); err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
}

func TestListenRefusesSymlinkAndOtherFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "vigil.sock")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if l, err := api.Listen(link); err == nil || err.Error() != "api: "+link+" is a symlink, not a socket: refusing to replace it" {
		if l != nil {
			l.Close()
		}
		t.Fatalf("Listen on a symlink: %v", err)
	}
	if l, err := api.Listen(target); err == nil {
		l.Close()
		t.Fatal("Listen replaced a regular file")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatal("the file behind the symlink was touched")
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the symlink was replaced: %v %v", fi.Mode(), err)
	}
}

// TestOtherUsersAreRefused runs a client as uid 65534: with the socket's
// 0600 mode it cannot connect at all; with the mode loosened by hand it
// connects, and the server's peer-credential check closes the connection
// before the controller is asked anything.
func TestOtherUsersAreRefused(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	// A directory uid 65534 can enter, holding a copy of this test binary
	// it can execute (the build dir is private to root).
	dir, err := os.MkdirTemp("", "vigil-api-peer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "api.test")
	copyExecutable(t, exe)

	c, f, rec, sock := serve(t, filepath.Join(dir, "vigil.sock"))
	asNobody := func() apitype.Error {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
		// GORACE: a race-enabled helper would otherwise linger 1 s at exit.
		cmd.Env = append(os.Environ(), helperEnv+"="+sock, "GORACE=atexit_sleep_ms=0")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("helper as uid 65534: %v", err)
		}
		var ae apitype.Error
		if err := json.Unmarshal(out, &ae); err != nil {
			t.Fatalf("helper said %q: %v", out, err)
		}
		return ae
	}

	got := asNobody()
	want := apitype.Error{Code: apitype.CodePermissionDenied, Message: "permission denied on " + sock + ": the daemon belongs to another user"}
	if got != want {
		t.Fatalf("through a 0600 socket: %+v, want %+v", got, want)
	}

	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	got = asNobody()
	want = apitype.Error{Code: apitype.CodePermissionDenied, Message: "the daemon at " + sock + " refused us: it belongs to another user (uid 0)"}
	if got != want {
		t.Fatalf("through a loosened socket: %+v, want %+v", got, want)
	}
	if calls := f.Calls(); len(calls) != 0 {
		t.Fatalf("the refused client reached the controller: %v", calls)
	}
	if lines := rec.Lines(); len(lines) == 0 || !strings.Contains(lines[0], "refused") || !strings.Contains(lines[0], "uid=65534") {
		t.Fatalf("refusal not logged with the peer's uid: %q", lines)
	}
	// Our own user is still served through the same socket.
	if err := c.Ping(context.Background()); err != nil {
		t.Fatalf("own user after the refusal: %v", err)
	}
}

func copyExecutable(t *testing.T, dst string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
