package daemon_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/daemon"
)

// helperMain runs the behaviour named by DAEMON_TEST_HELPER when the test
// binary is started as a service; it reports whether it did.
func helperMain() bool {
	switch os.Getenv("DAEMON_TEST_HELPER") {
	case "":
		return false
	case "sdnotify":
		// A well-behaved go-systemd client: ready, then heartbeats at a
		// third of the interval it is given.
		if ok, err := sddaemon.SdNotify(false, "STATUS=serving\nREADY=1"); !ok || err != nil {
			fmt.Println("SdNotify:", ok, err)
			os.Exit(1)
		}
		interval, err := sddaemon.SdWatchdogEnabled(false)
		if err != nil || interval == 0 {
			fmt.Println("SdWatchdogEnabled:", interval, err)
			os.Exit(1)
		}
		for {
			time.Sleep(interval / 3)
			sddaemon.SdNotify(false, sddaemon.SdNotifyWatchdog)
		}
	case "hang":
		// Ready, two heartbeats, then stuck: alive but silent. It survives
		// SIGABRT (saying so), so only SIGKILL ends it.
		abrt := make(chan os.Signal, 1)
		signal.Notify(abrt, syscall.SIGABRT)
		sddaemon.SdNotify(false, "READY=1")
		for i := 0; i < 2; i++ {
			time.Sleep(50 * time.Millisecond)
			sddaemon.SdNotify(false, "WATCHDOG=1")
		}
		<-abrt
		fmt.Println("got SIGABRT")
		select {}
	case "vanish":
		// The main process hands over to a child (MAINPID=) that
		// heartbeats twice and dies; the main process itself lives on.
		cmd := exec.Command(os.Args[0])
		// GORACE: a -race binary otherwise lingers a second after os.Exit.
		cmd.Env = append(os.Environ(), "DAEMON_TEST_HELPER=vanish-child", "GORACE=atexit_sleep_ms=0")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		cmd.Run()
		select {}
	case "vanish-child":
		sddaemon.SdNotify(false, fmt.Sprintf("MAINPID=%d\nREADY=1", os.Getpid()))
		for i := 0; i < 2; i++ {
			time.Sleep(50 * time.Millisecond)
			sddaemon.SdNotify(false, "WATCHDOG=1")
		}
		os.Exit(0)
	}
	os.Exit(98)
	return true
}

func selfCommand(t *testing.T) string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%q", exe)
}

// needSystemdNotify returns the path of systemd-notify, a real sd_notify
// client nobody here wrote, or skips the test where it cannot exist.
func needSystemdNotify(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("systemd-notify")
	if err != nil {
		t.Skip("systemd-notify not installed: apt-get install systemd")
	}
	return path
}

func ready(s apitype.Service) bool { return s.Ready }

// needOtherUserNotify skips the test unless it can run a service as
// another user with its own notify socket, and returns systemd-notify.
func needOtherUserNotify(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch users")
	}
	if err := syscall.Access(filepath.Dir(daemon.UserNotifyRoot), 2 /* W_OK */); err != nil {
		t.Skipf("%s is not writable here: %v", filepath.Dir(daemon.UserNotifyRoot), err)
	}
	return needSystemdNotify(t)
}

// TestServiceOfAnotherUserCanNotify: a service that runs as nobody cannot
// enter the state dir (0700, root's), so it gets a notify socket of its
// own, writable by nobody alone; its READY=1 and WATCHDOG=1 arrive, and a
// dependent waits for them.
func TestServiceOfAnotherUserCanNotify(t *testing.T) {
	t.Parallel()
	notifyBin := needOtherUserNotify(t)
	p := startProject(t, fmt.Sprintf(`
[services.other]
command = "sleep 0.3; %s --ready; while true; do sleep 0.1; %s WATCHDOG=1; done"
user = "nobody"
cwd = "/"
ready = "notify"
watchdog = "1s"

[services.after]
command = ["sleep", "1000"]
depends_on = ["other"]
`, notifyBin, notifyBin))
	s := p.waitFor("other", 10*time.Second, "ready", ready)
	if s.HeartbeatAgeMS == nil {
		t.Fatal("no heartbeat from the service of another user")
	}
	p.waitFor("after", 10*time.Second, "running", running)
	// Several watchdog intervals later it still runs the same instance.
	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if now := p.service("other"); now.PID != s.PID || !now.Ready {
			t.Fatalf("the watchdog of another user's service was not kept: %+v", now)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Its socket is its user's alone, in directories no one else can list.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", s.PID))
	if err != nil {
		t.Fatal(err)
	}
	var sock string
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, "NOTIFY_SOCKET="); ok {
			sock = v
		}
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(sock, &st); err != nil {
		t.Fatalf("NOTIFY_SOCKET %q: %v", sock, err)
	}
	if st.Uid != 65534 || st.Mode&0o777 != 0o600 || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		t.Fatalf("%s: uid %d mode %o; want nobody's socket, 0600", sock, st.Uid, st.Mode)
	}
	for dir := filepath.Dir(sock); dir != filepath.Dir(daemon.UserNotifyRoot); dir = filepath.Dir(dir) {
		if err := syscall.Lstat(dir, &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o711 {
			t.Fatalf("%s: uid %d mode %o (%v); want root's, 0711", dir, st.Uid, st.Mode&0o777, err)
		}
	}
}

