// Package guardian is the tiny parent that keeps the vigil daemon alive.
//
// Run is what the user's `vigil up` becomes: it makes its process the child
// subreaper, starts the daemon, reaps every child (the daemon and every orphan
// reparented to it, as tini does when it is PID 1), restarts the daemon with
// backoff when it crashes or stops sending heartbeats, and appends each daemon
// crash to a small crash-history file that the next daemon reads to decide on
// safe mode. Everything risky lives in the daemon; the guardian stays small
// enough to read in one sitting and imports only the standard library and
// golang.org/x/sys/unix (a test enforces this).
//
// # The link
//
// The guardian and the daemon talk over a socketpair(AF_UNIX, SOCK_SEQPACKET),
// one per daemon start. The daemon's end is an inherited fd whose number is in
// the daemon's environment as VIGIL_GUARDIAN_FD=<n>; the heartbeat interval the
// guardian expects is in VIGIL_GUARDIAN_HEARTBEAT=<Go duration>. Each message is
// one datagram of ASCII text:
//
//	daemon → guardian   "hb"                   I am alive (every heartbeat interval)
//	daemon → guardian   "stopping"             I am stopping every service on
//	                                           purpose: if I die before "bye",
//	                                           do not restart me, end what I
//	                                           leave (also a heartbeat)
//	daemon → guardian   "bye"                  I am about to exit on purpose (it
//	                                           also counts as a heartbeat)
//	guardian → daemon   "exit <pid> <status>"  an orphan was reaped; status is its
//	                                           wait status in decimal
//
// Unknown messages are ignored in both directions. The daemon uses Attach to
// get its end (a Link).
//
// # Invariants
//
//   - Run is the only code in its process that waits for children: it calls
//     wait4(-1, WNOHANG) until nothing is left on every SIGCHLD (and every other
//     wake-up). Nothing else in the process may wait for children while Run
//     runs; the daemon gets its own process group, so signals from a terminal
//     reach it only once, through the guardian.
//   - Run is one goroutine that owns all its state and wakes for signals,
//     for a tick (the smaller of HeartbeatInterval and HeartbeatTimeout/4) and
//     for the restart timer. On each tick it drains the link without blocking;
//     when it reaps the daemon it drains the link once more before deciding, so
//     a "bye" sent right before exiting is always seen (a dead process's
//     datagrams are already queued).
//   - A daemon exit is clean only after "bye" and exit code 0; anything else
//     (non-zero code, a signal, exit 0 without "bye", no heartbeat for
//     HeartbeatTimeout, after which the guardian SIGKILLs it) is a crash: it is
//     recorded in the history and the daemon is restarted after a backoff that
//     doubles from RestartDelay to MaxRestartDelay and resets once a daemon
//     stayed up for ResetAfter. The exception is a daemon that said
//     "stopping" (or was told to stop, below) and then died: it is recorded
//     but not restarted, since a restart would undo the stop; the guardian
//     ends the processes it left (its children now: SIGTERM with their
//     process groups, SIGKILL after 5s) and Run returns.
//   - Orphan exits reaped while no daemon can take them are queued (the newest
//     4096) and sent to the next daemon right after it starts. Delivery is best
//     effort: messages a daemon received but had not read when it died are lost.
//   - SIGTERM and SIGINT (and cancelling ctx, which becomes SIGTERM) are
//     forwarded to the daemon and mean a graceful stop: Run waits for the daemon
//     to exit and returns nil without restarting it; that exit is not recorded
//     as a crash unless the heartbeat timeout had to kill the daemon. SIGHUP is
//     only forwarded.
//
// It deliberately does not escalate a stop to SIGKILL (the heartbeat timeout
// does that for a daemon that hangs), supervise services, or interpret the
// daemon's configuration.
package guardian

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Environment variables Run adds to the daemon's environment.
const (
	EnvFD        = "VIGIL_GUARDIAN_FD"        // the daemon's end of the link
	EnvHeartbeat = "VIGIL_GUARDIAN_HEARTBEAT" // HeartbeatInterval as a Go duration
)

// ExitNoRestart is the exit code of a daemon that could not start at all
// (its config is invalid, another daemon holds the project's lock): a
// restart would fail the same way, so Run returns an error instead.
// EX_CONFIG from sysexits.h.
const ExitNoRestart = 78

// maxQueued bounds the orphan exits kept for the next daemon.
const maxQueued = 4096

