package guardian

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary doubles as every process the tests need: TestMain runs the
// role named by GUARDIAN_TEST_MODE instead of the tests.
//
//	guardian    runs Run with the testConfig in GUARDIAN_TEST_CONFIG, printing
//	            "started <pid> <unixnano>" from OnStart and "run-ok" or
//	            "run-error <err>" at the end; SIGUSR1 cancels its ctx.
//	daemon      a fake daemon; the n-th one started plays testConfig.Seq[n]
//	            (the last entry repeats), see daemonMain.
//	grandchild  a process a daemon leaves behind, see grandchildMain.
//
// Every line goes to stdout, which the test reads; every process carries the
// test's GT_TOKEN in its environment so the cleanup can find and kill all of
// them, whoever their parent has become.
func TestMain(m *testing.M) {
	switch os.Getenv("GUARDIAN_TEST_MODE") {
	case "":
		os.Exit(m.Run())
	case "guardian":
		os.Exit(guardianMain())
	case "daemon":
		os.Exit(daemonMain())
	case "grandchild":
		os.Exit(grandchildMain())
	}
	os.Exit(99)
}

type testConfig struct {
	Seq      []string
	Counter  string // file counting daemon starts
	History  string
	Path     string // daemon executable; "" means this test binary
	Interval time.Duration
	Timeout  time.Duration
	Delay    time.Duration
	Extra    int  // how many extra files the guardian got (fds 3, …) and passes on as ExtraFiles
	Once     bool // ExtraFilesOnce

	extraFiles []*os.File // the test's files behind Extra; not in the JSON
}

func loadConfig() testConfig {
	var c testConfig
	if err := json.Unmarshal([]byte(os.Getenv("GUARDIAN_TEST_CONFIG")), &c); err != nil {
		fmt.Printf("bad config: %v\n", err)
		os.Exit(98)
	}
	return c
}