func TestGoSystemdAndSystemdNotifyClientsKeepTheWatchdog(t *testing.T) {
	t.Parallel()
	notifyBin := needSystemdNotify(t)
	p := startProject(t, fmt.Sprintf(`
[services.gosd]
command = [%s]
env = { DAEMON_TEST_HELPER = "sdnotify" }
ready = "notify"
watchdog = "200ms"

[services.shell]
command = "%s --ready --status=up; while true; do sleep 0.1; %s WATCHDOG=1; done"
ready = "notify"
watchdog = "1s"
`, selfCommand(t), notifyBin, notifyBin))
	for _, name := range []string{"gosd", "shell"} {
		s := p.waitFor(name, 10*time.Second, "ready", ready)
		if s.HeartbeatAgeMS == nil {
			t.Fatalf("%s: no heartbeat_age_ms", name)
		}
	}
	if s := p.service("gosd"); s.Status != "serving" {
		t.Errorf("gosd status text %q", s.Status)
	}
	// Several watchdog intervals later both still run the same instance.
	first := map[string]int{"gosd": p.service("gosd").PID, "shell": p.service("shell").PID}
	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		for name, pid := range first {
			if s := p.service(name); s.PID != pid || s.State != "running" {
				t.Fatalf("%s lost its watchdog: %+v last_exit %+v", name, s, s.LastExit)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := p.status(); st.Daemon.Notify == nil || st.Daemon.Notify.Accepted == 0 {
		t.Fatalf("notify stats: %+v", st.Daemon.Notify)
	}
}

func TestHungServiceIsAbortedThenKilledAndRestarted(t *testing.T) {
	t.Parallel()
	p := startProject(t, fmt.Sprintf(`
[services.hang]
command = [%s]
env = { DAEMON_TEST_HELPER = "hang" }
ready = "notify"
watchdog = "200ms"
stop_timeout = "300ms"
[services.hang.backoff]
initial = "0s"
`, selfCommand(t)))
	s := p.waitFor("hang", 10*time.Second, "ready", ready)
	first, readyAt := s.PID, time.Now()
	s = p.waitFor("hang", 10*time.Second, "restarted", func(s apitype.Service) bool { return s.PID != first && s.PID != 0 })
	took := time.Since(readyAt)
	// Last heartbeat ≈100ms after ready, then 2 × 200ms, then 300ms until
	// SIGKILL: about 800ms; the upper bound leaves room for a loaded machine.
	if took < 600*time.Millisecond || took > 3*time.Second {
		t.Errorf("hung instance replaced after %v, want ≈800ms", took)
	}
	if s.LastExit.Class != "unresponsive" || s.LastExit.Signal != "SIGKILL" || s.Restarts != 1 {
		t.Fatalf("last_exit %+v restarts %d", s.LastExit, s.Restarts)
	}
	b, _ := os.ReadFile(filepath.Join(p.dir, ".vigil", "logs", "hang.log"))
	if !strings.Contains(string(b), "got SIGABRT") {
		t.Fatalf("SIGABRT did not come before SIGKILL; log: %q", b)
	}
}

func TestVanishedMainProcessIsHeartbeatTimeout(t *testing.T) {
	t.Parallel()
	p := startProject(t, fmt.Sprintf(`
[services.vanish]
command = [%s]
env = { DAEMON_TEST_HELPER = "vanish" }
ready = "notify"
watchdog = "200ms"
restart = "never"
`, selfCommand(t)))
	s := p.waitFor("vanish", 10*time.Second, "ended", func(s apitype.Service) bool { return s.State == "exited" })
	if s.LastExit.Class != "heartbeat_timeout" {
		t.Fatalf("last_exit %+v, want heartbeat_timeout", s.LastExit)
	}
}

func TestReadinessGatesDependents(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // the service will listen here, later
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := hl.Addr().String()
	hl.Close()
	marker := filepath.Join(t.TempDir(), "ready")
	p := startProject(t, fmt.Sprintf(`
[services.bynotify]
command = "sleep 0.3; systemd-notify --ready; exec sleep 1000"
ready = "notify"
[services.bytcp]
command = ["python3", "-c", "import socket,time; time.sleep(0.3); s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', %s)); s.listen(); time.sleep(1000)"]
ready = "tcp://%s"
[services.byhttp]
command = ["python3", "-c", "import time,http.server; time.sleep(0.3); http.server.HTTPServer(('127.0.0.1', %s), http.server.SimpleHTTPRequestHandler).serve_forever()"]
ready = "http://%s/"
[services.byexec]
command = "sleep 0.3; touch %s; exec sleep 1000"
ready = ["exec", "test", "-e", "%s"]
[services.dependent]
command = ["sleep", "1000"]
depends_on = ["bynotify", "bytcp", "byhttp", "byexec"]
`, port(addr), addr, port(httpAddr), httpAddr, marker, marker))
	d := p.waitFor("dependent", 20*time.Second, "running", running)
	for _, name := range []string{"bynotify", "bytcp", "byhttp", "byexec"} {
		s := p.service(name)
		if !s.Ready || s.StartedAt == nil {
			t.Fatalf("%s not ready: %+v", name, s)
		}
		if !d.StartedAt.After(s.StartedAt.Add(300 * time.Millisecond)) {
			t.Errorf("dependent started at %v, before %s could be ready (started %v + 300ms)", d.StartedAt, name, s.StartedAt)
		}
	}
	resp, err := http.Get("http://" + httpAddr + "/")
	if err == nil {
		resp.Body.Close()
	}
}

func port(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }
