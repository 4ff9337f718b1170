package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vigil-dev/vigil/internal/config"
)

// The test binary doubles as the command of exec checks: TestMain runs the
// behaviour named by PROBE_TEST_HELPER instead of the tests.
func TestMain(m *testing.M) {
	switch os.Getenv("PROBE_TEST_HELPER") {
	case "":
		os.Exit(m.Run())
	case "exit2":
		os.Exit(2)
	case "isolated":
		os.Exit(isolated())
	case "hang":
		time.Sleep(time.Hour)
	case "background":
		os.Exit(background())
	}
	os.Exit(100)
}

// isolated exits 0 when the process leads its own process group and its
// stdin, stdout and stderr are /dev/null.
func isolated() int {
	if unix.Getpgrp() != os.Getpid() {
		return 3
	}
	var null unix.Stat_t
	if unix.Stat("/dev/null", &null) != nil {
		return 4
	}
	for fd := range 3 {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil || st.Rdev != null.Rdev || st.Mode&unix.S_IFMT != unix.S_IFCHR {
			return 5 + fd
		}
	}
	return 0
}

// background starts a hanging child in its own process group, writes the
// child's pid to $PROBE_PIDFILE, then exits 0 if its argument is "exit" and
// hangs otherwise.
func background() int {
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), "PROBE_TEST_HELPER=hang")
	if child.Start() != nil {
		return 3
	}
	if os.WriteFile(os.Getenv("PROBE_PIDFILE"), []byte(strconv.Itoa(child.Process.Pid)), 0o644) != nil {
		return 4
	}
	if len(os.Args) > 1 && os.Args[1] == "exit" {
		return 0
	}
	time.Sleep(time.Hour)
	return 5
}

// helper is a Checker whose commands run the test binary as helper
// behaviour; if the test fails, it kills the process group of every
// command it started.
func helper(t *testing.T, behaviour string, env ...string) Checker {
	t.Helper()
	var mu sync.Mutex
	var pids []int
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if t.Failed() {
			for _, pid := range pids {
				_ = unix.Kill(-pid, unix.SIGKILL)
			}
		}
	})
	// GORACE: a race-enabled helper would otherwise linger a second at exit.
	env = append(env, "PROBE_TEST_HELPER="+behaviour, "GORACE=atexit_sleep_ms=0")
	spawn := func(argv []string) (int, func() (syscall.WaitStatus, error), error) {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return 0, nil, err
		}
		mu.Lock()
		pids = append(pids, cmd.Process.Pid)
		mu.Unlock()
		return cmd.Process.Pid, func() (syscall.WaitStatus, error) {
			_ = cmd.Wait()
			return cmd.ProcessState.Sys().(syscall.WaitStatus), nil
		}, nil
	}
	return Checker{Spawn: spawn}
}

// within fails the test unless fn returns within limit, and returns its error.
func within(t *testing.T, limit time.Duration, fn func() error) error {
	t.Helper()
	start := time.Now()
	err := fn()
	if took := time.Since(start); took > limit {
		t.Errorf("check took %v, want at most %v", took, limit)
	}
	return err
}

// wantMessage fails the test unless err's message is exactly want.
func wantMessage(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
}