// modeEnv is the environment with GUARDIAN_TEST_MODE set to mode. Helpers
// built with -race would otherwise sleep a second before every exit.
func modeEnv(mode string, extra ...string) []string {
	env := []string{"GUARDIAN_TEST_MODE=" + mode, "GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GUARDIAN_TEST_MODE=") && !strings.HasPrefix(kv, "GORACE=") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

func say(format string, args ...any) {
	os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n") // one write: lines never interleave
}

func guardianMain() int {
	c := loadConfig()
	path := c.Path
	if path == "" {
		path, _ = os.Executable()
	}
	var extra []*os.File
	for i := range c.Extra {
		extra = append(extra, os.NewFile(uintptr(3+i), "extra"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGUSR1)
	defer stop()
	err := Run(ctx, Options{
		Path:              path,
		Env:               modeEnv("daemon", "GT_GUARDIAN_PID="+strconv.Itoa(os.Getpid())),
		Stdout:            os.Stdout,
		Stderr:            os.Stderr,
		ExtraFiles:        extra,
		ExtraFilesOnce:    c.Once,
		HeartbeatInterval: c.Interval,
		HeartbeatTimeout:  c.Timeout,
		RestartDelay:      c.Delay,
		HistoryPath:       c.History,
		OnStart:           func(pid int) { say("started %d %d", pid, time.Now().UnixNano()) },
		Logf:              func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
	})
	if err != nil {
		say("run-error %v", err)
		return 1
	}
	say("run-ok")
	return 0
}

// daemonMain is the fake daemon. Behaviours:
//
//	crash   send 3 heartbeats, exit 3
//	nobye   send a heartbeat, exit 0 without "bye"
//	clean   send "bye", exit 0
//	hang    send a heartbeat, print "hung <unixnano>", then never send another
//	serve   heartbeat; print "ready <pid>", each orphan exit it receives as
//	        "recv exit <pid> <status>", "got SIGHUP" on SIGHUP, and on
//	        SIGTERM/SIGINT "got <sig>", then "bye" and exit 0
//	orphan  start two grandchildren that outlive it ("orphan-a <pid>" exits 7
//	        when this daemon dies, "orphan-b <pid>" exits 7 on SIGUSR1), exit 1
//	stop-hang
//	        start a grandchild that outlives it ("orphan-svc <pid>", its
//	        service), send "stopping", print "stopping", then hang
//	nostart exit ExitNoRestart, as a daemon that cannot start does
//	ready-then-crash
//	        write "ok" to fd 3, print fd3Line, exit 3
//	null-fd3
//	        write "x" to fd 3, print fd3Line, then serve
func daemonMain() int {
	// Never outlive the guardian, even if the test dies before its cleanup.
	unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0)
	if strconv.Itoa(os.Getppid()) != os.Getenv("GT_GUARDIAN_PID") {
		return 97
	}
	c := loadConfig()
	f, err := os.OpenFile(c.Counter, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		say("daemon-error %v", err)
		return 96
	}
	st, _ := f.Stat()
	f.Write([]byte("x"))
	f.Close()
	behaviour := c.Seq[min(int(st.Size()), len(c.Seq)-1)]

	linkFD := os.Getenv(EnvFD) // Attach unsets it
	l, err := Attach()
	if err != nil || l == nil {
		say("attach-error %v %v", l, err)
		return 95
	}
	if os.Getenv(EnvFD) != "" || l.Interval() != c.Interval {
		say("attach-error env %q interval %v", os.Getenv(EnvFD), l.Interval())
		return 94
	}
	switch behaviour {
	case "crash":
		for range 3 {
			l.Beat()
		}
		return 3
	case "nobye":
		l.Beat()
		return 0
	case "clean":
		l.Bye()
		return 0
	case "hang":
		l.Beat()
		say("hung %d", time.Now().UnixNano())
		for {
			time.Sleep(time.Hour)
		}
	case "serve":
		return serve(l)
	case "orphan":
		startGrandchild("a", syscall.SIGUSR1)
		startGrandchild("b", 0)
		return 1
	case "stop-hang":
		startGrandchild("svc", 0)
		l.Beat()
		l.Stopping()
		say("stopping")
		for {
			time.Sleep(time.Hour)
		}
	case "nostart":
		return ExitNoRestart
	case "ready-then-crash":
		say("%s", fd3Line("ok", linkFD))
		return 3
	case "null-fd3":
		say("%s", fd3Line("x", linkFD))
		return serve(l)
	}
	say("unknown behaviour %q", behaviour)
	return 93
}

// serve heartbeats; prints "ready <pid>", each orphan exit it receives as
// "recv exit <pid> <status>", "got SIGHUP" on SIGHUP, and on SIGTERM/SIGINT
// "got <sig>", then sends "bye" and returns 0.
func serve(l *Link) int {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go l.Heartbeat(context.Background(), 0)
	say("ready %d", os.Getpid())
	for {
		select {
		case e := <-l.Exits():
			say("recv exit %d %d", e.PID, uint32(e.Status))
		case s := <-sigs:
			say("got %s", unix.SignalName(s.(syscall.Signal)))
			if s != syscall.SIGHUP {
				l.Bye()
				return 0
			}
		}
	}
}

// fd3Line writes data to fd 3 and describes fd 3 and the link's fd as
// "fd3 <readlink of fd 3> null=<is it the null device> link=<EnvFD> write=<ok or the error>".
func fd3Line(data, linkFD string) string {
	target, err := os.Readlink("/proc/self/fd/3")
	if err != nil {
		target = "none"
	}
	var st, null unix.Stat_t
	isNull := unix.Fstat(3, &st) == nil && unix.Stat(os.DevNull, &null) == nil &&
		st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == null.Rdev
	wrote := "ok"
	if _, err := unix.Write(3, []byte(data)); err != nil {
		wrote = strings.ReplaceAll(err.Error(), " ", "_")
	}
	return fmt.Sprintf("fd3 %s null=%v link=%s write=%s", target, isNull, linkFD, wrote)
}

// startGrandchild starts a grandchild and waits until it can take SIGUSR1.
func startGrandchild(name string, pdeathsig syscall.Signal) {
	r, w, err := os.Pipe()
	if err != nil {
		panic(err)
	}
	exe, _ := os.Executable()
	cmd := exec.Command(exe)
	cmd.Env = modeEnv("grandchild")
	cmd.Stdout = os.Stdout
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: pdeathsig}
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	w.Close()
	outer, _ := io.ReadAll(r)
	say("orphan-%s %d %s", name, cmd.Process.Pid, outer)
}

// grandchildMain writes its pid as the test sees it (/proc is the test's) to
// fd 3 once it can take SIGUSR1, then exits 7 on SIGUSR1.
func grandchildMain() int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR1)
	self, _ := os.Readlink("/proc/self")
	ready := os.NewFile(3, "ready")
	ready.WriteString(self)
	ready.Close()
	<-sigs
	return 7
}

