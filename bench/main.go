// Command bench measures vigil from the outside, the way a user's machine
// sees it: it builds the binary, runs real daemons on generated projects, and
// times them with the kernel's process-events connector (fork, exec and exit
// stamped by the kernel), /proc/PID/smaps_rollup and per-thread schedstat.
// It needs root (the proc connector does).
//
//	go run ./bench                # every scenario
//	go run ./bench -only restart  # one of: restart, sigkill, scale, notify, crashes, checkpoint, recover, sessions, hook
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

var (
	only      = flag.String("only", "", "run one scenario: restart, sigkill, scale, notify, crashes, checkpoint, recover, sessions, hook")
	samples   = flag.Int("n", 300, "restarts measured in the restart and sigkill scenarios")
	services  = flag.Int("services", 1000, "services in the scale, notify, checkpoint and recover scenarios")
	idle      = flag.Duration("idle", 30*time.Second, "idle window for the CPU measurement")
	records   = flag.Int("records", 1_000_000, "journal records in the crashes scenario")
	killsFlag = flag.Int("kills", 0, "daemon SIGKILLs in the recover scenario; 0: 10 with up to 100 services, else 5")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	work, err := os.MkdirTemp("", "vigil-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "vigil")
	build := exec.Command("go", "build", "-o", bin, "./cmd/vigil")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building vigil: %w", err)
	}
	machine()
	for _, sc := range []struct {
		name string
		f    func(bin, dir string) error
	}{{"restart", restartLatency}, {"sigkill", sigkillLatency}, {"scale", scale}, {"notify", notifyScenario},
		{"crashes", crashesScenario}, {"checkpoint", checkpointScenario}, {"sessions", sessionsScenario}, {"hook", hookScenario}, {"recover", recoverScenario}} {
		if *only != "" && *only != sc.name {
			continue
		}
		dir := filepath.Join(work, sc.name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		if err := sc.f(bin, dir); err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
	}
	return nil
}

func machine() {
	var u unix.Utsname
	_ = unix.Uname(&u)
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	n, _ := exec.Command("nproc").Output()
	fmt.Printf("machine: nproc=%s kernel=%s cpu=%q\n", strings.TrimSpace(string(n)), unix.ByteSliceToString(u.Release[:]), cpu)
}

// daemon is a vigil daemon started with `up -d` on a generated project.
type daemon struct {
	bin, config string
	pid         int
	ev          *procEvents
	children    map[int]bool // forked by the daemon
}

func startDaemon(bin, dir, toml string, ev *procEvents) (*daemon, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "vigil.toml")
	if err := os.WriteFile(cfg, []byte(toml), 0o644); err != nil {
		return nil, err
	}
	d := &daemon{bin: bin, config: cfg, ev: ev, children: map[int]bool{}}
	out, err := exec.Command(bin, "-c", cfg, "up", "-d").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("vigil up -d: %v: %s", err, out)
	}
	st, err := d.status()
	if err != nil {
		return nil, err
	}
	d.pid = st.Daemon.PID
	return d, nil
}

// startWatched starts a daemon for toml (see startDaemon) with the
// kernel's process events open; stop takes it down and closes them.
func startWatched(bin, dir, toml string) (d *daemon, stop func(), err error) {
	ev, err := openProcEvents()
	if err != nil {
		return nil, nil, err
	}
	if d, err = startDaemon(bin, dir, toml, ev); err != nil {
		ev.Close()
		return nil, nil, err
	}
	return d, func() { d.down(); ev.Close() }, nil
}

type status struct {
	Daemon struct {
		PID    int `json:"pid"`
		Notify struct {
			Socket   string            `json:"socket"`
			Accepted uint64            `json:"accepted"`
			Dropped  map[string]uint64 `json:"dropped"`
		} `json:"notify"`
	} `json:"daemon"`
	Services []struct {
		Name  string `json:"name"`
		State string `json:"state"`
		PID   int    `json:"pid"`
	} `json:"services"`
}

func (d *daemon) status() (status, error) {
	var st status
	out, err := exec.Command(d.bin, "-c", d.config, "status", "--json").Output()
	if err != nil {
		return st, fmt.Errorf("vigil status: %w", err)
	}
	return st, json.Unmarshal(out, &st)
}

