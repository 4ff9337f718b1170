package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// recoverStatus is the part of GET /v1/status the recover scenario reads.
type recoverStatus struct {
	Daemon struct {
		PID           int    `json:"pid"`
		SafeMode      bool   `json:"safe_mode"`
		RecoveryStage string `json:"recovery_stage"`
	} `json:"daemon"`
	Services []recoverService `json:"services"`
}

type recoverService struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	PID      int    `json:"pid"`
	Restarts int    `json:"restarts"`
	Reason   string `json:"reason"`
}

// apiClient asks the daemon's API directly on its unix socket: no CLI
// process start-up in the measured time.
type apiClient struct{ c *http.Client }

func newAPIClient(sock string) *apiClient {
	return &apiClient{c: &http.Client{
		Timeout: time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				d := net.Dialer{Timeout: 20 * time.Millisecond}
				return d.DialContext(ctx, "unix", sock)
			},
			MaxIdleConnsPerHost: 1,
		},
	}}
}

func (a *apiClient) status() (recoverStatus, error) {
	var st recoverStatus
	resp, err := a.c.Get("http://vigil/v1/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return st, err
	}
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET /v1/status: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return st, json.Unmarshal(b, &st)
}

// recoverKill is what one daemon SIGKILL measured. Instants are
// CLOCK_MONOTONIC ns; the kill's is taken right before kill(2).
type recoverKill struct {
	oldPID, newPID int
	kill           uint64
	exec           uint64 // the kernel's exec of the guardian's new daemon (0: not seen)
	answer         uint64 // first status answer from the new daemon
	live           uint64 // first answer: live, every service running with its old pid
	backoff        time.Duration
	stages         []string // recovery_stage values seen, in order, with first-seen offsets
	liveTooEarly   bool     // "live" answered before a working stage was seen, services not yet adopted
	changed        []string // services whose pid changed or whose restarts grew
	polls, fails   int
	daemonStages   string // stage durations from the daemon's log
}

