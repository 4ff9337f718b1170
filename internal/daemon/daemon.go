// Package daemon is vigil's composition root: it takes the state dir and its
// lock, wires the real reaper, logs, supervisor and control API together, runs
// supervision, and shuts everything down in order.
//
// The lock on <state>/daemon.lock is held for the daemon's whole life: it,
// not a pid file, is what guarantees one daemon per project.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vigil-dev/vigil/internal/api"
	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/fsutil"
	"github.com/vigil-dev/vigil/internal/guardian"
	"github.com/vigil-dev/vigil/internal/journal"
	"github.com/vigil-dev/vigil/internal/logs"
	"github.com/vigil-dev/vigil/internal/notify"
	"github.com/vigil-dev/vigil/internal/probe"
	"github.com/vigil-dev/vigil/internal/proc"
	"github.com/vigil-dev/vigil/internal/recovery"
	"github.com/vigil-dev/vigil/internal/registry"
	"github.com/vigil-dev/vigil/internal/supervisor"
	"golang.org/x/sys/unix"
)

// Version is the daemon's version, shown in status.
var Version = "0.1.0-dev"

// Options configures Run. ConfigPath is required; every other zero value works.
type Options struct {
	// ConfigPath is vigil.toml or a Procfile.
	ConfigPath string
	// StateDir overrides the config's state_dir when non-empty.
	StateDir string
	// Output, when non-nil, receives every service's output lines prefixed
	// with "name | " (foreground `vigil up`) and vigil's own notices,
	// coloured when Color is set.
	Output io.Writer
	Color  bool
	// Ready, when non-nil, is called exactly once: with nil as soon as the
	// control socket answers, or with the error that stopped start-up.
	Ready func(error)
	// Logger receives the daemon's own log; default slog.Default().
	Logger *slog.Logger
	// NoSubreaper keeps the daemon from becoming a child subreaper and from
	// reaping children it did not start. For tests that run the daemon
	// inside a process that waits for children of its own.
	NoSubreaper bool
	// FS is where the journal and checkpoints live; nil means the real
	// file system. Tests inject faults through it.
	FS fsutil.FS
}

// ErrAlreadyRunning is wrapped by Run's error when another daemon holds the
// project's lock.
var ErrAlreadyRunning = errors.New("another vigil daemon is already running for this project")

