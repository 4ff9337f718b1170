package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/api/client"
	"github.com/vigil-dev/vigil/internal/daemon"
	"github.com/vigil-dev/vigil/internal/guardian"
	"github.com/vigil-dev/vigil/internal/logs"
)

// Version is vigil's version.
var Version = daemon.Version

// readyFD is the descriptor on which a detached daemon reports start-up:
// "ok\n", or the error that stopped it.
const readyFD = 3

func upCmd(g *globals) *cobra.Command {
	var detach, child bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "up [-d]",
		Short: "Run the project's services (in the foreground; -d detaches)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := g.configPath()
			if err != nil {
				return err
			}
			switch {
			case child:
				return runGuardian(g, path, true)
			case detach:
				return detachDaemon(g, path, timeout)
			}
			return runGuardian(g, path, false)
		},
	}
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "run the daemon in the background; return once it answers")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "with -d: how long to wait for the daemon to answer")
	cmd.Flags().BoolVar(&child, "detached-child", false, "internal: be the detached guardian")
	_ = cmd.Flags().MarkHidden("detached-child")
	return cmd
}

// daemonCmd is the daemon itself, started by the guardian (`vigil up`):
// hidden, since a daemon without its guardian is not restarted when it dies.
func daemonCmd(g *globals) *cobra.Command {
	var foreground, ready bool
	cmd := &cobra.Command{
		Use:    "daemon",
		Short:  "internal: the daemon, as the guardian starts it",
		Hidden: true,
		Args:   exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := g.configPath()
			if err != nil {
				return err
			}
			err = runDaemon(g, path, foreground, ready)
			if err != nil && !startedOnce.Load() {
				// It never got going: restarting would fail the same way.
				if !startFailureLogged.Load() {
					fmt.Fprintln(g.stderr, "vigil: "+oneLine(err.Error()))
				}
				return exitError(guardian.ExitNoRestart)
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&foreground, "foreground", false, "write the services' output, prefixed, to stdout")
	cmd.Flags().BoolVar(&ready, "ready-fd", false, "report start-up on fd 3 (the readiness pipe of up -d)")
	return cmd
}

// startedOnce is set once the daemon is ready: a later error is a crash.
var startedOnce atomic.Bool

// startFailureLogged is set once a start-up error is in the daemon's log.
var startFailureLogged atomic.Bool

// signalContext is cancelled by SIGINT or SIGTERM: a clean stop.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// runGuardian makes this process the guardian: it starts the daemon,
// restarts it when it dies, and records its crashes. Detached, the first
// daemon reports its start-up on readyFD.
func runGuardian(g *globals, path string, detached bool) error {
	cfg, err := g.load()
	if err != nil {
		return err
	}
	if err := daemon.MakeStateDir(cfg.StateDir); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{os.Args[0], "-c", path, "--state-dir", cfg.StateDir, "daemon"}
	opts := guardian.Options{
		Path:        exe,
		HistoryPath: filepath.Join(cfg.StateDir, daemon.HistoryFile),
		// A heartbeat every 5s keeps an idle daemon nearly asleep; a hung
		// one is restarted within 20s.
		HeartbeatInterval: 5 * time.Second,
		HeartbeatTimeout:  20 * time.Second,
		Stdout:            os.Stdout,
		Stderr:            os.Stderr,
		Logf: func(format string, a ...any) {
			fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("2006/01/02 15:04:05"), fmt.Sprintf(format, a...))
		},
	}
	if detached {
		opts.ExtraFiles, opts.ExtraFilesOnce = []*os.File{os.NewFile(readyFD, "ready")}, true
		args = append(args, "--ready-fd")
	} else {
		args = append(args, "--foreground")
		opts.Logf = nil // the terminal shows the services, not the guardian's notes
	}
	opts.Args = args
	ctx, stop := signalContext()
	defer stop()
	err = guardian.Run(ctx, opts)
	if err != nil && !detached {
		return exitError(1) // the daemon said why on stderr
	}
	return err
}

// runDaemon is the daemon the guardian started.
func runDaemon(g *globals, path string, foreground, readyFDGiven bool) error {
	ctx, stop := signalContext()
	defer stop()
	opts := daemon.Options{
		ConfigPath: path,
		StateDir:   g.stateDir,
		Logger:     slog.New(slog.NewTextHandler(g.stderr, nil)),
	}
	var ready *os.File
	if readyFDGiven {
		ready = os.NewFile(readyFD, "ready")
	}
	opts.Ready = func(err error) {
		if err == nil {
			startedOnce.Store(true)
		} else {
			// Logged before `up -d` hears of it, so that daemon.log has the
			// reason by the time up -d has returned.
			fmt.Fprintln(g.stderr, "vigil: "+oneLine(err.Error()))
			startFailureLogged.Store(true)
		}
		if ready == nil {
			return
		}
		if err != nil {
			fmt.Fprintln(ready, oneLine(err.Error()))
		} else {
			fmt.Fprintln(ready, "ok")
		}
		ready.Close()
	}
	if foreground {
		opts.Output = g.stdout
		if f, ok := g.stdout.(*os.File); ok {
			opts.Color = logs.ColorEnabled(f)
		}
		opts.Logger = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	}
	return daemon.Run(ctx, opts)
}

// detachDaemon starts this binary again as a daemon in a session of its own,
// with its output in <state>/daemon.log, and waits for it to say it is ready.
func detachDaemon(g *globals, path string, timeout time.Duration) error {
	cfg, err := g.load()
	if err != nil {
		return err
	}
	if err := daemon.MakeStateDir(cfg.StateDir); err != nil {
		return err
	}
	logPath := filepath.Join(cfg.StateDir, "daemon.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{os.Args[0], "-c", path, "--state-dir", cfg.StateDir, "up", "--detached-child"}
	// The guardian's notes and the daemon's log both go to daemon.log.
	p, err := os.StartProcess(exe, args, &os.ProcAttr{
		Files: []*os.File{devnull, logf, logf, pw},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	pw.Close()
	if err != nil {
		return fmt.Errorf("starting the daemon: %w", err)
	}
	pid := p.Pid
	// The daemon outlives us; nobody here waits for it.
	_ = p.Release()

	answer := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(pr).ReadString('\n')
		answer <- strings.TrimSpace(line)
	}()
	select {
	case a := <-answer:
		switch a {
		case "ok":
			// pid is the guardian's; the daemon is its child.
			if st, err := (&client.Client{SocketPath: filepath.Join(cfg.StateDir, "vigil.sock")}).Status(context.Background()); err == nil {
				fmt.Fprintf(g.stdout, "vigil: daemon started (pid %d, guardian pid %d)\n", st.Daemon.PID, pid)
			} else {
				fmt.Fprintf(g.stdout, "vigil: daemon started (guardian pid %d)\n", pid)
			}
			return nil
		case "":
			return fmt.Errorf("daemon exited during start-up; %s", lastLines(logPath, 5))
		}
		return errors.New(a)
	case <-time.After(timeout):
		return fmt.Errorf("the daemon (pid %d) did not answer within %v; see %s", pid, timeout, logPath)
	}
}

// lastLines summarises the end of the daemon's log on one line. The log
// grows across runs, so only its last 16 KiB are read.
func lastLines(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "no log at " + path
	}
	defer f.Close()
	const tailBytes = 16 << 10
	var r io.Reader = f
	if fi, err := f.Stat(); err == nil && fi.Size() > tailBytes {
		r = io.NewSectionReader(f, fi.Size()-tailBytes, tailBytes)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return fmt.Sprintf("reading %s: %v", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return path + " ends with: " + strings.Join(lines, " / ")
}
