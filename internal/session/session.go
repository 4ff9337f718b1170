package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ownerAtInit is the guard's parent as first seen: package initialization
// runs before main, as early as Go code can look. See the package comment.
var ownerAtInit = os.Getppid()

// NameEnv is the variable that tells CMD the name of its session.
const NameEnv = "VIGIL_SESSION_NAME"

// Defaults for the zero Config.
const (
	DefaultGrace     = 5 * time.Second
	DefaultHeartbeat = 5 * time.Second
)

const (
	// killWait is how long a group may take to vanish after SIGKILL before
	// Run stops waiting for it (a process in uninterruptible sleep dies only
	// when it wakes).
	killWait = 2 * time.Second
	// callTimeout bounds each call to a Registrar.
	callTimeout = 5 * time.Second
)

// forwarded are the signals the guard passes on to CMD's group.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

var (
	// ErrNoCommand is returned for a Config with no Args.
	ErrNoCommand = errors.New("session: no command")
	// ErrOwnerGone is returned, and CMD not started, when the owner died
	// before Run could start CMD.
	ErrOwnerGone = errors.New("session: the owner is gone")
	// ErrNotFound is a StartError's Err when no executable file of CMD's
	// name is in PATH.
	ErrNotFound = errors.New("session: command not found")
)

// StartError reports that CMD could not be started.
type StartError struct {
	Name string // CMD's Args[0], as given
	Err  error  // ErrNotFound, or the errno execve failed with
}