// Run supervises the project until ctx is cancelled or a `down` request
// arrives, then stops every service (dependents first) and returns.
func Run(ctx context.Context, opts Options) (err error) {
	ready := opts.Ready
	if ready == nil {
		ready = func(error) {}
	}
	readied := false
	defer func() {
		if !readied {
			ready(err)
		}
	}()

	// The guardian's link first: Attach hides it from every process the
	// daemon starts.
	link, err := guardian.Attach()
	if err != nil {
		return err
	}
	parent := newParentNotifier()
	if link != nil {
		defer link.Close()
	}
	cfg, err := config.Load(opts.ConfigPath)
	if err != nil {
		return err
	}
	if opts.StateDir != "" {
		if cfg.StateDir, err = filepath.Abs(opts.StateDir); err != nil {
			return err
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}

	if err := MakeStateDir(cfg.StateDir); err != nil {
		return err
	}
	lock, err := acquireLock(cfg.StateDir)
	if err != nil {
		return err
	}
	defer lock.Close()

	if !opts.NoSubreaper {
		if err := proc.SetChildSubreaper(); err != nil {
			return fmt.Errorf("daemon: becoming child subreaper: %w", err)
		}
	}
	project := projectID(cfg.StateDir)
	reaper, err := proc.NewReaper(proc.ReaperOptions{
		ReapAll: !opts.NoSubreaper,
		Cgroups: os.Getenv("VIGIL_NO_CGROUPS") == "",
		Project: project,
		Orphan: func(e proc.Exit) {
			log.Debug("reaped orphan", "pid", e.PID, "status", int(e.Status))
		},
	})
	if err != nil {
		return err
	}
	defer reaper.Close()

	rotator, err := logs.NewRotator(cfg.StateDir, logs.Limits{MaxSize: cfg.Logs.MaxSize, MaxFiles: cfg.Logs.MaxFiles})
	if err != nil {
		return err
	}
	defer rotator.Close()

	d := &daemon{
		opts:      opts,
		project:   project,
		log:       log,
		startedAt: time.Now(),
		done:      make(chan struct{}),
	}
	d.cfg.Store(cfg)
	bus := &event.Bus{}
	d.mem, err = openMemory(cfg, opts.FS, bus, log)
	if err != nil {
		return err
	}
	defer d.mem.close()
	hooks := &hookRunner{reaper: reaper, cfg: d.cfg.Load, bus: bus, log: log, stateDir: cfg.StateDir}
	defer hooks.close(0)
	d.mem.cfg, d.mem.hooks = d.cfg.Load, hooks
	notifyPath := filepath.Join(cfg.StateDir, "notify.sock")
	run := &runner{reaper: reaper, rotator: rotator, stateDir: cfg.StateDir, notify: notifyPath, log: log}
	book := newOrphanBook()
	if link != nil {
		run.orphanStatus = book.wait
	}
	d.sup = supervisor.New(supervisor.Options{
		Services:     cfg.Services,
		Boot:         proc.Boot(),
		Runner:       run,
		Bus:          bus,
		Logger:       log,
		Check:        probe.Checker{Spawn: reaperSpawner(reaper)}.Check,
		ProcessGroup: proc.ProcessGroup,
		Durable:      d.mem.journal.Barrier,
		Flush:        func() { d.mem.journal.Written(func(error) {}) },
		CrashOutput:  d.mem.crashOutput,
	})
	handleNotify := func(from notify.Sender, m notify.Message) { d.sup.Notify(from.PID, m) }
	d.notify, err = notify.Listen(notify.ServerOptions{Path: notifyPath, Handle: handleNotify})
	if err != nil {
		return err
	}
	defer d.notify.Close()
	users := &userNotify{root: userNotifyRoot, state: cfg.StateDir, handle: handleNotify, log: log}
	defer users.close()
	run.userNotify = users.path

	if opts.Output != nil {
		d.prefixer = logs.NewPrefixer(cfg.StateDir, opts.Output, opts.Color)
		defer d.prefixer.Close()
		for _, s := range cfg.Services {
			if err := d.prefixer.Add(s.Name); err != nil {
				return err
			}
		}
		sub := bus.Subscribe(4096)
		defer sub.Close()
		go d.printEvents(sub)
	}

	loopCtx, stopLoop := context.WithCancel(context.Background())
	loopDone := make(chan struct{})
	go func() { d.sup.Run(loopCtx); close(loopDone) }()
	defer func() { stopLoop(); <-loopDone }()
	if link != nil {
		go serveGuardian(loopCtx, link, d.sup, book)
	}

	sock := filepath.Join(cfg.StateDir, "vigil.sock")
	l, err := api.Listen(sock)
	if err != nil {
		return err
	}
	d.reg = &registry.Registry{}
	if err := d.restoreSessions(); err != nil {
		log.Error("sessions not restored", "err", err)
	}
	d.mem.sessions = d.reg.List
	// Whether a recovery is due is settled before the API answers, so that
	// status never says "live" while one is still to run.
	d.recovery = d.newRecovery()
	needed, rerr := d.recoveryNeeded()
	if rerr != nil {
		log.Error("recovery state unreadable: set aside, recovering from the start", "err", rerr)
		if err := d.recovery.Store.SetAside(); err != nil {
			return err
		}
	}
	d.recovering.Store(needed)
	srv := api.NewServer(d, log)
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, http.ErrServerClosed) {
			log.Error("api server", "err", err)
		}
	}()
	defer os.Remove(sock)
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	if why := d.safeModeAtStart(); why != "" {
		if err := d.sup.SetSafeMode(true, why); err != nil {
			return err
		}
	}
	recovered := false
	if needed {
		if _, err := d.recovery.Run(ctx); err != nil {
			log.Error("recovery stopped: `vigil recovery retry` resumes it", "err", err)
		} else {
			recovered = true
		}
		d.recovering.Store(false)
	} else {
		d.restoreBlobs()
		d.sup.StartAll()
	}
	schedCtx, stopSched := context.WithCancel(context.Background())
	defer stopSched()
	d.mem.startScheduler(schedCtx, cfg.Checkpoint, d.sup)
	if recovered {
		// What recovery adopted goes on disk now, so that the next recovery
		// starts from here rather than replaying the journal since the
		// crashed daemon's last checkpoint.
		if _, err := d.mem.checkpointNow(ctx); err != nil {
			log.Error("checkpoint after recovery", "err", err)
		}
	}
	log.Info("daemon started", "pid", os.Getpid(), "config", cfg.Path, "services", len(cfg.Services))
	if err := hooks.catchUp(&journal.Reader{Dir: d.mem.journal.Dir(), FS: opts.FS}, d.mem.lastSeq); err != nil {
		log.Error("hooks due before this daemon started", "err", err)
	}
	readied = true
	ready(nil)
	if err := parent.ready(len(cfg.Services), d.sup.SafeMode()); err != nil {
		log.Warn("sd_notify READY to our own supervisor", "err", err)
	}
	go parent.watch(loopCtx, d.sup)
	go d.sweepSessions(loopCtx)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if _, err := d.Reload(); err != nil {
				log.Error("reload on SIGHUP", "err", err)
			}
			continue
		case <-ctx.Done():
		case <-d.done:
		}
		break
	}
	log.Info("stopping every service")
	_ = parent.send("STOPPING=1")
	if link != nil {
		if err := link.Stopping(); err != nil {
			log.Error("guardian: stopping", "err", err)
		}
	}
	d.sup.StopAll()
	hooks.close(5 * time.Second) // their outcomes must reach the journal, closed next
	d.mem.close()                // the final checkpoint needs the loop, which stops on return
	if link != nil {
		// An intended stop: the guardian exits with us instead of restarting.
		if err := link.Bye(); err != nil {
			log.Error("guardian: bye", "err", err)
		}
	}
	log.Info("daemon stopped")
	return nil
}

