package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/api/client"
	"github.com/vigil-dev/vigil/internal/checkpoint"
	"github.com/vigil-dev/vigil/internal/daemon"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/journal"
	"github.com/vigil-dev/vigil/internal/proc"
	"github.com/vigil-dev/vigil/internal/recovery"
	"github.com/vigil-dev/vigil/internal/registry"
)

// recoveryHelper runs the behaviours of the recovery tests when the test
// binary is started as a daemon or a service; it reports whether it did.
func recoveryHelper() bool {
	switch os.Getenv("DAEMON_TEST_HELPER") {
	case "daemon":
		// A daemon in a process of its own, so that it can be SIGKILLed.
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		err := daemon.Run(ctx, daemon.Options{ConfigPath: os.Getenv("DAEMON_TEST_CONFIG"),
			Ready: func(err error) { fmt.Println("ready", err) }})
		if err != nil {
			fmt.Println("daemon:", err)
			os.Exit(1)
		}
		os.Exit(0)
	case "lease-then-crash":
		// Claims a task, then crashes once the file named in its argument
		// exists (the test waits until the daemon has the lease).
		sddaemon.SdNotify(false, "LEASE=task-7")
		for {
			if _, err := os.Stat(os.Args[len(os.Args)-1]); err == nil {
				os.Remove(os.Args[len(os.Args)-1])
				os.Exit(3)
			}
			time.Sleep(5 * time.Millisecond)
		}
	case "register-loop":
		// Registers 100 sessions owned by itself, one after another, and
		// prints their ids: one of the 64 concurrent registrants.
		c := &client.Client{SocketPath: os.Getenv("DAEMON_TEST_SOCKET")}
		for i := range 100 {
			s, err := c.RegisterSession(context.Background(), apitype.SessionRequest{Name: fmt.Sprintf("p%d-%d", os.Getpid(), i), PID: os.Getpid()})
			if err != nil {
				fmt.Println("error", err)
				os.Exit(1)
			}
			fmt.Println(s.ID)
		}
		os.Exit(0)
	case "heartbeat-until":
		// Ready, then heartbeats until the file named in its argument exists:
		// then it hangs, alive and silent.
		sddaemon.SdNotify(false, "READY=1")
		interval, _ := sddaemon.SdWatchdogEnabled(false)
		for {
			if _, err := os.Stat(os.Args[len(os.Args)-1]); err == nil {
				select {}
			}
			sddaemon.SdNotify(false, sddaemon.SdNotifyWatchdog)
			time.Sleep(interval / 4)
		}
	}
	return false
}

// daemonProc is a daemon running in a child process of the test.
type daemonProc struct {
	cmd  *exec.Cmd
	done chan error
}

// projectMarker is in the environment of every process of one test's
// project (the daemon passes its own on), so cleanup finds them all.
const projectMarker = "DAEMON_TEST_PROJECT"

// runDaemon starts a daemon process for config and waits until it is
// ready, or until it exits (with a fault point) when wantReady is false.
func runDaemon(t *testing.T, config string, wantReady bool, env ...string) *daemonProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "DAEMON_TEST_HELPER=daemon", "DAEMON_TEST_CONFIG="+config,
		projectMarker+"="+filepath.Dir(config), "GORACE=atexit_sleep_ms=0")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemonProc{cmd: cmd, done: make(chan error, 1)}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "ready") {
				ready <- sc.Text()
			}
		}
		d.done <- cmd.Wait()
	}()
	t.Cleanup(func() { d.stop(t) })
	if !wantReady {
		return d
	}
	select {
	case r := <-ready:
		if r != "ready <nil>" {
			t.Fatalf("daemon: %s", r)
		}
	case err := <-d.done:
		t.Fatalf("daemon exited before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("daemon not ready within 30s")
	}
	return d
}

// kill SIGKILLs the daemon and waits until it is gone.
func (d *daemonProc) kill(t *testing.T) {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	d.wait(t)
}

func (d *daemonProc) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-d.done:
		d.done <- err
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("daemon did not exit within 30s")
		return nil
	}
}

// stop ends the daemon gracefully if it still runs.
func (d *daemonProc) stop(t *testing.T) {
	select {
	case err := <-d.done:
		d.done <- err
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		d.done <- err
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		t.Errorf("daemon did not stop within 30s")
	}
}