func (e *StartError) Error() string { return "session: start " + e.Name + ": " + e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// Code is the exit status a shell gives the failure: 127 when nothing was
// found to run, 126 when something was found but could not be run
// (permission denied, not an executable format, …).
func (e *StartError) Code() int {
	if errors.Is(e.Err, ErrNotFound) || errors.Is(e.Err, syscall.ENOENT) {
		return 127
	}
	return 126
}

// Config describes one session. Only Args is required; every other zero
// value has the documented default.
type Config struct {
	// Args is CMD and its arguments. Args[0] is looked up in Env's PATH
	// unless it contains a slash.
	Args []string
	// Name names the session: NameEnv in CMD's environment, and what a
	// Registrar is told. Default: the base name of Args[0].
	Name string
	// Env is CMD's environment, with NameEnv set (any earlier value is
	// dropped). Default (nil): the guard's own environment.
	Env []string
	// Stdin, Stdout and Stderr are CMD's. Default (nil): the guard's own.
	Stdin, Stdout, Stderr *os.File
	// Grace is how long CMD's group has between SIGTERM and SIGKILL when
	// the session ends. Default (zero or negative): DefaultGrace.
	Grace time.Duration
	// Heartbeat is how often a Registrar hears that the session is alive.
	// Default (zero or negative): DefaultHeartbeat. Unused without a
	// Registrar.
	Heartbeat time.Duration
	// Registrar, when set, is told about the session (see Registrar).
	// Default (nil): the guard works alone.
	Registrar Registrar
	// Log receives the guard's own troubles that do not end the session (a
	// failing Registrar, a process that survived SIGKILL). Default (nil):
	// discarded.
	Log *slog.Logger
}

// Exit is how a session ended.
type Exit struct {
	// Code is what `vigil run` exits with: CMD's exit code, or 128 + the
	// number of the signal that killed CMD.
	Code int
	// Signal is the signal that killed CMD; 0 when CMD exited.
	Signal syscall.Signal
	// OwnerGone: the owner died (or Run's context ended), so the guard
	// stopped CMD's group.
	OwnerGone bool
	// Leftovers is how many processes were still running in CMD's group
	// when CMD itself ended; the guard stopped them.
	Leftovers int
	// Killed: some process of the group needed SIGKILL after the grace
	// period.
	Killed bool
	// At is when CMD ended.
	At time.Time
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = filepath.Base(c.Args[0])
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.Stdin == nil {
		c.Stdin = os.Stdin
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Grace <= 0 {
		c.Grace = DefaultGrace
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Run runs CMD as the package comment describes and returns once CMD and
// everything left in its process group are gone. The error is nil whenever
// CMD ran, whatever its exit status; it is a *StartError when CMD could not
// be started, and ErrOwnerGone when the owner died before it was.
//
// Run waits for CMD itself, so it must not be used in a process where
// something else reaps every child (wait4(-1)).
func Run(ctx context.Context, cfg Config) (Exit, error) {
	if len(cfg.Args) == 0 {
		return Exit{}, ErrNoCommand
	}
	cfg = cfg.withDefaults()
	env := sessionEnv(cfg.Env, cfg.Name)
	path, err := lookPath(cfg.Args[0], env)
	if err != nil {
		return Exit{}, &StartError{Name: cfg.Args[0], Err: err}
	}

	// Signals are caught before CMD exists, so none that arrives around its
	// start ends the guard; they are forwarded once CMD runs.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	owner, err := watchOwner(ownerAtInit)
	if err != nil {
		return Exit{}, err
	}
	defer owner.stop()
	select {
	case <-owner.gone:
		return Exit{OwnerGone: true}, fmt.Errorf("%w (pid %d)", ErrOwnerGone, ownerAtInit)
	default:
	}
	if err := ctx.Err(); err != nil {
		return Exit{}, fmt.Errorf("session: %w", err)
	}

	tty := terminal(cfg.Stdin)
	c, err := start(path, cfg, env, tty)
	if err != nil {
		return Exit{}, &StartError{Name: cfg.Args[0], Err: err}
	}
	g := &guard{cfg: cfg, child: c, tty: tty, sigs: sigs, owner: owner}
	reg := g.register(ctx)
	exit, err := g.supervise(ctx)
	reg.end(exit)
	return exit, err
}

// sessionEnv is env with NameEnv set to name (glibc's getenv finds the
// first of duplicate entries, so an inherited value is removed).
func sessionEnv(env []string, name string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, NameEnv+"=") {
			out = append(out, kv)
		}
	}
	return append(out, NameEnv+"="+name)
}

// lookPath finds file in env's PATH as execvp does. A name with a slash is
// left to execve, whose errno tells what is wrong with it.
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	if file == "" {
		return "", ErrNotFound
	}
	pathEnv := "/usr/local/bin:/usr/bin:/bin"
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			pathEnv = v
			break
		}
	}
	var found error
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			continue
		}
		if err := unix.Access(p, unix.X_OK); err != nil {
			if found == nil {
				found = err // found, but not executable: 126, as shells say
			}
			continue
		}
		return p, nil
	}
	if found != nil {
		return "", found
	}
	return "", ErrNotFound
}

// child is CMD once started.
type child struct {
	pid int // also its process group's id
	// exited is closed once CMD has exited. It is not reaped yet: until
	// the guard reaps it, its pid — and so its process group's id — cannot
	// be reused, so signalling the group never reaches a stranger.
	exited chan struct{}
	// stopped receives when CMD was stopped (interactive sessions only).
	stopped chan struct{}
}

// start forks CMD from a goroutine locked to its thread for as long as CMD
// runs: the parent-death signal follows the forking thread, and this one
// ends only after CMD has exited, so CMD gets SIGKILL only if the guard
// itself dies.
func start(path string, cfg Config, env []string, tty int) (*child, error) {
	c := &child{exited: make(chan struct{}), stopped: make(chan struct{}, 1)}
	type started struct {
		pid int
		err error
	}
	res := make(chan started, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		sys := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if tty >= 0 {
			sys.Foreground, sys.Ctty = true, tty
		}
		files := []uintptr{cfg.Stdin.Fd(), cfg.Stdout.Fd(), cfg.Stderr.Fd()}
		pid, err := syscall.ForkExec(path, cfg.Args, &syscall.ProcAttr{Env: env, Files: files, Sys: sys})
		runtime.KeepAlive(cfg)
		res <- started{pid, err}
		if err != nil {
			return
		}
		opts := unix.WEXITED | unix.WNOWAIT
		if tty >= 0 {
			opts |= unix.WSTOPPED
		}
		for {
			var info unix.Siginfo
			err := unix.Waitid(unix.P_PID, pid, &info, opts, nil)
			if err == unix.EINTR {
				continue
			}
			if err == nil && info.Code == cldStopped {
				// Consume the stop report; WSTOPPED alone cannot consume
				// an exit, and WNOHANG keeps a stop already undone by a
				// SIGCONT from blocking us.
				_ = unix.Waitid(unix.P_PID, pid, &info, unix.WSTOPPED|unix.WNOHANG, nil)
				select {
				case c.stopped <- struct{}{}:
				default:
				}
				continue
			}
			close(c.exited) // an error (ECHILD) means it is gone too
			return
		}
	}()
	r := <-res
	if r.err != nil {
		return nil, r.err
	}
	c.pid = r.pid
	return c, nil
}