// Options configures Run. Only Path is required; every other field's zero
// value means the default documented on it.
type Options struct {
	// Path is the daemon's executable. Required.
	Path string
	// Args is the daemon's argv, including argv[0] as in os/exec.Cmd;
	// empty means {Path}.
	Args []string
	// Env is the daemon's environment; nil means os.Environ(). Run replaces
	// any EnvFD and EnvHeartbeat in it with its own.
	Env []string
	// Dir is the daemon's working directory; "" means the guardian's.
	Dir string
	// Stdin, Stdout and Stderr are the daemon's standard files; nil means the
	// guardian's own (unlike os/exec.Cmd: the daemon is the guardian's other
	// half, and `vigil up` in the foreground shows its output).
	Stdin, Stdout, Stderr *os.File
	// ExtraFiles are passed as fds 3, 4, …; the link follows them.
	ExtraFiles []*os.File
	// ExtraFilesOnce gives ExtraFiles to the first daemon only: once it has
	// started they are closed here, and later daemons get the null device
	// in their place. For a readiness pipe, whose reader must see its end
	// when that daemon is gone.
	ExtraFilesOnce bool
	// HeartbeatInterval is how often the daemon should send "hb"; it is only
	// passed to the daemon (EnvHeartbeat). Default 1s.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout is how long the guardian waits for a heartbeat (the
	// first one counts from the daemon's start) before it SIGKILLs the daemon
	// as unresponsive. Default 10 × HeartbeatInterval.
	HeartbeatTimeout time.Duration
	// RestartDelay is the backoff after the second crash in a row (the
	// first is restarted at once), doubling from there. Default 100ms.
	RestartDelay time.Duration
	// MaxRestartDelay caps the doubling backoff. Default 5s.
	MaxRestartDelay time.Duration
	// ResetAfter is how long a daemon must stay up for the backoff to start
	// again from RestartDelay. Default 60s.
	ResetAfter time.Duration
	// HistoryPath is the crash-history file; "" means none is kept.
	HistoryPath string
	// OnStart, if set, is called with the pid after each daemon start, from
	// Run's goroutine; it must not block.
	OnStart func(pid int)
	// Logf, if set, receives the guardian's log lines; nil discards them.
	Logf func(format string, args ...any)
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.HeartbeatInterval, time.Second)
	def(&o.HeartbeatTimeout, 10*o.HeartbeatInterval)
	def(&o.RestartDelay, 100*time.Millisecond)
	def(&o.MaxRestartDelay, 5*time.Second)
	def(&o.ResetAfter, time.Minute)
	if len(o.Args) == 0 {
		o.Args = []string{o.Path}
	}
	if o.Env == nil {
		o.Env = os.Environ()
	}
	o.Stdin, o.Stdout, o.Stderr = cmp.Or(o.Stdin, os.Stdin), cmp.Or(o.Stdout, os.Stdout), cmp.Or(o.Stderr, os.Stderr)
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	// The link's fd follows the standard files and ExtraFiles.
	o.Env = append(slices.DeleteFunc(slices.Clone(o.Env), func(kv string) bool {
		return strings.HasPrefix(kv, EnvFD+"=") || strings.HasPrefix(kv, EnvHeartbeat+"=")
	}), EnvFD+"="+strconv.Itoa(3+len(o.ExtraFiles)), EnvHeartbeat+"="+o.HeartbeatInterval.String())
	return o
}

// daemon is the running daemon.
type daemon struct {
	pid             int
	proc            *os.Process
	link            int // the guardian's end
	started, lastHB time.Time
	bye, killed     bool
	stopping        bool // it said it is stopping every service
}

type guardian struct {
	o        Options
	d        *daemon      // nil while none runs
	stopping bool         // told to stop: the daemon's exit ends Run
	queue    []OrphanExit // orphan exits not yet sent to a daemon
	hist     History
}