// recoverScenario: -services sleeping services under `vigil up -d`; the
// daemon (not the guardian) is SIGKILLed -kills times, and each time the
// scenario measures how long until a new daemon answers with recovery
// stage "live" and every service adopted: same pid, no restart.
func recoverScenario(bin, dir string) error {
	kills := *killsFlag
	if kills <= 0 {
		kills = 10
		if *services > 100 {
			kills = 5
		}
	}
	ev, err := openProcEvents()
	if err != nil {
		return err
	}
	// A receive timeout, so the reader goroutine notices when it is done.
	_ = unix.SetsockoptTimeval(ev.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100_000})
	// The reader passes on the execs of the guardian's children: the
	// kernel's instant each new daemon begins.
	var guardianPID atomic.Int64
	execs := make(chan procEvent, 1024)
	stopEv := make(chan struct{})
	evDone := make(chan struct{})
	go func() {
		defer close(evDone)
		children := map[int]bool{}
		for {
			select {
			case <-stopEv:
				return
			default:
			}
			e, err := ev.next()
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOBUFS) {
					continue
				}
				return
			}
			switch {
			case e.What == procEventFork && int64(e.Parent) == guardianPID.Load():
				children[e.PID] = true
			case e.What == procEventExec && children[e.PID]:
				delete(children, e.PID)
				select {
				case execs <- e:
				default:
				}
			}
		}
	}()
	defer func() { close(stopEv); <-evDone; ev.Close() }()

	// The marker every process of this project inherits: up -d → guardian
	// → daemon → services.
	marker := "BENCH_PROJECT=" + dir
	toml := "[safe_mode]\ncrashes = 0\n\n" + servicesTOML(*services, "")
	cfg := filepath.Join(dir, "vigil.toml")
	if err := os.WriteFile(cfg, []byte(toml), 0o644); err != nil {
		return err
	}
	state := filepath.Join(dir, ".vigil")
	logPath := filepath.Join(state, "daemon.log")
	d := &daemon{bin: bin, config: cfg}
	up := exec.Command(bin, "-c", cfg, "up", "-d")
	up.Env = append(os.Environ(), marker)
	if out, err := up.CombinedOutput(); err != nil {
		return fmt.Errorf("vigil up -d: %v: %s", err, out)
	}
	defer recoverCleanup(d, marker)

	t0 := time.Now()
	if _, err := d.waitAllRunning(5 * time.Minute); err != nil {
		return err
	}
	api := newAPIClient(filepath.Join(state, "vigil.sock"))
	st, err := api.status()
	if err != nil {
		return err
	}
	if st.Daemon.RecoveryStage != "live" {
		return fmt.Errorf("fresh daemon: recovery_stage %q", st.Daemon.RecoveryStage)
	}
	guardian := ppid(st.Daemon.PID)
	guardianPID.Store(int64(guardian))
	fmt.Printf("recover: %d services running %.0fms after vigil up -d returned; daemon pid %d, guardian pid %d; %d kills; safe_mode.crashes = 0 (safe mode off)\n",
		len(st.Services), ms(time.Since(t0)), st.Daemon.PID, guardian, kills)
	if len(st.Services) != *services {
		return fmt.Errorf("status lists %d services, want %d", len(st.Services), *services)
	}

	var results []recoverKill
	totalChanged := map[string]bool{}
	for k := range kills {
		time.Sleep(500 * time.Millisecond) // let the last recovery's aftermath (checkpoint, journal) settle
		st, err := api.status()
		if err != nil {
			return fmt.Errorf("kill %d: status before the kill: %w", k+1, err)
		}
		if ppid(st.Daemon.PID) != guardian {
			return fmt.Errorf("kill %d: daemon pid %d is not the guardian's (%d) child", k+1, st.Daemon.PID, guardian)
		}
		before := map[string]int{}
		for _, s := range st.Services {
			if s.State != "running" || s.PID == 0 {
				return fmt.Errorf("kill %d: %s is %s (pid %d) before the kill", k+1, s.Name, s.State, s.PID)
			}
			before[s.Name] = s.PID
		}
		logOff := fileSize(logPath)
		drain(execs)
		r := recoverKill{oldPID: st.Daemon.PID}
		r.kill = monoNow()
		if err := syscall.Kill(r.oldPID, syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill %d: SIGKILL %d: %w", k+1, r.oldPID, err)
		}
		api.c.CloseIdleConnections()
		if err := r.wait(api, before, 60*time.Second); err != nil {
			return fmt.Errorf("kill %d: %w", k+1, err)
		}
		r.exec = daemonExec(execs, r.newPID, r.kill)
		r.backoff, r.daemonStages = readDaemonLog(logPath, logOff)
		for _, n := range r.changed {
			totalChanged[n] = true
		}
		results = append(results, r)
		r.print(k+1, kills)
	}

	// No duplicates: each service is exactly one process of this project,
	// the one status names.
	st, err = api.status()
	if err != nil {
		return err
	}
	procs, others := projectProcesses(marker)
	dups, missing, wrong := 0, 0, 0
	for _, s := range st.Services {
		pids := procs[s.Name]
		switch {
		case len(pids) == 0:
			missing++
		case len(pids) > 1:
			dups++
			fmt.Printf("recover: DUPLICATE %s: pids %v (status says %d)\n", s.Name, pids, s.PID)
		case pids[0] != s.PID:
			wrong++
			fmt.Printf("recover: %s runs as pid %d but status says %d\n", s.Name, pids[0], s.PID)
		}
	}
	for name := range procs {
		if !slices.ContainsFunc(st.Services, func(s recoverService) bool { return s.Name == name }) {
			fmt.Printf("recover: stray process of unknown service %q: %v\n", name, procs[name])
			dups++
		}
	}
	fmt.Printf("recover: after %d kills: %d service processes for %d services, %d duplicated, %d missing, %d not the pid status names; other processes of the project: %d (guardian + daemon expected: 2)\n",
		kills, countPids(procs), len(st.Services), dups, missing, wrong, others)

	// Summary.
	var total, excl, toAnswer, toExec, execToAnswer, answerToLive, overBackoff []time.Duration
	for _, r := range results {
		total = append(total, time.Duration(r.live-r.kill))
		toAnswer = append(toAnswer, time.Duration(r.answer-r.kill))
		answerToLive = append(answerToLive, time.Duration(r.live-r.answer))
		if r.exec != 0 {
			toExec = append(toExec, time.Duration(r.exec-r.kill))
			execToAnswer = append(execToAnswer, time.Duration(r.answer-r.exec))
			excl = append(excl, time.Duration(r.live-r.exec))
			if r.backoff > 0 {
				overBackoff = append(overBackoff, time.Duration(r.exec-r.kill)-r.backoff)
			}
		}
	}
	n := *services
	backoffs := make([]string, len(results))
	for i, r := range results {
		backoffs[i] = r.backoff.String()
	}
	fmt.Printf("recover: guardian backoff per kill (its log; 100ms doubling to 5s, reset only after 60s of daemon uptime): %s\n", strings.Join(backoffs, " "))
	percentiles(fmt.Sprintf("recover %d services: crash-to-live incl. guardian backoff (SIGKILL → new daemon answers live, all adopted)", n), total)
	fmt.Printf("recover %d services: first kill (guardian backoff %v, the only kill at the base delay): crash-to-live %.1fms\n",
		n, results[0].backoff, ms(time.Duration(results[0].live-results[0].kill)))
	percentiles(fmt.Sprintf("recover %d services: guardian part (SIGKILL → new daemon's first status answer)", n), toAnswer)
	if len(toExec) > 0 {
		percentiles(fmt.Sprintf("recover %d services:   of which SIGKILL → new daemon exec (kernel)", n), toExec)
		if len(overBackoff) > 0 {
			percentiles(fmt.Sprintf("recover %d services:   of which guardian overhead beyond its backoff", n), overBackoff)
		}
		percentiles(fmt.Sprintf("recover %d services:   of which daemon exec → first status answer (start-up)", n), execToAnswer)
	}
	percentiles(fmt.Sprintf("recover %d services: recovery (first answer → live, all adopted)", n), answerToLive)
	if len(excl) > 0 {
		percentiles(fmt.Sprintf("recover %d services: crash-to-live excl. guardian backoff (new daemon exec → live)", n), excl)
	}
	fmt.Printf("recover %d services: restarted services: %d\n", n, len(totalChanged))
	switch {
	case len(totalChanged) > 0:
		names := slices.Sorted(func(yield func(string) bool) {
			for n := range totalChanged {
				if !yield(n) {
					return
				}
			}
		})
		if len(names) > 10 {
			names = append(names[:10], "…")
		}
		return fmt.Errorf("%d services restarted instead of adopted: %s", len(totalChanged), strings.Join(names, " "))
	case dups > 0 || missing > 0 || wrong > 0:
		return fmt.Errorf("after the kills: %d duplicated, %d missing, %d with another pid than status says", dups, missing, wrong)
	}
	return nil
}