// daemon implements api.Controller on top of the supervisor.
type daemon struct {
	opts     Options
	project  string // projectID of the state dir
	log      *slog.Logger
	sup      *supervisor.Supervisor
	prefixer *logs.Prefixer
	notify   *notify.Server
	mem      *memory
	recovery *recovery.Machine
	reg      *registry.Registry
	restored bool // recovery's restoring step has run in this process
	// recovering: a recovery is due or running; until the machine has
	// persisted its first stage, status shows "crashed" rather than live.
	recovering atomic.Bool
	startedAt  time.Time
	cfg        atomic.Pointer[config.Config]
	reloadMu   sync.Mutex
	downOnce   sync.Once
	done       chan struct{}
}

func (d *daemon) Status() apitype.Status {
	cfg := d.cfg.Load()
	return apitype.Status{
		Daemon: apitype.Daemon{
			PID:           os.Getpid(),
			Version:       Version,
			StartedAt:     d.startedAt,
			SafeMode:      d.sup.SafeMode(),
			RecoveryStage: d.recoveryStage(),
			Config:        cfg.Path,
			StateDir:      cfg.StateDir,
			Notify:        d.notifyStats(),
			Journal:       d.mem.journalStatus(),
			Checkpoint:    d.mem.info(),
		},
		Services: d.sup.Services(),
	}
}