// Run starts the daemon and keeps it alive until it exits cleanly, the
// guardian is told to stop (SIGTERM, SIGINT, ctx), or the daemon cannot be
// started: the first exec fails, or a daemon exits with ExitNoRestart
// while no stop was asked for. Those two are the errors it returns.
func Run(ctx context.Context, opts Options) error {
	o := opts.withDefaults()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("guardian: PR_SET_CHILD_SUBREAPER: %w", err)
	}
	chld, sigs := make(chan os.Signal, 1), make(chan os.Signal, 4)
	signal.Notify(chld, unix.SIGCHLD)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	defer signal.Stop(chld)
	defer signal.Stop(sigs)
	g := &guardian{o: o, hist: startHistory(o)}
	if err := g.start(); err != nil {
		return err
	}
	tick := time.NewTicker(max(min(o.HeartbeatInterval, o.HeartbeatTimeout/4), time.Millisecond))
	defer tick.Stop()
	// The first restart is immediate: one crash is mended before a service
	// notices. Crashes that follow back off from RestartDelay.
	delay, done := time.Duration(0), ctx.Done()
	next := func(d time.Duration) time.Duration { return min(max(2*d, o.RestartDelay), o.MaxRestartDelay) }
	var restart <-chan time.Time
	for {
		select {
		case <-done:
			done = nil
			if g.stop(unix.SIGTERM, "context done") {
				return nil
			}
		case s := <-sigs:
			if s == unix.SIGHUP {
				g.signal(unix.SIGHUP)
			} else if g.stop(s.(syscall.Signal), "got "+s.String()) {
				return nil
			}
		case <-chld:
		case <-tick.C:
			g.checkHeartbeat()
		case <-restart:
			restart = nil
			if err := g.start(); err != nil {
				o.Logf("%v; retrying in %v", err, delay)
				restart, delay = time.After(delay), next(delay)
			}
		}
		d, ws := g.reap() // on every wake: SIGCHLDs coalesce, but a reap is never missed
		if d == nil {
			continue
		}
		clean := d.bye && ws.Exited() && ws.ExitStatus() == 0 && !d.killed
		o.Logf("guardian: daemon pid %d ended: %s (bye=%v)", d.pid, describe(ws), d.bye)
		if ws.Exited() && ws.ExitStatus() == ExitNoRestart && !d.killed && !g.stopping {
			return fmt.Errorf("guardian: the daemon could not start (exit %d); not restarting it", ExitNoRestart)
		}
		if !clean && (!g.stopping || d.killed) {
			g.record(d, ws)
		}
		if !clean && (d.stopping || g.stopping) {
			// It died on its way down (a hang, killed above, or a crash):
			// the stop it began is finished here, not undone by a restart.
			n := g.endLeftovers(leftoverGrace)
			o.Logf("guardian: ended %d processes the daemon left while stopping", n)
			if !g.stopping {
				return fmt.Errorf("guardian: the daemon (pid %d) ended while stopping every service: %s; ended the %d processes it left",
					d.pid, describe(ws), n)
			}
		}
		if clean || g.stopping {
			return nil
		}
		if time.Since(d.started) >= o.ResetAfter {
			delay = 0
		}
		o.Logf("guardian: restarting the daemon in %v", delay)
		restart, delay = time.After(delay), next(delay)
	}
}

// leftoverGrace is how long the processes a daemon left while stopping
// get after SIGTERM before SIGKILL.
const leftoverGrace = 5 * time.Second

// endLeftovers ends what a daemon that died while stopping left behind:
// its services and their processes, which are now the guardian's children
// (it is their subreaper). Each gets SIGTERM, with its process group,
// then SIGKILL after grace; it returns how many there were.
func (g *guardian) endLeftovers(grace time.Duration) int {
	own := unix.Getpgrp()
	send := func(pids []int, s syscall.Signal) {
		for _, pid := range pids {
			if pg, err := unix.Getpgid(pid); err == nil && pg != own {
				unix.Kill(-pg, s)
			}
			unix.Kill(pid, s)
		}
	}
	first := children()
	send(first, unix.SIGTERM)
	deadline := time.Now().Add(grace)
	for left := first; len(left) > 0; left = children() {
		if time.Now().After(deadline) {
			send(left, unix.SIGKILL)
			deadline = time.Now().Add(grace)
		}
		g.reap()
		time.Sleep(20 * time.Millisecond)
	}
	g.reap()
	return len(first)
}

// children lists the live (not zombie) processes whose parent is this one.
func children() []int {
	self := os.Getpid()
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		i := bytes.LastIndexByte(b, ')')
		if err != nil || i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:])) // state, ppid, …
		if len(f) >= 2 && f[0] != "Z" && f[1] == strconv.Itoa(self) {
			out = append(out, pid)
		}
	}
	return out
}

// stop forwards a stop signal and reports whether Run can return at once
// (no daemon is running).
func (g *guardian) stop(s syscall.Signal, why string) bool {
	g.o.Logf("guardian: %s, stopping the daemon", why)
	g.stopping = true
	g.signal(s)
	return g.d == nil
}