// wait polls the API every millisecond until a new daemon answers live with
// every service running under its old pid.
func (r *recoverKill) wait(api *apiClient, before map[string]int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last recoverStatus
	var lastErr error
	lastStage := ""
	workingSeen := false
	for time.Now().Before(deadline) {
		st, err := api.status()
		now := monoNow()
		r.polls++
		if err != nil || st.Daemon.PID == r.oldPID || st.Daemon.PID == 0 {
			if err != nil {
				r.fails++
				lastErr = err
			}
			time.Sleep(time.Millisecond)
			continue
		}
		last = st
		if r.answer == 0 {
			r.answer, r.newPID = now, st.Daemon.PID
		}
		if st.Daemon.PID != r.newPID {
			return fmt.Errorf("a third daemon (pid %d) answered after %d: the new one died during recovery", st.Daemon.PID, r.newPID)
		}
		if st.Daemon.SafeMode {
			return errors.New("the new daemon is in safe mode")
		}
		stage := st.Daemon.RecoveryStage
		if stage != lastStage {
			r.stages = append(r.stages, fmt.Sprintf("%s@%.1f", stage, ms(time.Duration(now-r.kill))))
			lastStage = stage
		}
		if stage != "live" {
			workingSeen = true
			if strings.HasSuffix(stage, "_failed") {
				return fmt.Errorf("recovery failed: stage %s", stage)
			}
			time.Sleep(time.Millisecond)
			continue
		}
		done := len(st.Services) == len(before)
		var changed []string
		for _, s := range st.Services {
			old, ok := before[s.Name]
			switch {
			case !ok:
				done = false
			case s.PID != 0 && s.PID != old, s.Restarts != 0:
				changed = append(changed, s.Name)
			case s.State != "running" || s.PID == 0:
				done = false
			}
		}
		if len(changed) > 0 {
			// Restarted, not adopted: a failure; stop once everything runs.
			r.changed = changed
		}
		if done {
			r.live = now
			return nil
		}
		if !workingSeen {
			r.liveTooEarly = true
		}
		time.Sleep(time.Millisecond)
	}
	if r.answer == 0 {
		return fmt.Errorf("no new daemon answered within %v (last error: %v)", timeout, lastErr)
	}
	notRunning := 0
	for _, s := range last.Services {
		if s.State != "running" || s.PID != before[s.Name] {
			notRunning++
		}
	}
	return fmt.Errorf("new daemon %d not live with all adopted within %v: stage %q, %d services not running with their old pid; stages seen %v",
		r.newPID, timeout, last.Daemon.RecoveryStage, notRunning, r.stages)
}

