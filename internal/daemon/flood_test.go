package daemon_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"golang.org/x/sys/unix"
)

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestNotifyFloodAndForgery: 100,000 datagrams of every bad kind, plus a
// process outside every service heartbeating with a victim's name in mind,
// neither keep an unwatched victim alive nor disturb a watched service.
func TestNotifyFloodAndForgery(t *testing.T) {
	notifyBin := needSystemdNotify(t)
	p := startProject(t, fmt.Sprintf(`
[services.watched]
command = [%s]
env = { DAEMON_TEST_HELPER = "sdnotify" }
ready = "notify"
watchdog = "300ms"

[services.victim]
command = "trap '' ABRT; exec sleep 1000"
watchdog = "1s"
stop_timeout = "200ms"
restart = "never"

# Leaves its process group (setsid) and heartbeats from there: it speaks
# for no service, whatever it hopes.
[services.forger]
command = "setsid sh -c 'while true; do %s WATCHDOG=1; sleep 0.05; done' & exec sleep 1000"
`, selfCommand(t), notifyBin))
	w := p.waitFor("watched", 10*time.Second, "ready", ready)
	v := p.waitFor("victim", 10*time.Second, "running", running)
	fdsBefore := openFDs(t)

	sock := p.status().Daemon.Notify.Socket
	payloads := [][]byte{
		[]byte("WATCHDOG=1"),         // valid, but from no service
		[]byte("READY=1\nSTATUS=x"),  // valid, from no service
		{},                           // zero-length
		make([]byte, 5000),           // oversized
		[]byte("WATCHDOG=1\x00junk"), // NUL
		[]byte("no equals sign"),     // unparsable
		[]byte("MAINPID=notanumber"), // bad value
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	rights := unix.UnixRights(int(pr.Fd()), int(pw.Fd()))
	const total = 100_000
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer unix.Close(fd)
			to := &unix.SockaddrUnix{Name: sock}
			for i := g; i < total; i += 4 {
				var oob []byte
				if i%10 == 0 {
					oob = rights // descriptors the daemon must close
				}
				_ = unix.Sendmsg(fd, payloads[i%len(payloads)], oob, to, 0)
			}
		}(g)
	}
	// The daemon answers throughout.
	flooded := make(chan struct{})
	go func() { wg.Wait(); close(flooded) }()
	for done := false; !done; {
		select {
		case <-flooded:
			done = true
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := p.c.Status(ctx)
		cancel()
		if err != nil {
			t.Fatalf("status during the flood: %v", err)
		}
	}

	// The victim's deadline was not moved: unresponsive two intervals after
	// it started, then SIGKILL after stop_timeout, by the daemon's own clock.
	s := p.waitFor("victim", 10*time.Second, "ended", func(s apitype.Service) bool { return s.State == "exited" })
	lived := s.LastExit.At.Sub(*v.StartedAt)
	if s.LastExit.Class != "unresponsive" || lived < 2200*time.Millisecond || lived > 3500*time.Millisecond {
		t.Fatalf("victim: %+v after %v, want unresponsive after 2 × 1s + 200ms", s.LastExit, lived)
	}
	if got := p.service("watched"); got.PID != w.PID || got.Restarts != 0 {
		t.Fatalf("the flood disturbed the watched service: %+v", got)
	}
	st := p.status().Daemon.Notify
	d := st.Dropped
	if d["empty"] == 0 || d["oversize"]+d["truncated"] == 0 || d["invalid"] == 0 || d["unknown_sender"] == 0 {
		t.Fatalf("drops not counted: %+v", d)
	}
	if st.Received < total {
		t.Fatalf("received %d of %d datagrams", st.Received, total)
	}
	// Every passed descriptor was closed: none leaked into this process,
	// which hosts the daemon.
	deadline := time.Now().Add(5 * time.Second)
	for openFDs(t) > fdsBefore+2 {
		if time.Now().After(deadline) {
			t.Fatalf("descriptors leaked: %d before, %d after", fdsBefore, openFDs(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