// start starts a daemon with a fresh link and makes it the current one.
func (g *guardian) start() error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("guardian: socketpair: %w", err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "guardian-link")
	defer theirs.Close()
	files := append([]*os.File{g.o.Stdin, g.o.Stdout, g.o.Stderr}, g.o.ExtraFiles...)
	proc, err := os.StartProcess(g.o.Path, g.o.Args, &os.ProcAttr{Dir: g.o.Dir, Env: g.o.Env,
		Files: append(files, theirs), Sys: &syscall.SysProcAttr{Setpgid: true}})
	if err != nil {
		unix.Close(fds[0])
		return fmt.Errorf("guardian: start daemon %s: %w", g.o.Path, err)
	}
	now := time.Now()
	g.d = &daemon{pid: proc.Pid, proc: proc, link: fds[0], started: now, lastHB: now}
	g.o.Logf("guardian: started daemon pid %d", proc.Pid)
	if g.o.OnStart != nil {
		g.o.OnStart(proc.Pid)
	}
	if g.o.ExtraFilesOnce && len(g.o.ExtraFiles) > 0 {
		// Read-write: a later daemon may write its readiness there too.
		if null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0); err == nil {
			for _, f := range g.o.ExtraFiles {
				f.Close()
			}
			g.o.ExtraFiles = slices.Repeat([]*os.File{null}, len(g.o.ExtraFiles))
			g.o.ExtraFilesOnce = false
		}
	}
	g.flush()
	return nil
}

// reap waits for every child that has ended, queues the orphans' exits, and
// returns the daemon and its status if it is one of them.
func (g *guardian) reap() (ended *daemon, status syscall.WaitStatus) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err != nil || pid <= 0 {
			break
		}
		if d := g.d; d != nil && pid == d.pid {
			g.drain(d)
			unix.Close(d.link)
			d.proc.Release()
			ended, status, g.d = d, ws, nil
			continue
		}
		g.o.Logf("guardian: reaped orphan pid %d: %s", pid, describe(ws))
		g.orphan(OrphanExit{PID: pid, Status: ws})
	}
	g.flush()
	return ended, status
}

// drain reads, without waiting, what the daemon sent since the last drain.
func (g *guardian) drain(d *daemon) {
	buf := make([]byte, 512)
	for {
		n, _, err := unix.Recvfrom(d.link, buf, unix.MSG_DONTWAIT)
		if err != nil || n == 0 {
			return
		}
		switch msg := string(buf[:n]); msg {
		case "hb":
			d.lastHB = time.Now()
		case "bye":
			d.bye, d.lastHB = true, time.Now()
		case "stopping":
			d.stopping, d.lastHB = true, time.Now()
		default:
			g.o.Logf("guardian: ignoring unknown message %q from the daemon", msg)
		}
	}
}

// orphan queues e for the daemon, keeping the newest maxQueued.
func (g *guardian) orphan(e OrphanExit) {
	if g.queue = append(g.queue, e); len(g.queue) > maxQueued {
		g.queue = slices.Delete(g.queue, 0, len(g.queue)-maxQueued)
	}
}

// flush sends queued orphan exits to the daemon without waiting; whatever
// does not fit stays queued for the next tick or the next daemon.
func (g *guardian) flush() {
	for g.d != nil && len(g.queue) > 0 {
		msg := fmt.Appendf(nil, "exit %d %d", g.queue[0].PID, uint32(g.queue[0].Status))
		if unix.Sendto(g.d.link, msg, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, nil) != nil {
			return
		}
		g.queue = g.queue[1:]
	}
}

// checkHeartbeat drains the link, SIGKILLs a daemon that has been silent for
// HeartbeatTimeout, and retries sending queued orphan exits.
func (g *guardian) checkHeartbeat() {
	d := g.d
	if d == nil {
		return
	}
	g.drain(d)
	if silent := time.Since(d.lastHB); !d.killed && silent > g.o.HeartbeatTimeout {
		g.o.Logf("guardian: no heartbeat from daemon pid %d for %v, killing it", d.pid, silent.Round(time.Millisecond))
		d.killed = true
		d.proc.Signal(unix.SIGKILL)
	}
	g.flush()
}

// signal sends s to the daemon, if one is running.
func (g *guardian) signal(s syscall.Signal) {
	if g.d != nil {
		g.d.proc.Signal(s)
	}
}

func describe(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + unix.SignalName(ws.Signal())
	}
	return "exit code " + strconv.Itoa(ws.ExitStatus())
}