// waitAllRunning waits until every service runs: the API answers while a
// large start is still spawning.
func (d *daemon) waitAllRunning(timeout time.Duration) (status, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, err := d.status()
		if err != nil {
			return st, err
		}
		running := 0
		for _, s := range st.Services {
			if s.State == "running" && s.PID != 0 {
				running++
			}
		}
		if running == len(st.Services) {
			return st, nil
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("%d of %d services running after %v", running, len(st.Services), timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (d *daemon) down() error {
	out, err := exec.Command(d.bin, "-c", d.config, "down").CombinedOutput()
	if err != nil {
		return fmt.Errorf("vigil down: %v: %s", err, out)
	}
	return nil
}

// next returns the next process event, remembering every process the
// daemon forks as one of its children.
func (d *daemon) next() (procEvent, error) {
	e, err := d.ev.next()
	if err == nil && e.What == procEventFork && e.Parent == d.pid {
		d.children[e.PID] = true
	}
	return e, err
}

// nextExecOfChild waits for the next exec after the instant after by a
// process the daemon forked, returning its pid and the kernel's timestamp.
// Events from before after (still queued on the socket) are skipped.
func (d *daemon) nextExecOfChild(after uint64, deadline time.Time) (int, uint64, error) {
	for time.Now().Before(deadline) {
		e, err := d.next()
		if err != nil {
			return 0, 0, err
		}
		switch e.What {
		case procEventExec:
			if d.children[e.PID] && e.TS > after {
				return e.PID, e.TS, nil
			}
		}
	}
	return 0, 0, errors.New("timed out waiting for a service exec")
}

func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

func percentiles(name string, ds []time.Duration) {
	slices.Sort(ds)
	p := func(q float64) time.Duration { return ds[int(q*float64(len(ds)-1))] }
	fmt.Printf("%s: n=%d p50=%.3fms p90=%.3fms p99=%.3fms max=%.3fms\n", name, len(ds),
		ms(p(0.5)), ms(p(0.9)), ms(p(0.99)), ms(ds[len(ds)-1]))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// restartLatency: a service that exits 1 at once, zero backoff, breaker off:
// time from the kernel's exit of one instance to the exec of the next.
func restartLatency(bin, dir string) error {
	d, stop, err := startWatched(bin, dir, `
[services.crash]
command = ["/bin/false"]
restart = "always"
[services.crash.backoff]
initial = "0s"
[services.crash.crash_loop]
crashes = 0
`)
	if err != nil {
		return err
	}
	defer stop()
	var lat []time.Duration
	var lastExit uint64
	deadline := time.Now().Add(2 * time.Minute)
	for len(lat) < *samples && time.Now().Before(deadline) {
		e, err := d.next()
		if err != nil {
			return err
		}
		switch e.What {
		case procEventExit:
			if d.children[e.PID] {
				lastExit = e.TS
				delete(d.children, e.PID)
			}
		case procEventExec:
			if d.children[e.PID] && lastExit != 0 {
				lat = append(lat, time.Duration(e.TS-lastExit))
			}
		}
	}
	if len(lat) < *samples {
		return fmt.Errorf("only %d restarts measured", len(lat))
	}
	percentiles("crash-loop restart (exit → replacement exec)", lat[20:])
	return nil
}

// sigkillLatency: SIGKILL a sleeping service from outside; time from the
// kill(2) call to the exec of its replacement.
func sigkillLatency(bin, dir string) error {
	d, stop, err := startWatched(bin, dir, `
[services.sleeper]
command = ["sleep", "100000"]
restart = "always"
[services.sleeper.backoff]
initial = "0s"
[services.sleeper.crash_loop]
crashes = 0
`)
	if err != nil {
		return err
	}
	defer stop()
	st, err := d.waitAllRunning(time.Minute)
	if err != nil {
		return err
	}
	pid := st.Services[0].PID
	var lat []time.Duration
	for i := 0; i < *samples; i++ {
		time.Sleep(2 * time.Millisecond) // let the new instance settle into its sleep
		t0 := monoNow()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill %d (sample %d): %w", pid, i, err)
		}
		next, ts, err := d.nextExecOfChild(t0, time.Now().Add(10*time.Second))
		if err != nil {
			return err
		}
		lat = append(lat, time.Duration(ts-t0))
		pid = next
	}
	percentiles("SIGKILL → replacement exec", lat)
	return nil
}

// scale: N sleeping services: start-up until all have exec'd, memory, idle
// CPU, and a graceful stop.
func scale(bin, dir string) error {
	ev, err := openProcEvents()
	if err != nil {
		return err
	}
	defer ev.Close()
	var b strings.Builder
	for i := 0; i < *services; i++ {
		fmt.Fprintf(&b, "[services.s%04d]\ncommand = [\"sleep\", \"100000\"]\n", i)
	}
	cfg := filepath.Join(dir, "vigil.toml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o644); err != nil {
		return err
	}
	d := &daemon{bin: bin, config: cfg, ev: ev, children: map[int]bool{}}

	t0 := monoNow()
	up := exec.Command(bin, "-c", cfg, "up", "-d")
	if err := up.Start(); err != nil {
		return err
	}
	// vigil up -d forks the guardian, the guardian forks the daemon (the
	// child of the guardian that execs), and the daemon forks the services.
	cli := up.Process.Pid
	guardians, guardianKids := map[int]bool{}, map[int]bool{}
	execs := 0
	var last uint64
	deadline := time.Now().Add(2 * time.Minute)
	for execs < *services && time.Now().Before(deadline) {
		e, err := ev.next()
		if err != nil {
			return err
		}
		switch e.What {
		case procEventFork:
			switch {
			case e.Parent == cli:
				guardians[e.PID] = true
			case guardians[e.Parent]:
				guardianKids[e.PID] = true
			case d.pid != 0 && e.Parent == d.pid:
				d.children[e.PID] = true
			}
		case procEventExec:
			switch {
			case guardianKids[e.PID] && d.pid == 0:
				d.pid = e.PID
			case d.children[e.PID]:
				execs++
				last = e.TS
			}
		}
	}
	if err := up.Wait(); err != nil {
		return fmt.Errorf("vigil up -d: %w", err)
	}
	if execs < *services {
		return fmt.Errorf("only %d of %d services exec'd", execs, *services)
	}
	fmt.Printf("start-up of %d services (vigil up -d → last service exec): %.1fms\n", *services, ms(time.Duration(last-t0)))
	st, err := d.status()
	if err != nil {
		return err
	}
	runningN := 0
	for _, s := range st.Services {
		if s.State == "running" {
			runningN++
		}
	}
	fmt.Printf("status reports %d/%d running\n", runningN, *services)

	time.Sleep(2 * time.Second) // let start-up garbage be collected before measuring
	rss, pss := smaps(d.pid)
	fmt.Printf("daemon memory with %d services: RSS %.1f MB, PSS %.1f MB\n", *services, float64(rss)/1024, float64(pss)/1024)
	c0 := cpuNS(d.pid)
	time.Sleep(*idle)
	c1 := cpuNS(d.pid)
	fmt.Printf("daemon CPU over %v idle with %d services: %.3f ms (its CPU since start: %.1f ms)\n",
		*idle, *services, float64(c1-c0)/1e6, float64(c1)/1e6)

	// Graceful stop: SIGTERM to the daemon until it has exited, which it does
	// only after every service has.
	pidfd, err := unix.PidfdOpen(d.pid, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pidfd)
	t1 := monoNow()
	if err := syscall.Kill(d.pid, syscall.SIGTERM); err != nil {
		return err
	}
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	if _, err := unix.Poll(fds, 60_000); err != nil {
		return err
	}
	t2 := monoNow()
	left := 0
	for pid := range d.children {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			left++
		}
	}
	fmt.Printf("graceful stop of %d services (SIGTERM → daemon exited): %.1fms, %d left running\n", *services, ms(time.Duration(t2-t1)), left)
	return nil
}

// smaps returns the RSS and PSS of pid in KiB.
func smaps(pid int) (rss, pss int) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		v, _ := strconv.Atoi(fs[1])
		switch fs[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		}
	}
	return rss, pss
}

// cpuNS sums the on-CPU time of every thread of pid, in nanoseconds.
func cpuNS(pid int) uint64 {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum uint64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		if fs := strings.Fields(string(b)); len(fs) > 0 {
			v, _ := strconv.ParseUint(fs[0], 10, 64)
			sum += v
		}
	}
	return sum
}
