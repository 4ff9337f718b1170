package probe

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/config"
)

func TestHTTP(t *testing.T) {
	t.Parallel()
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(200)
		case "/moved":
			http.Redirect(w, r, "/nowhere", http.StatusMovedPermanently)
		case "/hang":
			<-hang
		default:
			code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
			w.WriteHeader(code)
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hang) }) // runs first: lets the hanging handler end
	for path, want := range map[string]string{"/ok": "", "/moved": "", "/404": "status 404", "/503": "status 503"} {
		err := Check(context.Background(), config.ReadyHTTP, srv.URL+path, "", nil, time.Second)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("GET %s: %v, want %q", path, err, want)
		}
	}
	start := time.Now()
	err := Check(context.Background(), config.ReadyHTTP, srv.URL+"/hang", "", nil, 200*time.Millisecond)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("hanging server: %v", err)
	}
	if took := time.Since(start); took > 700*time.Millisecond {
		t.Fatalf("timeout of 200ms took %v", took)
	}
}

func TestTCP(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := Check(context.Background(), config.ReadyTCP, "", addr, nil, time.Second); err != nil {
		t.Fatalf("open port: %v", err)
	}
	l.Close()
	err = Check(context.Background(), config.ReadyTCP, "", addr, nil, time.Second)
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("closed port: %v", err)
	}
}

func TestExec(t *testing.T) {
	t.Parallel()
	if err := Check(context.Background(), config.ReadyExec, "", "", []string{"true"}, time.Second); err != nil {
		t.Fatal(err)
	}
	err := Check(context.Background(), config.ReadyExec, "", "", []string{"sh", "-c", "exit 2"}, time.Second)
	if err == nil || !strings.Contains(err.Error(), "exit status 2") {
		t.Fatalf("exit 2: %v", err)
	}
	if err := Check(context.Background(), config.ReadyExec, "", "", []string{"/no/such/prog"}, time.Second); err == nil {
		t.Fatal("a missing program passed")
	}
	// A hanging check and the child it put in the background are killed.
	pidfile := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	err = Check(context.Background(), config.ReadyExec, "", "", []string{"sh", "-c", "sleep 1000 & echo $! > " + pidfile + "; sleep 1000"}, 300*time.Millisecond)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("hanging command: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("timeout of 300ms took %v", took)
	}
	b, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); strings.Contains(string(st), ") Z ") {
			break // killed; its parent (init or a subreaper) reaps it
		}
		if time.Now().After(deadline) {
			t.Fatalf("background child %d of a timed-out check still runs", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