// cldStopped is CLD_STOPPED, the si_code of a stopped child.
const cldStopped = 5

// guard is one running session; supervise is its loop.
type guard struct {
	cfg   Config
	child *child
	tty   int // CMD's controlling terminal when interactive, else -1
	sigs  chan os.Signal
	owner *ownerWatch
}

func (g *guard) signalGroup(sig syscall.Signal) {
	_ = syscall.Kill(-g.child.pid, sig)
}

// supervise forwards signals, stops the group when the owner dies or CMD
// exits, and reaps CMD once the group is gone.
func (g *guard) supervise(ctx context.Context) (Exit, error) {
	var (
		exit       Exit
		graceT     *time.Timer
		graceC     <-chan time.Time // SIGKILL when it fires
		giveUpC    <-chan time.Time // stop waiting for SIGKILL to work
		groupEmpty <-chan struct{}
		exited     = g.child.exited
		ownerGone  = g.owner.gone
		ctxDone    = ctx.Done()
		unwatch    = make(chan struct{})
	)
	defer close(unwatch)
	terminate := func() {
		if graceT != nil {
			return
		}
		g.signalGroup(syscall.SIGTERM)
		g.signalGroup(syscall.SIGCONT) // a stopped process could not act on it
		graceT = time.NewTimer(g.cfg.Grace)
		graceC = graceT.C
	}
	defer func() {
		if graceT != nil {
			graceT.Stop()
		}
	}()
	for {
		select {
		case s := <-g.sigs:
			g.signalGroup(s.(syscall.Signal))
		case <-ownerGone:
			ownerGone, exit.OwnerGone = nil, true
			terminate()
		case <-ctxDone:
			ctxDone, exit.OwnerGone = nil, true
			terminate()
		case <-graceC:
			graceC, exit.Killed = nil, true
			g.signalGroup(syscall.SIGKILL)
			giveUpC = time.After(killWait)
		case <-giveUpC:
			giveUpC = nil
			if exited != nil {
				return exit, fmt.Errorf("session: pid %d still runs %v after SIGKILL", g.child.pid, killWait)
			}
			g.cfg.Log.Warn("session: processes survived SIGKILL", "pgid", g.child.pid, "pids", members(g.child.pid))
			return g.reap(exit)
		case <-g.child.stopped:
			g.jobStop()
		case <-exited:
			exited, exit.At = nil, time.Now()
			g.giveBackTerminal()
			if n := len(members(g.child.pid)); n > 0 {
				exit.Leftovers = n
				terminate()
			}
			groupEmpty = watchGroup(g.child.pid, unwatch)
		case <-groupEmpty:
			return g.reap(exit)
		}
	}
}

// reap collects CMD's status, which frees its pid: nothing may signal the
// group after this.
func (g *guard) reap(exit Exit) (Exit, error) {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(g.child.pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return exit, fmt.Errorf("session: wait for pid %d: %w", g.child.pid, err)
		}
		break
	}
	switch {
	case ws.Exited():
		exit.Code = ws.ExitStatus()
	case ws.Signaled():
		exit.Signal = ws.Signal()
		exit.Code = 128 + int(exit.Signal)
	}
	return exit, nil
}