// gproc is a guardian started by a test, with the lines it and its daemons
// printed.
type gproc struct {
	cmd    *exec.Cmd
	errLog string
	exited chan struct{}
	code   int

	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced whenever lines grows
}

// startGuardian runs the guardian helper with c. When the test ends it
// kills every process that carries the test's token and logs the
// guardian's stderr if the test failed.
func startGuardian(t *testing.T, c testConfig) *gproc {
	t.Helper()
	return startGuardianAttr(t, c, &syscall.SysProcAttr{Setpgid: true})
}

func startGuardianAttr(t *testing.T, c testConfig, attr *syscall.SysProcAttr) *gproc {
	t.Helper()
	dir := t.TempDir()
	c.Counter = filepath.Join(dir, "counter")
	c.Extra = len(c.extraFiles)
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second // a daemon built with -race can take a while to start
	}
	cfg, _ := json.Marshal(c)
	token := make([]byte, 8)
	rand.Read(token)
	tok := hex.EncodeToString(token)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	g := &gproc{cmd: exec.Command(exe), errLog: stderr.Name(), exited: make(chan struct{}), changed: make(chan struct{})}
	g.cmd.Env = modeEnv("guardian", "GUARDIAN_TEST_CONFIG="+string(cfg), "GT_TOKEN="+tok)
	g.cmd.Stdout, g.cmd.Stderr = w, stderr
	g.cmd.ExtraFiles = c.extraFiles
	g.cmd.SysProcAttr = attr
	if err := g.cmd.Start(); err != nil {
		if attr.Cloneflags&syscall.CLONE_NEWPID != 0 && errors.Is(err, syscall.EPERM) {
			t.Skipf("cannot create a pid namespace here: %v", err)
		}
		t.Fatal(err)
	}
	w.Close()
	stderr.Close()
	go func() {
		g.cmd.Wait()
		g.code = g.cmd.ProcessState.ExitCode()
		close(g.exited)
	}()
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			g.mu.Lock()
			g.lines = append(g.lines, sc.Text())
			close(g.changed)
			g.changed = make(chan struct{})
			g.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		g.cmd.Process.Kill()
		<-g.exited
		killTagged(t, "GT_TOKEN="+tok)
		r.Close()
		if t.Failed() {
			b, _ := os.ReadFile(g.errLog)
			g.mu.Lock()
			t.Logf("guardian stdout:\n%s\nguardian stderr:\n%s", strings.Join(g.lines, "\n"), b)
			g.mu.Unlock()
		}
	})
	return g
}

const waitLimit = 15 * time.Second

// waitLines waits until n lines start with prefix and returns their fields.
func (g *gproc) waitLines(t *testing.T, prefix string, n int) [][]string {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		g.mu.Lock()
		var found [][]string
		for _, l := range g.lines {
			if strings.HasPrefix(l, prefix) {
				found = append(found, strings.Fields(l))
			}
		}
		changed := g.changed
		g.mu.Unlock()
		if len(found) >= n {
			return found[:n]
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %d lines starting with %q within %v", n, prefix, waitLimit)
		}
	}
}

func (g *gproc) waitLine(t *testing.T, prefix string) []string {
	t.Helper()
	return g.waitLines(t, prefix, 1)[0]
}

func (g *gproc) count(prefix string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, l := range g.lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// waitExit waits for the guardian to exit and returns its exit code.
func (g *gproc) waitExit(t *testing.T) int {
	t.Helper()
	select {
	case <-g.exited:
		return g.code
	case <-time.After(waitLimit):
		t.Fatalf("guardian did not exit within %v", waitLimit)
		return -1
	}
}

func (g *gproc) signal(t *testing.T, s syscall.Signal) {
	t.Helper()
	if err := g.cmd.Process.Signal(s); err != nil {
		t.Fatal(err)
	}
}

// killTagged SIGKILLs every process whose environment holds tag until none
// is left.
func killTagged(t *testing.T, tag string) {
	deadline := time.Now().Add(waitLimit)
	for {
		pids := tagged(tag)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("processes %v survive the cleanup", pids)
			return
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// tagged lists the live (not zombie) processes whose environment holds tag.
func tagged(tag string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || procState(pid) == "Z" || procState(pid) == "" {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		for _, kv := range bytes.Split(env, []byte{0}) {
			if string(kv) == tag {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// procState is the state letter in /proc/pid/stat, "" if there is no such
// process.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+3 > len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// waitGone waits until pid no longer exists, not even as a zombie.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for procState(pid) != "" {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still exists (state %q) after %v", pid, procState(pid), waitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
