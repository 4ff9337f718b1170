package api_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/vigil-dev/vigil/internal/api"
	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/api/client"
)

// fake is a Controller that answers from a table.
type fake struct{ shutdown chan struct{} }

func (f *fake) Status() apitype.Status {
	return apitype.Status{Daemon: apitype.Daemon{PID: 42}, Services: []apitype.Service{{Name: "web", State: "running"}}}
}

func (f *fake) Start(name string) error {
	if name != "web" {
		return apitype.Errorf(apitype.CodeNotFound, "unknown service %q", name)
	}
	return nil
}
func (f *fake) Stop(name string) error { return errors.New("disk on fire") }
func (f *fake) Restart(name string) error {
	return apitype.Errorf(apitype.CodeFailedPrecondition, "service %q is failed", name)
}
func (f *fake) Reset(name string) error { return nil }
func (f *fake) Reload() (apitype.ReloadResult, error) {
	return apitype.ReloadResult{Changed: []string{"web"}}, nil
}
func (f *fake) Shutdown() { close(f.shutdown) }

func serve(t *testing.T) (*client.Client, *fake, string) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "vigil.sock")
	l, err := api.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fake{shutdown: make(chan struct{})}
	srv := api.NewServer(f, nil)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return &client.Client{SocketPath: sock}, f, sock
}

func TestRoutesAndErrorClassesCrossTheSocket(t *testing.T) {
	t.Parallel()
	c, f, sock := serve(t)
	ctx := context.Background()
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v (%v), want 0600", fi.Mode(), err)
	}
	st, err := c.Status(ctx)
	if err != nil || st.Daemon.PID != 42 || st.Services[0].Name != "web" {
		t.Fatalf("status %+v, %v", st, err)
	}
	if err := c.Start(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	err = c.Start(ctx, "nope")
	if !errors.Is(err, apitype.ErrNotFound) || err.Error() != `unknown service "nope"` {
		t.Fatalf("start nope: %v", err)
	}
	if err := c.Restart(ctx, "web"); !errors.Is(err, apitype.ErrFailedPrecondition) {
		t.Fatalf("restart: %v", err)
	}
	var ae *apitype.Error
	if err := c.Stop(ctx, "web"); !errors.As(err, &ae) || ae.Code != apitype.CodeInternal || ae.Message != "disk on fire" {
		t.Fatalf("stop: %v", err)
	}
	if res, err := c.Reload(ctx); err != nil || res.Changed[0] != "web" {
		t.Fatalf("reload %+v, %v", res, err)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	<-f.shutdown
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
	if err := (&client.Client{SocketPath: sock}).Ping(context.Background()); !errors.Is(err, apitype.ErrUnavailable) {
		t.Fatalf("ping of a stale socket: %v", err)
	}
	// Listen replaces the stale socket.
	l2, err := api.Listen(sock)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	l2.Close()
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
	if _, err := api.Listen(link); err == nil {
		t.Fatal("Listen followed a symlink")
	}
	if _, err := api.Listen(target); err == nil {
		t.Fatal("Listen replaced a regular file")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatal("the file behind the symlink was touched")
	}
}