func TestHTTP(t *testing.T) {
	t.Parallel()
	var redirectsFollowed, open atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/moved":
			http.Redirect(w, r, "/target", http.StatusMovedPermanently)
		case "/target":
			redirectsFollowed.Add(1)
		case "/hang":
			<-r.Context().Done() // until the check gives up and closes the connection
		case "/endless":
			chunk := make([]byte, 32<<10)
			for r.Context().Err() == nil {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		default:
			code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
			w.WriteHeader(code)
			fmt.Fprintf(w, "answered %d\n", code)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(tlsSrv.Close)

	t.Run("checks", func(t *testing.T) {
		for _, tt := range []struct{ name, url, want string }{
			{"200", srv.URL + "/200", ""},
			{"204", srv.URL + "/204", ""},
			{"301 passes itself", srv.URL + "/moved", ""},
			{"304", srv.URL + "/304", ""},
			{"404", srv.URL + "/404", "probe: " + srv.URL + "/404: status 404"},
			{"503", srv.URL + "/503", "probe: " + srv.URL + "/503: status 503"},
			{"endless body is not read to its end", srv.URL + "/endless", ""},
			{"self-signed certificate", tlsSrv.URL + "/", ""},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				err := within(t, 2*time.Second, func() error {
					return Check(context.Background(), config.ReadyHTTP, tt.url, "", nil, 5*time.Second)
				})
				if tt.want == "" && err != nil {
					t.Errorf("GET %s: %v, want a pass", tt.url, err)
				} else if tt.want != "" {
					wantMessage(t, err, tt.want)
				}
			})
		}
		t.Run("hang", func(t *testing.T) {
			t.Parallel()
			const timeout = 200 * time.Millisecond
			err := within(t, timeout+500*time.Millisecond, func() error {
				return Check(context.Background(), config.ReadyHTTP, srv.URL+"/hang", "", nil, timeout)
			})
			if !errors.Is(err, ErrTimeout) {
				t.Errorf("error %v does not wrap ErrTimeout", err)
			}
			wantMessage(t, err, "probe: "+srv.URL+"/hang: timed out after 200ms")
		})
		t.Run("caller gives up", func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			err := within(t, 600*time.Millisecond, func() error {
				return Check(ctx, config.ReadyHTTP, srv.URL+"/hang", "", nil, time.Minute)
			})
			if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
				t.Errorf("error %v, want context.Canceled and not ErrTimeout", err)
			}
		})
	})
	if n := redirectsFollowed.Load(); n != 0 {
		t.Errorf("a redirect was followed %d times", n)
	}
	// Every check's connection is closed by the client: the server sees
	// them all end without closing any itself.
	deadline := time.Now().Add(5 * time.Second)
	for open.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open after the checks ended", open.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHTTPRefused(t *testing.T) {
	t.Parallel()
	addr := closedPort(t)
	err := Check(context.Background(), config.ReadyHTTP, "http://"+addr+"/healthz", "", nil, time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %v, want ECONNREFUSED", err)
	}
	wantMessage(t, err, "probe: http://"+addr+"/healthz: dial tcp "+addr+": connect: connection refused")
}

// closedPort returns a loopback address nothing listens on. A socket
// stays bound to it, without listening, for the test's life: a port
// merely closed again could be taken by a listener of a test running
// beside this one.
func closedPort(t *testing.T) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port)
}

func TestTCP(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted := make(chan error, 1)
	go func() {
		conn, err := l.Accept()
		if err == nil {
			// The check closes its connection: this read ends with EOF.
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
		}
		accepted <- err
	}()
	if err := Check(context.Background(), config.ReadyTCP, "", l.Addr().String(), nil, time.Second); err != nil {
		t.Fatalf("open port: %v", err)
	}
	select {
	case err := <-accepted:
		if !errors.Is(err, io.EOF) {
			t.Errorf("the check's connection: read gave %v, want EOF", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the check's connection was not closed")
	}

	addr := closedPort(t)
	err = Check(context.Background(), config.ReadyTCP, "", addr, nil, time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("closed port: %v, want ECONNREFUSED", err)
	}
	wantMessage(t, err, "probe: tcp "+addr+": connection refused")

	wantMessage(t, Check(context.Background(), config.ReadyTCP, "", "127.0.0.1", nil, time.Second),
		"probe: tcp 127.0.0.1: address 127.0.0.1: missing port in address")
}

func TestExec(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, behaviour string
		argv            []string
		want            string
	}{
		{"true", "", []string{"/bin/true"}, ""},
		{"false", "", []string{"/bin/false"}, "probe: exec /bin/false: exit status 1"},
		{"found in PATH", "", []string{"true"}, ""},
		{"exit 2", "exit2", []string{self}, "probe: exec " + self + ": exit status 2"},
		{"own group, stdio on /dev/null", "isolated", []string{self}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := Checker{}
			if tt.behaviour != "" {
				c = helper(t, tt.behaviour)
			}
			err := c.Check(context.Background(), config.ReadyExec, "", "", tt.argv, 10*time.Second)
			if tt.want == "" && err != nil {
				t.Errorf("%q: %v, want a pass", tt.argv, err)
			} else if tt.want != "" {
				wantMessage(t, err, tt.want)
			}
		})
	}
	t.Run("missing program", func(t *testing.T) {
		t.Parallel()
		err := Check(context.Background(), config.ReadyExec, "", "", []string{"/no/such/program"}, time.Second)
		if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "probe: exec /no/such/program: ") {
			t.Errorf("error %v, want a not-exist error naming the program", err)
		}
	})
}