func (d *daemon) notifyStats() *apitype.Notify {
	st := d.notify.Stats()
	unknown, notMain := d.sup.NotifyDrops()
	accepted := st.Accepted
	if accepted >= unknown+notMain { // counters are read a moment apart
		accepted -= unknown + notMain
	}
	return &apitype.Notify{
		Socket:   filepath.Join(d.cfg.Load().StateDir, "notify.sock"),
		Received: st.Received,
		Accepted: accepted,
		Dropped: map[string]uint64{
			"truncated": st.DroppedTruncated, "no_credentials": st.DroppedNoCreds,
			"rate_limited": st.DroppedRateLimited, "oversize": st.DroppedOversize,
			"empty": st.DroppedEmpty, "invalid": st.DroppedInvalid,
			"unknown_sender": unknown, "not_main": notMain,
		},
	}
}

func (d *daemon) Start(name string) error   { return d.sup.Start(name) }
func (d *daemon) Stop(name string) error    { return d.sup.Stop(name) }
func (d *daemon) Restart(name string) error { return d.sup.Restart(name) }
func (d *daemon) Reset(name string) error   { return d.sup.Reset(name) }

// Reload re-reads the config file; a config with errors changes nothing.
func (d *daemon) Reload() (apitype.ReloadResult, error) {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	old := d.cfg.Load()
	cfg, err := config.Load(old.Path)
	if err != nil {
		return apitype.ReloadResult{}, apitype.Errorf(apitype.CodeInvalidArgument, "reload: %v", err)
	}
	cfg.StateDir = old.StateDir // the state dir holds our lock and socket; it cannot move under us
	if d.prefixer != nil {
		for _, s := range cfg.Services {
			if err := d.prefixer.Add(s.Name); err != nil {
				return apitype.ReloadResult{}, err
			}
		}
	}
	res := d.sup.Reload(cfg.Services)
	if d.prefixer != nil {
		for _, name := range res.Removed {
			d.prefixer.Remove(name)
		}
	}
	d.cfg.Store(cfg)
	d.log.Info("reloaded", "added", res.Added, "removed", res.Removed, "changed", res.Changed)
	return res, nil
}

func (d *daemon) Shutdown() { d.downOnce.Do(func() { close(d.done) }) }

func (d *daemon) Checkpoint(ctx context.Context) (apitype.CheckpointInfo, error) {
	return d.mem.checkpointNow(ctx)
}

func (d *daemon) SetState(name string, state []byte) error { return d.sup.SetBlob(name, state) }

func (d *daemon) SetSafeMode(on bool) error {
	if on {
		return d.sup.SetSafeMode(true, "operator: vigil safe-mode enter")
	}
	if err := d.noteSafeModeExit(time.Now()); err != nil {
		return apitype.Errorf(apitype.CodeUnavailable, "safe mode: recording the exit: %v", err)
	}
	return d.sup.SetSafeMode(false, "operator: vigil safe-mode exit")
}

// recoveryStage is the daemon's recovery stage for status: live unless a
// recovery runs or has failed.
func (d *daemon) recoveryStage() string {
	if d.recovery == nil {
		return string(recovery.Live)
	}
	st, err := d.recovery.Status()
	switch {
	case err != nil:
		return "unreadable"
	case st.Stage == recovery.Live && len(st.History) == 0 && d.recovering.Load():
		return string(recovery.Crashed) // due, and not begun yet
	}
	return string(st.Stage)
}

func (d *daemon) Recovery() (apitype.Recovery, error) {
	if d.recovery == nil {
		return apitype.Recovery{Stage: string(recovery.Live), History: []apitype.RecoveryTransition{}}, nil
	}
	st, err := d.recovery.Status()
	if err != nil {
		return apitype.Recovery{}, apitype.Errorf(apitype.CodeUnavailable, "recovery state: %v", err)
	}
	return recoveryView(st), nil
}