// killProject SIGKILLs every process left with the project's marker.
func killProject(dir string) {
	for _, pid := range projectPIDs(dir, "") {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// projectPIDs lists the live processes of the project in dir, of one
// service when service is not empty.
func projectPIDs(dir, service string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !alive(pid) {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		env := "\x00" + string(b)
		if strings.Contains(env, "\x00"+projectMarker+"="+dir+"\x00") &&
			(service == "" || strings.Contains(env, "\x00VIGIL_SERVICE="+service+"\x00")) {
			out = append(out, pid)
		}
	}
	return out
}

func waitAll(t *testing.T, c *client.Client, timeout time.Duration, what string, cond func(apitype.Status) bool) apitype.Status {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, err := c.Status(context.Background())
		if err == nil && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %s within %v: %+v, %v", what, timeout, st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitJournaled waits until the journal on disk records the start of
// every instance st shows, which the next daemon adopts them by. The loop
// writes it out right after a start, but a test that SIGKILLs the daemon
// the moment status shows an instance can come sooner; recovery would
// then, rightly, kill that instance as a stray and start another.
func waitJournaled(t *testing.T, dir string, st apitype.Status) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		recorded := map[int]bool{}
		for _, e := range journalEvents(t, dir) {
			if e.Instance != nil {
				recorded[e.Instance.PID] = true
			}
		}
		missing := 0
		for _, s := range st.Services {
			if s.PID != 0 && !recorded[s.PID] {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d instances' starts not in the journal within 10s", missing)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func allRunning(st apitype.Status) bool {
	for _, s := range st.Services {
		if s.State != "running" || s.PID == 0 {
			return false
		}
	}
	return len(st.Services) > 0
}

func pids(st apitype.Status) map[string]int {
	m := map[string]int{}
	for _, s := range st.Services {
		m[s.Name] = s.PID
	}
	return m
}

// recoveryEvents reads the recovery.stage events from the project's journal, oldest first.
func recoveryEvents(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, e := range journalEvents(t, dir) {
		if e.Topic == event.RecoveryStage {
			out = append(out, e.From+"→"+e.State)
		}
	}
	return out
}

// journalEvents reads the events in the project's journal, oldest first.
func journalEvents(t *testing.T, dir string) []event.Event {
	t.Helper()
	recs, _, err := (&journal.Reader{Dir: filepath.Join(dir, ".vigil", "journal")}).Newest(journal.Query{
		Types: []journal.Type{journal.TypeEvent}})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]event.Event, 0, len(recs))
	for i := len(recs) - 1; i >= 0; i-- {
		var e event.Event
		if json.Unmarshal(recs[i].Payload, &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// TestAdoptedServiceOfAnotherUserStillNotifies: a service that runs as
// another user keeps its own notify socket's path across a daemon SIGKILL;
// the next daemon listens there again, so the adopted instance's
// heartbeats arrive and its watchdog is kept.
func TestAdoptedServiceOfAnotherUserStillNotifies(t *testing.T) {
	t.Parallel()
	notifyBin := needOtherUserNotify(t)
	dir := t.TempDir()
	t.Cleanup(func() { killProject(dir) })
	config := filepath.Join(dir, "vigil.toml")
	toml := fmt.Sprintf(`
[services.other]
command = "%s --ready; while true; do sleep 0.1; %s WATCHDOG=1; done"
user = "nobody"
cwd = "/"
ready = "notify"
watchdog = "500ms"
`, notifyBin, notifyBin)
	if err := os.WriteFile(config, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &client.Client{SocketPath: filepath.Join(dir, ".vigil", "vigil.sock")}
	readyOther := func(st apitype.Status) bool { return len(st.Services) == 1 && st.Services[0].Ready }
	first := runDaemon(t, config, true)
	ready := waitAll(t, c, 10*time.Second, "ready", readyOther)
	pid := ready.Services[0].PID
	waitJournaled(t, dir, ready)
	first.kill(t)
	runDaemon(t, config, true)
	waitAll(t, c, 10*time.Second, "recovered", func(st apitype.Status) bool {
		return st.Daemon.RecoveryStage == "live" && readyOther(st)
	})
	// Several watchdog intervals (and the adoption's grace) later: the same
	// instance, heartbeating.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		st, err := c.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if s := st.Services[0]; s.PID != pid || s.Reason != "adopted" {
			t.Fatalf("the adopted service of another user was not kept: %+v (pid was %d)", s, pid)
		}
		time.Sleep(100 * time.Millisecond)
	}
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if age := st.Services[0].HeartbeatAgeMS; age == nil || *age > 500 {
		t.Fatalf("heartbeat age %v ms; want the adopted instance's heartbeats arriving", age)
	}
}

func TestSIGKILLedDaemonAdoptsEveryService(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	t.Cleanup(func() { killProject(dir) })
	hangFile := filepath.Join(dir, "hang-now")
	var b strings.Builder
	for i := range 22 {
		fmt.Fprintf(&b, "[services.s%02d]\ncommand = [\"sleep\", \"1000\"]\n", i)
	}
	for i := range 3 {
		fmt.Fprintf(&b, "[services.hb%d]\ncommand = [%s, %q]\nready = \"notify\"\nwatchdog = \"300ms\"\nstop_timeout = \"1s\"\nenv = { DAEMON_TEST_HELPER = \"heartbeat-until\" }\n",
			i, selfCommand(t), hangFile+strconv.Itoa(i))
	}
	config := filepath.Join(dir, "vigil.toml")
	if err := os.WriteFile(config, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &client.Client{SocketPath: filepath.Join(dir, ".vigil", "vigil.sock")}

	first := runDaemon(t, config, true)
	running := waitAll(t, c, 30*time.Second, "all running", allRunning)
	before := pids(running)
	waitJournaled(t, dir, running)
	first.kill(t)
	for name, pid := range before {
		if !alive(pid) {
			t.Fatalf("%s (pid %d) died with the daemon", name, pid)
		}
	}

	began := time.Now()
	runDaemon(t, config, true)
	st := waitAll(t, c, 30*time.Second, "recovered", func(st apitype.Status) bool {
		return st.Daemon.RecoveryStage == "live" && allRunning(st)
	})
	t.Logf("SIGKILL → live with %d services: %v", len(st.Services), time.Since(began))
	for _, s := range st.Services {
		if s.PID != before[s.Name] || s.Restarts != 0 || s.Reason != "adopted" {
			t.Errorf("%s: pid %d (was %d), restarts %d, reason %q: not adopted", s.Name, s.PID, before[s.Name], s.Restarts, s.Reason)
		}
		if got := projectPIDs(dir, s.Name); len(got) != 1 {
			t.Errorf("%s has %d processes %v, want exactly its one instance", s.Name, len(got), got)
		}
	}
	want := "crashed→detecting detecting→inventorying inventorying→restoring restoring→reconciling reconciling→live"
	if got := strings.Join(recoveryEvents(t, dir), " "); got != want {
		t.Errorf("journaled recovery: %s\nwant %s", got, want)
	}

	// The adopted watchdogs work: hb1 hangs and is caught, the rest live on.
	if err := os.WriteFile(hangFile+"1", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s := waitAll(t, c, 10*time.Second, "hb1 restarted", func(st apitype.Status) bool {
		for _, s := range st.Services {
			if s.Name == "hb1" {
				return s.PID != 0 && s.PID != before["hb1"] && s.State == "running"
			}
		}
		return false
	})
	for _, sv := range s.Services {
		switch {
		case sv.Name == "hb1" && (sv.LastExit == nil || sv.LastExit.Class != "unresponsive"):
			t.Errorf("hb1 last exit %+v, want unresponsive", sv.LastExit)
		case sv.Name != "hb1" && sv.PID != before[sv.Name]:
			t.Errorf("%s was restarted (pid %d, was %d)", sv.Name, sv.PID, before[sv.Name])
		}
	}
}

// TestUnrecordedInstanceIsKilledInRecovery: a process with the project's
// instance token that no record names (what a daemon killed between a
// fork and its journal write leaves behind) is killed by the next
// daemon's recovery, which journals it; the recorded instance is adopted.
func TestUnrecordedInstanceIsKilledInRecovery(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	t.Cleanup(func() { killProject(dir) })
	config := filepath.Join(dir, "vigil.toml")
	if err := os.WriteFile(config, []byte("[services.web]\ncommand = [\"sleep\", \"1000\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &client.Client{SocketPath: filepath.Join(dir, ".vigil", "vigil.sock")}
	first := runDaemon(t, config, true)
	running := waitAll(t, c, 10*time.Second, "running", allRunning)
	web := running.Services[0].PID
	waitJournaled(t, dir, running)
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", web))
	if err != nil {
		t.Fatal(err)
	}
	var project string
	for kv := range strings.SplitSeq(string(environ), "\x00") {
		if token, ok := strings.CutPrefix(kv, "VIGIL_INSTANCE="); ok {
			project, _, _ = strings.Cut(token, ".")
		}
	}
	if project == "" {
		t.Fatalf("no VIGIL_INSTANCE in the environment of web (pid %d)", web)
	}
	first.kill(t)

	stray := exec.Command("sleep", "1000")
	stray.Env = append(os.Environ(), projectMarker+"="+dir, "VIGIL_SERVICE=web",
		fmt.Sprintf("VIGIL_INSTANCE=%s.%d.999999", project, first.cmd.Process.Pid))
	if err := stray.Start(); err != nil {
		t.Fatal(err)
	}
	strayDone := make(chan error, 1)
	go func() { strayDone <- stray.Wait() }()
	t.Cleanup(func() { stray.Process.Kill(); <-strayDone })

	runDaemon(t, config, true)
	st := waitAll(t, c, 10*time.Second, "recovered", func(st apitype.Status) bool {
		return st.Daemon.RecoveryStage == "live" && allRunning(st)
	})
	if s := st.Services[0]; s.PID != web || s.Reason != "adopted" {
		t.Errorf("web: pid %d (was %d), reason %q: the recorded instance was not adopted", s.PID, web, s.Reason)
	}
	select {
	case <-strayDone:
		strayDone <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatalf("the unrecorded instance (pid %d) still runs 10s after recovery", stray.Process.Pid)
	}
	if got := journalTopics(t, dir, event.RecoveryStray); len(got) != 1 {
		t.Errorf("recovery.stray events %q, want one", got)
	}
	if got := projectPIDs(dir, "web"); len(got) != 1 || got[0] != web {
		t.Errorf("web's processes %v, want only the adopted %d", got, web)
	}
}

func TestRecoveryResumesAfterAKillInEachStage(t *testing.T) {
	t.Parallel()
	for _, stage := range []recovery.Stage{recovery.Detecting, recovery.Inventorying, recovery.Restoring, recovery.Reconciling} {
		t.Run(string(stage), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			t.Cleanup(func() { killProject(dir) })
			config := filepath.Join(dir, "vigil.toml")
			toml := "[services.a]\ncommand = [\"sleep\", \"1000\"]\n[services.b]\ncommand = [\"sleep\", \"1000\"]\ndepends_on = [\"a\"]\n"
			if err := os.WriteFile(config, []byte(toml), 0o600); err != nil {
				t.Fatal(err)
			}
			c := &client.Client{SocketPath: filepath.Join(dir, ".vigil", "vigil.sock")}
			first := runDaemon(t, config, true)
			if _, err := c.Checkpoint(context.Background()); err != nil { // this time a checkpoint holds them
				t.Fatal(err)
			}
			running := waitAll(t, c, 30*time.Second, "all running", allRunning)
			before := pids(running)
			waitJournaled(t, dir, running)
			first.kill(t)

			// The second daemon dies at the fault point, right after
			// persisting that it entered stage.
			faulty := runDaemon(t, config, false, daemon.FaultEnv+"="+string(stage))
			if err := faulty.wait(t); err == nil || !strings.Contains(err.Error(), "killed") {
				t.Fatalf("daemon with a fault at %s: %v", stage, err)
			}
			st, ok, err := (&recovery.Store{Dir: filepath.Join(dir, ".vigil")}).Load()
			if err != nil || !ok || st.Stage != stage || st.Attempt != 1 {
				t.Fatalf("persisted recovery after the kill: %+v, %v, %v", st, ok, err)
			}

			runDaemon(t, config, true)
			got := waitAll(t, c, 30*time.Second, "recovered", func(st apitype.Status) bool {
				return st.Daemon.RecoveryStage == "live" && allRunning(st)
			})
			for name, pid := range pids(got) {
				if pid != before[name] {
					t.Errorf("%s: pid %d, was %d: restarted instead of adopted", name, pid, before[name])
				}
			}
			events := recoveryEvents(t, dir)
			resumed := fmt.Sprintf("%s→%s", stage, stage) // the interrupted attempt, run again
			if !strings.Contains(strings.Join(events, " "), resumed) || events[len(events)-1] != "reconciling→live" {
				t.Errorf("journaled recovery %v: want the resumed %s and the end at live", events, resumed)
			}
			if _, ok, _ := (&recovery.Store{Dir: filepath.Join(dir, ".vigil")}).Load(); ok {
				t.Error("recovery state still on disk after reaching live")
			}
		})
	}
}

// diedState makes the state dir of a project in dir whose daemon died: a
// journal with a start and no clean stop. It returns the state dir.
func diedState(t *testing.T, dir string) string {
	t.Helper()
	state := filepath.Join(dir, ".vigil")
	if err := daemon.MakeStateDir(state); err != nil {
		t.Fatal(err)
	}
	j, err := journal.Open(journal.Options{Dir: filepath.Join(state, "journal")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Write(journal.TypeEvent, []byte(`{"topic":"daemon.started","time":"2026-01-01T00:00:00Z"}`)); err != nil {
		t.Fatal(err)
	}
	j.Close()
	return state
}

// recoverFrom writes prev as the checkpoint of the dead daemon of the
// project in dir (see diedState) and toml as its config, starts a daemon,
// and returns its client and its status once it has recovered.
func recoverFrom(t *testing.T, dir string, prev *checkpoint.State, toml string) (*client.Client, apitype.Status) {
	t.Helper()
	state := filepath.Join(dir, ".vigil")
	if _, err := (&checkpoint.Store{Dir: state}).Write(prev); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "vigil.toml")
	if err := os.WriteFile(config, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	runDaemon(t, config, true)
	c := &client.Client{SocketPath: filepath.Join(state, "vigil.sock")}
	return c, waitAll(t, c, 30*time.Second, "recovered", func(st apitype.Status) bool {
		return st.Daemon.RecoveryStage == "live" && allRunning(st)
	})
}

// TestReusedPidIsNotAdopted: the checkpoint names an instance whose pid
// now belongs to an unrelated process (another start time). Recovery must
// neither adopt nor kill that process, records the instance as lost, and
// starts the service anew.
func TestReusedPidIsNotAdopted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	t.Cleanup(func() { killProject(dir) })
	stranger := exec.Command("sleep", "1000")
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stranger.Process.Kill(); stranger.Wait() })
	id, err := proc.ReadIdentity(stranger.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// A previous daemon that died: its journal has no clean stop, its
	// checkpoint lists web at the stranger's pid with the old start time.
	state := diedState(t, dir)
	old := checkpoint.Instance{PID: id.PID, StartTime: id.StartTime - 1, PGID: id.PID, StartedAt: time.Now().Add(-time.Minute),
		Token: "of-the-dead-instance", Leases: []string{"job-9"}}
	_, st := recoverFrom(t, dir, &checkpoint.State{Services: []checkpoint.Service{
		{Name: "web", Desired: checkpoint.DesiredRunning, Instance: &old}}}, "[services.web]\ncommand = [\"sleep\", \"1000\"]\n")
	if web := st.Services[0]; web.PID == id.PID || web.Reason == "adopted" {
		t.Fatalf("web adopted the stranger: %+v", web)
	}
	if !id.Alive() {
		t.Fatal("recovery killed an unrelated process that had the dead instance's pid")
	}
	recs, _, _ := (&journal.Reader{Dir: filepath.Join(state, "journal")}).Newest(journal.Query{Types: []journal.Type{journal.TypeCrash}})
	if len(recs) != 1 || !strings.Contains(string(recs[0].Payload), `"class":"lost"`) || !strings.Contains(string(recs[0].Payload), `"job-9"`) {
		t.Fatalf("crash records: %d; want the dead instance recorded as lost with its lease", len(recs))
	}
}

// TestAnotherBootsStateIsNotTrusted: the checkpoint is of an earlier boot
// (the machine lost power, and the daemon came back within max_age). Its
// instance and its session name a live process here by the very pid and
// start time they had then — early-boot processes get much the same ones
// every boot. Recovery must neither adopt nor signal that process or its
// group: the instance is recorded as lost with its leases, the session is
// removed, and the service starts anew. A session of this boot that only
// the checkpoint holds (registered long before it) is kept.
func TestAnotherBootsStateIsNotTrusted(t *testing.T) {
	t.Parallel()
	if proc.Boot() == "" {
		t.Skip("no boot id on this kernel")
	}
	dir := t.TempDir()
	t.Cleanup(func() { killProject(dir) })
	stranger := exec.Command("sleep", "1000")
	stranger.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-stranger.Process.Pid, syscall.SIGKILL); stranger.Wait() })
	id, err := proc.ReadIdentity(stranger.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	state := diedState(t, dir)
	const before = "00000000-0000-4000-8000-000000000000"
	old := checkpoint.Instance{PID: id.PID, StartTime: id.StartTime, PGID: id.PID, StartedAt: time.Now().Add(-time.Minute),
		Token: "of-the-dead-instance", Leases: []string{"job-9"}, Boot: before}
	session := registry.Session{ID: "0123456789abcdef", Name: "agent", PID: id.PID, StartTime: id.StartTime, Boot: before,
		Groups: []registry.Group{{PGID: id.PID, LeaderStart: id.StartTime}}, Heartbeat: time.Second, StaleAfter: time.Hour,
		RegisteredAt: time.Now().Add(-time.Minute), LastSeen: time.Now().Add(-time.Minute)}
	self, err := proc.ReadIdentity(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	kept := registry.Session{ID: "fedcba9876543210", Name: "kept", PID: self.PID, StartTime: self.StartTime, Boot: self.Boot,
		Heartbeat: time.Second, StaleAfter: time.Hour, RegisteredAt: time.Now().Add(-time.Hour), LastSeen: time.Now()}
	c, st := recoverFrom(t, dir, &checkpoint.State{Services: []checkpoint.Service{
		{Name: "web", Desired: checkpoint.DesiredRunning, Instance: &old}}, Sessions: []registry.Session{session, kept}},
		"[sessions]\ncleanup_period = \"50ms\"\n[services.web]\ncommand = [\"sleep\", \"1000\"]\n")
	if web := st.Services[0]; web.PID == id.PID || web.Reason == "adopted" {
		t.Fatalf("web adopted a process of this boot for one of the last: %+v", web)
	}
	sessions, err := c.Sessions(context.Background())
	if err != nil || len(sessions) != 1 || sessions[0].ID != kept.ID {
		t.Fatalf("sessions after recovery: %+v, %v; want this boot's kept and the last boot's removed", sessions, err)
	}
	// A cleanup of its own, besides the periodic ones, before looking.
	if _, err := c.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !id.Alive() {
		t.Fatal("recovery signalled a process of this boot that had the pid and start time of the last boot's instance")
	}
	recs, _, _ := (&journal.Reader{Dir: filepath.Join(state, "journal")}).Newest(journal.Query{Types: []journal.Type{journal.TypeCrash}})
	if len(recs) != 1 || !strings.Contains(string(recs[0].Payload), `"class":"lost"`) ||
		!strings.Contains(string(recs[0].Payload), `"job-9"`) || !strings.Contains(string(recs[0].Payload), "previous boot") {
		t.Fatalf("crash records: %d; want the instance recorded as lost with the previous boot and its lease", len(recs))
	}
	removed, _, _ := (&journal.Reader{Dir: filepath.Join(state, "journal")}).Newest(journal.Query{
		Match: func(r journal.Record) bool { return strings.Contains(string(r.Payload), `"reason":"rebooted"`) }})
	if len(removed) != 1 {
		t.Fatalf("%d session.removed records for the rebooted session; want 1", len(removed))
	}
}

// TestThirdDaemonCrashMeansSafeMode: with three daemon crashes in the
// window on the guardian's record, the next daemon runs essential services
// only and says so; safe-mode exit brings the rest back.
func TestThirdDaemonCrashMeansSafeMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	state := filepath.Join(dir, ".vigil")
	if err := daemon.MakeStateDir(state); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	history := fmt.Sprintf(`{"crashes":[{"at":%q,"pid":1,"code":2,"reason":"exited"},{"at":%q,"pid":2,"code":0,"signal":"SIGKILL","reason":"signal"},{"at":%q,"pid":3,"code":2,"reason":"exited"}]}`,
		now.Add(-50*time.Second).Format(time.RFC3339Nano), now.Add(-20*time.Second).Format(time.RFC3339Nano), now.Add(-time.Second).Format(time.RFC3339Nano))
	if err := os.WriteFile(filepath.Join(state, daemon.HistoryFile), []byte(history), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProjectIn(t, dir, `
[services.db]
command = ["sleep", "1000"]
essential = true
[services.web]
command = ["sleep", "1000"]
depends_on = ["db"]
`, nil)
	p.waitFor("db", 10*time.Second, "running", running)
	st := p.status()
	if !st.Daemon.SafeMode || st.Services[1].State != "stopped" {
		t.Fatalf("after three crashes in 60s: safe mode %v, web %s", st.Daemon.SafeMode, st.Services[1].State)
	}
	if err := p.c.SetSafeMode(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	p.waitFor("web", 10*time.Second, "running", running)
	if p.status().Daemon.SafeMode {
		t.Fatal("still in safe mode after safe-mode exit")
	}
	if err := p.c.SetSafeMode(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	p.waitFor("web", 10*time.Second, "stopped", func(s apitype.Service) bool { return s.State == "stopped" })
	p.waitFor("db", time.Second, "running", running)
}

// TestUnderSystemd: run under a Type=notify supervisor (NOTIFY_SOCKET and
// WATCHDOG_USEC set), the daemon says READY=1 once up, sends WATCHDOG=1
// at half the interval, and STOPPING=1 on its way down.
func TestUnderSystemd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	t.Cleanup(func() { killProject(dir) })
	sock := filepath.Join(dir, "systemd.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	config := filepath.Join(dir, "vigil.toml")
	if err := os.WriteFile(config, []byte("[services.web]\ncommand = [\"sleep\", \"1000\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := runDaemon(t, config, true, "NOTIFY_SOCKET="+sock, "WATCHDOG_USEC=100000")
	msgs := make(chan string, 100)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case m := <-msgs:
			return m
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s from the daemon within 10s", what)
			return ""
		}
	}
	if m := next("READY"); m != "READY=1\nSTATUS=supervising 1 services" {
		t.Fatalf("first message %q", m)
	}
	began := time.Now()
	for range 5 {
		if m := next("WATCHDOG"); m != "WATCHDOG=1" {
			t.Fatalf("watchdog message %q", m)
		}
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("5 heartbeats took %v for a 100ms watchdog", took)
	}
	d.stop(t)
	for {
		m := next("STOPPING")
		if m == "STOPPING=1" {
			break
		}
		if m != "WATCHDOG=1" {
			t.Fatalf("message %q while stopping", m)
		}
	}
}

// TestDamagedRecoveryStateIsSetAside: a recovery.json that does not parse
// is kept as .broken and the recovery starts afresh instead of failing.
func TestDamagedRecoveryStateIsSetAside(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	state := filepath.Join(dir, ".vigil")
	if err := daemon.MakeStateDir(state); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, recovery.FileName), []byte(`{"stage":"restor`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProjectIn(t, dir, "[services.web]\ncommand = [\"sleep\", \"1000\"]\n", nil)
	p.waitFor("web", 10*time.Second, "running", running)
	if st := p.status().Daemon.RecoveryStage; st != "live" {
		t.Fatalf("recovery stage %q", st)
	}
	if b, err := os.ReadFile(filepath.Join(state, recovery.FileName+".broken")); err != nil || string(b) != `{"stage":"restor` {
		t.Fatalf("damaged state not kept aside: %q, %v", b, err)
	}
	if events := recoveryEvents(t, dir); len(events) == 0 || events[len(events)-1] != "reconciling→live" {
		t.Fatalf("recovery after setting the damaged state aside: %v", events)
	}
}

// hookProject is a worker that claims task-7 and crashes on demand, with
// an on_crash hook that saves what it was given, one file per crash, after
// waiting for the file "release" when hold is set.
func hookProject(t *testing.T, dir string, hold bool) string {
	t.Helper()
	wait := ""
	if hold {
		wait = `echo $$ > hook-pid-$VIGIL_CRASH_SEQ; while [ ! -f release ]; do sleep 0.01; done; `
	}
	toml := fmt.Sprintf(`
[services.worker]
command = [%s, %q]
env = { DAEMON_TEST_HELPER = "lease-then-crash" }
on_crash = '%scat > hook-$VIGIL_CRASH_SEQ.json; env | grep ^VIGIL_ | sort > hook-$VIGIL_CRASH_SEQ.env'
[services.worker.backoff]
initial = "10ms"
`, selfCommand(t), filepath.Join(dir, "crash-now"), wait)
	config := filepath.Join(dir, "vigil.toml")
	if err := os.WriteFile(config, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	return config
}

// crashWithLease waits until the worker holds task-7, then makes it crash.
func crashWithLease(t *testing.T, c *client.Client, dir string) {
	t.Helper()
	waitAll(t, c, 10*time.Second, "worker holding task-7", func(st apitype.Status) bool {
		s := st.Services[0]
		return s.State == "running" && len(s.Leases) == 1 && s.Leases[0] == "task-7"
	})
	if err := os.WriteFile(filepath.Join(dir, "crash-now"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// hookRuns lists the crash sequence numbers the hook saved a record for.
func hookRuns(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, "hook-*.json"))
	var out []string
	for _, f := range m {
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "hook-"), ".json"))
	}
	return out
}

func waitFile(t *testing.T, path string, timeout time.Duration) []byte {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written within %v", path, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestOnCrashHookGetsTheLeases(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	t.Cleanup(func() { killProject(dir) })
	config := hookProject(t, dir, false)
	runDaemon(t, config, true)
	c := &client.Client{SocketPath: filepath.Join(dir, ".vigil", "vigil.sock")}
	for round := 1; round <= 2; round++ {
		crashWithLease(t, c, dir)
		waitAll(t, c, 10*time.Second, "hooks run", func(apitype.Status) bool { return len(hookRuns(dir)) == round })
	}
	for _, seq := range hookRuns(dir) {
		var crash apitype.Crash
		b := waitFile(t, filepath.Join(dir, "hook-"+seq+".env"), 10*time.Second)
		if err := json.Unmarshal(waitFile(t, filepath.Join(dir, "hook-"+seq+".json"), time.Second), &crash); err != nil {
			t.Fatal(err)
		}
		if crash.Service != "worker" || crash.Exit.Class != "exit_code" || len(crash.Leases) != 1 || crash.Leases[0] != "task-7" ||
			fmt.Sprint(crash.Hooks) != "[on_crash]" || strconv.FormatUint(crash.Seq, 10) != seq {
			t.Errorf("hook stdin: %+v", crash)
		}
		env := string(b)
		for _, want := range []string{"VIGIL_CLASS=exit_code\n", "VIGIL_EXIT_CODE=3\n", "VIGIL_HOOK=on_crash\n",
			"VIGIL_LEASES=task-7\n", "VIGIL_SERVICE=worker\n", "VIGIL_SIGNAL=\n", "VIGIL_CRASH_SEQ=" + seq + "\n"} {
			if !strings.Contains(env, want) {
				t.Errorf("hook environment lacks %q:\n%s", want, env)
			}
		}
	}
	// Exactly once per crash: two crashes, two runs, two hook.finished records.
	waitAll(t, c, 10*time.Second, "both hook runs journaled", func(apitype.Status) bool {
		return len(journalTopics(t, dir, event.HookFinished)) >= 2
	})
	if finished := journalTopics(t, dir, event.HookFinished); len(finished) != 2 || len(hookRuns(dir)) != 2 {
		t.Fatalf("hook.finished %v, runs %v", finished, hookRuns(dir))
	}
}

// TestHookDueWhenTheDaemonDiedRunsAfterRecovery: the daemon is SIGKILLed
// while the hook for a crash runs (and the hook with it); the next daemon
// runs it again, since no hook.finished records it.
func TestHookDueWhenTheDaemonDiedRunsAfterRecovery(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	t.Cleanup(func() { killProject(dir) })
	config := hookProject(t, dir, true)
	first := runDaemon(t, config, true)
	c := &client.Client{SocketPath: filepath.Join(dir, ".vigil", "vigil.sock")}
	crashWithLease(t, c, dir)
	pidFiles := func() []string { m, _ := filepath.Glob(filepath.Join(dir, "hook-pid-*")); return m }
	deadline := time.Now().Add(10 * time.Second)
	for len(pidFiles()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the hook did not start within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	hookPID, _ := strconv.Atoi(strings.TrimSpace(string(waitFile(t, pidFiles()[0], time.Second))))
	first.kill(t)
	syscall.Kill(hookPID, syscall.SIGKILL) // the run in progress dies with its daemon
	os.Remove(pidFiles()[0])

	runDaemon(t, config, true)
	deadline = time.Now().Add(10 * time.Second)
	for len(pidFiles()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the next daemon did not run the unfinished hook within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitAll(t, c, 10*time.Second, "hook finished", func(apitype.Status) bool { return len(journalTopics(t, dir, event.HookFinished)) == 1 })
	runs := hookRuns(dir)
	if len(runs) != 1 {
		t.Fatalf("hook runs %v", runs)
	}
	if b := waitFile(t, filepath.Join(dir, "hook-"+runs[0]+".json"), time.Second); !strings.Contains(string(b), `"leases":["task-7"]`) {
		t.Fatalf("the late hook's record: %s", b)
	}
}

// journalTopics returns the messages of the journal's events of topic.
func journalTopics(t *testing.T, dir string, topic event.Topic) []string {
	t.Helper()
	var out []string
	for _, e := range journalEvents(t, dir) {
		if e.Topic == topic {
			out = append(out, e.Message)
		}
	}
	return out
}