// gone waits until pid has ended (it may stay a zombie until whoever
// inherited it reaps it) and fails the test if it has not within 5s.
func gone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		// The state follows the parenthesised command name.
		if fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(fields) > 0 && fields[0] == "Z" {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("process %d is still running", pid)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestExecTimeoutKillsTheCommand(t *testing.T) {
	t.Parallel()
	var pid atomic.Int64
	c := Checker{Spawn: func(argv []string) (int, func() (syscall.WaitStatus, error), error) {
		p, wait, err := execSpawn(argv)
		pid.Store(int64(p))
		return p, wait, err
	}}
	t.Cleanup(func() {
		if p := int(pid.Load()); p > 0 && t.Failed() {
			_ = unix.Kill(-p, unix.SIGKILL)
		}
	})
	const timeout = 300 * time.Millisecond
	err := within(t, timeout+500*time.Millisecond, func() error {
		return c.Check(context.Background(), config.ReadyExec, "", "", []string{"sleep", "1000"}, timeout)
	})
	if !errors.Is(err, ErrTimeout) {
		t.Errorf("error %v does not wrap ErrTimeout", err)
	}
	wantMessage(t, err, "probe: exec sleep: timed out after 300ms")
	// Check has waited for it: nothing of its group is left, not even a zombie.
	if err := unix.Kill(-int(pid.Load()), 0); err != unix.ESRCH {
		t.Errorf("process group %d after the check: kill 0 gave %v, want ESRCH", pid.Load(), err)
	}
}

// TestExecLeavesNothingBehind runs a command that puts a child in the
// background, in its process group: the child is killed whether the
// command times out or exits.
func TestExecLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		arg     string
		timeout time.Duration
		timeOut bool
	}{
		{"command exits", "exit", 10 * time.Second, false},
		// Long enough for two starts of the test binary under -race.
		{"command times out", "hang", time.Second, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pidfile := filepath.Join(t.TempDir(), "pid")
			c := helper(t, "background", "PROBE_PIDFILE="+pidfile)
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			err = within(t, tt.timeout+500*time.Millisecond, func() error {
				return c.Check(context.Background(), config.ReadyExec, "", "", []string{self, tt.arg}, tt.timeout)
			})
			if errors.Is(err, ErrTimeout) != tt.timeOut || (!tt.timeOut && err != nil) {
				t.Errorf("error %v, want timed out: %v", err, tt.timeOut)
			}
			b, rerr := os.ReadFile(pidfile)
			if rerr != nil {
				t.Fatalf("the command did not start its child: %v", rerr)
			}
			child, _ := strconv.Atoi(string(b))
			t.Cleanup(func() {
				if t.Failed() {
					_ = unix.Kill(child, unix.SIGKILL)
				}
			})
			gone(t, child)
		})
	}
}

func TestSpawner(t *testing.T) {
	t.Parallel()
	failed := errors.New("no fork today")
	var got []string
	c := Checker{Spawn: func(argv []string) (int, func() (syscall.WaitStatus, error), error) {
		got = argv
		return 0, nil, failed
	}}
	err := c.Check(context.Background(), config.ReadyExec, "", "", []string{"pg_isready", "-q"}, time.Second)
	if !errors.Is(err, failed) {
		t.Errorf("error %v does not wrap the spawner's", err)
	}
	wantMessage(t, err, "probe: exec pg_isready: no fork today")
	if strings.Join(got, " ") != "pg_isready -q" {
		t.Errorf("spawner got argv %q", got)
	}
}

func TestExitReason(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		ws   syscall.WaitStatus
		want string
	}{
		{0, ""},
		{2 << 8, "exit status 2"},
		{255 << 8, "exit status 255"},
		{syscall.WaitStatus(syscall.SIGKILL), "killed by SIGKILL"},
		{syscall.WaitStatus(syscall.SIGSEGV) | 0x80, "killed by SIGSEGV"}, // with a core dump
	} {
		err := exitReason(tt.ws)
		if got := fmt.Sprint(err); (tt.want == "" && err != nil) || (tt.want != "" && got != tt.want) {
			t.Errorf("exitReason(%#x) = %v, want %q", uint32(tt.ws), err, tt.want)
		}
	}
}

func TestBadArguments(t *testing.T) {
	t.Parallel()
	wantMessage(t, Check(context.Background(), config.ReadyExec, "", "", nil, time.Second), "probe: exec: no command")
	wantMessage(t, Check(context.Background(), config.ReadyNotify, "", "", nil, time.Second), `probe: unknown check kind "notify"`)
}
