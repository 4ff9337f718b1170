package daemon_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/api/client"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/lock"
	"github.com/vigil-dev/vigil/internal/proc"
)

// startGroup starts sh in a process group of its own with a background
// and a foreground sleep; it is waited for (reaped) in the background.
func startGroup(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait()
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return cmd
}

// groupAlive lists the live (not zombie) processes of process group pgid.
func groupAlive(pgid int) []int {
	var out []int
	for _, pid := range allPIDs() {
		if g, ok := proc.ProcessGroup(pid); ok && g == pgid && alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

func allPIDs() []int {
	entries, _ := filepath.Glob("/proc/[0-9]*")
	var out []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(filepath.Base(e), &pid); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

const sessionsToml = `
[sessions]
cleanup_period = "100ms"
kill_grace = "200ms"
[services.idle]
command = ["sleep", "1000"]
`

// TestDeadOwnersGroupsAreCleanedUp: a session's owner is SIGKILLed;
// within one cleanup period every process it owned is gone, the cleanup
// is journaled, and a stranger that now has a dead owner's pid is spared.
func TestDeadOwnersGroupsAreCleanedUp(t *testing.T) {
	t.Parallel()
	p := startProjectIn(t, t.TempDir(), sessionsToml, nil)
	owner := startGroup(t, "sleep 1000")
	owned := startGroup(t, "sleep 1000 & sleep 1000; wait")
	deadline := time.Now().Add(10 * time.Second)
	for len(groupAlive(owned.Process.Pid)) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the owned group has %v", groupAlive(owned.Process.Pid))
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx := context.Background()
	_, err := p.c.RegisterSession(ctx, apitype.SessionRequest{Name: "agent", Type: "agent", PID: owner.Process.Pid,
		Groups: []int{owned.Process.Pid}})
	if err != nil {
		t.Fatal(err)
	}
	// A session whose owner pid now belongs to a stranger (another start
	// time): dead, and the stranger is not touched.
	stranger := startGroup(t, "sleep 1000")
	sid, err := proc.ReadIdentity(stranger.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.c.RegisterSession(ctx, apitype.SessionRequest{Name: "gone", PID: sid.PID, StartTime: sid.StartTime + 1})
	if err != nil {
		t.Fatal(err)
	}

	if err := syscall.Kill(owner.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	for len(groupAlive(owned.Process.Pid)) > 0 {
		if time.Since(began) > 5*time.Second {
			t.Fatalf("owned processes %v still alive 5s after their owner died", groupAlive(owned.Process.Pid))
		}
		time.Sleep(5 * time.Millisecond)
	}
	// One cleanup period (100ms) plus the SIGTERM: sh ignores nothing here.
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("cleanup took %v", took)
	}
	t.Logf("owner SIGKILL → owned group gone: %v", time.Since(began))
	if !sid.Alive() {
		t.Fatal("the stranger with a dead owner's pid was killed")
	}
	ss, err := p.c.Sessions(ctx)
	if err != nil || len(ss) != 0 {
		t.Fatalf("sessions left: %+v, %v", ss, err)
	}
	removed := journalTopics(t, p.dir, event.SessionRemoved)
	if len(removed) != 2 || !strings.Contains(strings.Join(removed, "\n"), "agent (dead): killed 3 processes") {
		t.Fatalf("journaled removals: %q", removed)
	}
}

// TestSessionsConcurrentAndDurable: 64 processes register 100 sessions
// each at the same time, over the real socket, while the test lists; no
// listed session is ever half written, no registration is lost, and after
// the daemon is SIGKILLed the next one has every one back from the
// journal. The registrants have exited by then: their sessions are dead
// and the first cleanup removes them all.
//
// Not parallel: 64 processes at once would starve the timing tests (100 ms
// watchdogs) that run beside parallel tests.
func TestSessionsConcurrentAndDurable(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { killProject(dir) })
	config := filepath.Join(dir, "vigil.toml")
	writeFile(t, config, "[sessions]\ncleanup_period = \"1h\"\n[services.idle]\ncommand = [\"sleep\", \"1000\"]\n")
	first := runDaemon(t, config, true)
	sock := filepath.Join(dir, ".vigil", "vigil.sock")
	c := &client.Client{SocketPath: sock}
	ctx := context.Background()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	torn := make(chan error, 1)
	var listWG sync.WaitGroup
	listWG.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			ss, err := c.Sessions(ctx)
			if err != nil {
				torn <- err
				return
			}
			for _, s := range ss {
				if s.ID == "" || s.StartTime == 0 || s.Name != fmt.Sprintf("p%d-%s", s.PID, strings.SplitN(s.Name, "-", 2)[1]) {
					torn <- fmt.Errorf("torn session %+v", s)
					return
				}
			}
		}
	})
	var wg sync.WaitGroup
	ids := make([][]string, 64)
	for w := range 64 {
		wg.Go(func() {
			cmd := exec.Command(exe)
			cmd.Env = append(os.Environ(), "DAEMON_TEST_HELPER=register-loop", "DAEMON_TEST_SOCKET="+sock, "GORACE=atexit_sleep_ms=0")
			out, err := cmd.Output()
			if err != nil {
				t.Errorf("registrant %d: %v: %s", w, err, out)
				return
			}
			ids[w] = strings.Fields(string(out))
		})
	}
	wg.Wait()
	close(stop)
	listWG.Wait()
	select {
	case err := <-torn:
		t.Fatal(err)
	default:
	}
	first.kill(t)
	runDaemon(t, config, true)
	ss, err := c.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, s := range ss {
		got[s.ID] = true
	}
	n := 0
	for w := range ids {
		if len(ids[w]) != 100 {
			t.Fatalf("registrant %d got %d ids", w, len(ids[w]))
		}
		for _, id := range ids[w] {
			n++
			if !got[id] {
				t.Fatalf("registration %s lost across the daemon's SIGKILL (%d of 6400 back)", id, len(ss))
			}
		}
	}
	if n != 6400 || len(ss) != 6400 {
		t.Fatalf("%d registered, %d after the restart; want 6400", n, len(ss))
	}
	res, err := c.Cleanup(ctx)
	if err != nil || len(res.Removed) != 6400 {
		t.Fatalf("cleanup of 6400 sessions of exited owners removed %d, %v", len(res.Removed), err)
	}
}

// TestGCRemovesFreeLockFiles: `vigil gc` removes the lock files nobody
// holds (a dead holder's lock is free at once) and keeps held ones.
func TestGCRemovesFreeLockFiles(t *testing.T) {
	t.Parallel()
	p := startProjectIn(t, t.TempDir(), sessionsToml, nil)
	dir := lock.Dir(filepath.Join(p.dir, ".vigil"))
	free, err := lock.TryAcquire(dir, "free")
	if err != nil {
		t.Fatal(err)
	}
	free.Release()
	held, err := lock.TryAcquire(dir, "held")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	res, err := p.c.Cleanup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res.Locks) != "[free]" {
		t.Fatalf("gc removed lock files %v, want [free]", res.Locks)
	}
	if _, err := os.Stat(filepath.Join(dir, "held.lock")); err != nil {
		t.Fatalf("a held lock's file: %v", err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