func (r *recoverKill) print(k, kills int) {
	ex := "exec ?"
	if r.exec != 0 {
		ex = fmt.Sprintf("kill→exec %.1fms, exec→answer %.1fms", ms(time.Duration(r.exec-r.kill)), ms(time.Duration(r.answer-r.exec)))
	}
	fmt.Printf("recover: kill %d/%d: daemon %d → %d, guardian backoff %v: %s, answer→live %.1fms, crash-to-live %.1fms; stages seen (ms after kill) %s; daemon log: %s; %d polls (%d refused/failed)\n",
		k, kills, r.oldPID, r.newPID, r.backoff, ex, ms(time.Duration(r.live-r.answer)), ms(time.Duration(r.live-r.kill)),
		strings.Join(r.stages, " "), r.daemonStages, r.polls, r.fails)
	if r.liveTooEarly {
		fmt.Printf("recover: kill %d/%d: NOTE the new daemon answered recovery_stage \"live\" before any recovery stage while its services were not yet adopted\n", k, kills)
	}
	if len(r.changed) > 0 {
		fmt.Printf("recover: kill %d/%d: RESTARTED (pid changed or restarts > 0): %d services, e.g. %v\n", k, kills, len(r.changed), r.changed[:min(5, len(r.changed))])
	}
}

// daemonExec finds the kernel's exec of the daemon the guardian started
// after the kill.
func daemonExec(execs chan procEvent, pid int, after uint64) uint64 {
	deadline := time.After(200 * time.Millisecond)
	for {
		select {
		case e := <-execs:
			if e.PID == pid && e.TS > after {
				return e.TS
			}
		case <-deadline:
			return 0
		}
	}
}

func drain(c chan procEvent) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

var (
	backoffRE = regexp.MustCompile(`guardian: restarting the daemon in (\S+)`)
	stageRE   = regexp.MustCompile(`^time=(\S+) .*msg=recovery from=(\S+) to=(\S+)`)
	startedRE = regexp.MustCompile(`^time=(\S+) .*msg="daemon started"`)
)

// readDaemonLog reads what daemon.log gained since off: the guardian's
// backoff and the new daemon's recovery transitions (slog's millisecond
// wall-clock stamps), as the time spent in each stage.
func readDaemonLog(path string, off int64) (time.Duration, string) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "unreadable"
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return 0, "unreadable"
	}
	var backoff time.Duration
	var parts []string
	var prev time.Time
	prevStage := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := backoffRE.FindStringSubmatch(line); m != nil {
			backoff, _ = time.ParseDuration(m[1])
			continue
		}
		m := stageRE.FindStringSubmatch(line)
		if m == nil {
			if m := startedRE.FindStringSubmatch(line); m != nil && prevStage != "" {
				if t, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
					parts = append(parts, fmt.Sprintf("live→ready %dms", t.Sub(prev).Milliseconds()))
				}
			}
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		if prevStage != "" {
			parts = append(parts, fmt.Sprintf("%s %dms", prevStage, t.Sub(prev).Milliseconds()))
		}
		prev, prevStage = t, m[3]
	}
	if len(parts) == 0 {
		return backoff, "no recovery transitions"
	}
	return backoff, strings.Join(parts, ", ")
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// ppid is pid's parent, from /proc/PID/stat.
func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	fs := strings.Fields(s[i+1:])
	if len(fs) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(fs[1])
	return p
}

// projectProcesses lists the live processes whose environment has marker:
// by VIGIL_SERVICE, and how many have none (the guardian, the daemon).
func projectProcesses(marker string) (map[string][]int, int) {
	byService := map[string][]int{}
	others := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil || len(b) == 0 {
			continue // gone, or a zombie
		}
		mine, service := false, ""
		for _, kv := range strings.Split(string(b), "\x00") {
			if kv == marker {
				mine = true
			} else if v, ok := strings.CutPrefix(kv, "VIGIL_SERVICE="); ok {
				service = v
			}
		}
		switch {
		case !mine:
		case service == "":
			others++
		default:
			byService[service] = append(byService[service], pid)
		}
	}
	return byService, others
}

func countPids(m map[string][]int) int {
	n := 0
	for _, p := range m {
		n += len(p)
	}
	return n
}

// recoverCleanup stops the project however things ended: vigil down (which
// may have to wait for the guardian's backoff to bring a daemon back), else
// SIGTERM to the guardian, and last SIGKILL to whatever still carries the
// project's marker (only processes this scenario started).
func recoverCleanup(d *daemon, marker string) {
	for range 20 {
		if err := d.down(); err == nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		procs, others := projectProcesses(marker)
		if countPids(procs)+others == 0 {
			return
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "bench: recover cleanup: SIGKILL to %d leftover processes\n", countPids(procs)+others)
			for _, pid := range markedPIDs(marker) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			return
		}
		if time.Until(deadline) < 20*time.Second {
			// down did not do it: SIGTERM whatever of the project is left
			// without a service name (the guardian stops its daemon).
			for _, pid := range markedPIDs(marker) {
				if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); !bytes.Contains(b, []byte("VIGIL_SERVICE=")) {
					_ = syscall.Kill(pid, syscall.SIGTERM)
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func markedPIDs(marker string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(string(b), "\x00"), marker) {
			pids = append(pids, pid)
		}
	}
	return pids
}