func (d *daemon) RetryRecovery(ctx context.Context) (apitype.Recovery, error) {
	if d.recovery == nil {
		return apitype.Recovery{}, apitype.Errorf(apitype.CodeUnavailable, "the daemon is still starting")
	}
	st, err := d.recovery.Retry(context.WithoutCancel(ctx))
	switch {
	case errors.Is(err, recovery.ErrNotFailed):
		return recoveryView(st), apitype.Errorf(apitype.CodeFailedPrecondition, "recovery is %s: nothing to retry", st.Stage)
	case err != nil:
		return recoveryView(st), apitype.Errorf(apitype.CodeFailedPrecondition, "%v", err)
	}
	return recoveryView(st), nil
}

func recoveryView(st recovery.State) apitype.Recovery {
	out := apitype.Recovery{Stage: string(st.Stage), Attempt: st.Attempt, LastError: st.LastError,
		StartedAt: st.StartedAt, History: []apitype.RecoveryTransition{}}
	for _, t := range st.History {
		out.History = append(out.History, apitype.RecoveryTransition{From: string(t.From), To: string(t.To),
			At: t.At, Attempt: t.Attempt, Error: t.Error})
	}
	return out
}

// restoreBlobs gives each service back the state it kept in the previous
// checkpoint.
func (d *daemon) restoreBlobs() {
	if d.mem.previous == nil {
		return
	}
	for _, s := range d.mem.previous.State.Services {
		if len(s.Blob) > 0 {
			if err := d.sup.SetBlob(s.Name, s.Blob); err != nil {
				d.log.Warn("checkpointed state not restored", "service", s.Name, "err", err)
			}
		}
	}
}

// printEvents writes vigil's own notices into the foreground output, in the
// same "name | line" shape as the services' output.
func (d *daemon) printEvents(sub *event.Subscription) {
	for e := range sub.C {
		var msg string
		switch e.Topic {
		case event.CrashDetected:
			msg = fmt.Sprintf("%s crashed: %s", e.Service, e.Exit.Summary())
		case event.BreakerTripped:
			msg = fmt.Sprintf("%s is failing in a loop: stopped, manual action required (vigil reset %s)", e.Service, e.Service)
		case event.CheckpointFailed:
			msg = "checkpoint failed: " + e.Message
		case event.JournalFailed:
			msg = "journal write failed: " + e.Message
		case event.JournalRepaired:
			msg = "journal repaired: " + e.Message
		case event.ServiceState:
			switch e.State {
			case "running":
				msg = fmt.Sprintf("%s running (pid %d)", e.Service, e.PID)
			case "backoff", "exited", "stopped":
				msg = fmt.Sprintf("%s %s", e.Service, e.State)
				if e.Reason != "" {
					msg += " (" + strings.ReplaceAll(e.Reason, "_", " ") + ")"
				}
			default:
				continue
			}
		default:
			continue
		}
		d.prefixer.Notice(e.Service, msg)
	}
}

// MakeStateDir creates dir with mode 0700 (and its parents) and refuses a
// state dir that is a symlink or that another user can write.
func MakeStateDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("daemon: state dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("daemon: state dir: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("daemon: state dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("daemon: state dir %s is not a directory (symlinks are refused)", dir)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("daemon: state dir %s belongs to uid %d, not to us (uid %d)", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("daemon: state dir: %w", err)
		}
	}
	return nil
}

// acquireLock takes the project's lock without waiting. The file is never
// removed or renamed, so the kernel lock on it is the only truth; the pid
// written inside is information for the error message, nothing more.
func acquireLock(stateDir string) (*os.File, error) {
	path := filepath.Join(stateDir, "daemon.lock")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("daemon: opening %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			info := strings.TrimSpace(string(holder))
			if info != "" {
				info = " (" + info + ")"
			}
			return nil, fmt.Errorf("%w%s: lock %s is held", ErrAlreadyRunning, info, path)
		}
		return nil, fmt.Errorf("daemon: locking %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = fmt.Fprintf(f, "pid %d since %s\n", os.Getpid(), time.Now().UTC().Format(time.RFC3339))
	return f, nil
}
