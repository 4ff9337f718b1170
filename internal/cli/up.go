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
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/daemon"
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
				return runDetachedChild(g, path)
			case detach:
				return detachDaemon(g, path, timeout)
			}
			return runForeground(g, path)
		},
	}
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "run the daemon in the background; return once it answers")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "with -d: how long to wait for the daemon to answer")
	cmd.Flags().BoolVar(&child, "detached-child", false, "internal: be the detached daemon")
	_ = cmd.Flags().MarkHidden("detached-child")
	return cmd
}

// signalContext is cancelled by SIGINT or SIGTERM: a clean stop.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

func runForeground(g *globals, path string) error {
	ctx, stop := signalContext()
	defer stop()
	color := false
	if f, ok := g.stdout.(*os.File); ok {
		color = logs.ColorEnabled(f)
	}
	return daemon.Run(ctx, daemon.Options{
		ConfigPath: path,
		StateDir:   g.stateDir,
		Output:     g.stdout,
		Color:      color,
		Logger:     slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
}

// runDetachedChild is the daemon that `up -d` started: it reports start-up
// on readyFD, then runs until told to stop.
func runDetachedChild(g *globals, path string) error {
	ready := os.NewFile(readyFD, "ready")
	ctx, stop := signalContext()
	defer stop()
	return daemon.Run(ctx, daemon.Options{
		ConfigPath: path,
		StateDir:   g.stateDir,
		Logger:     slog.New(slog.NewTextHandler(g.stderr, nil)),
		Ready: func(err error) {
			if ready == nil {
				return
			}
			if err != nil {
				fmt.Fprintln(ready, oneLine(err.Error()))
			} else {
				fmt.Fprintln(ready, "ok")
			}
			ready.Close()
		},
	})
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
			fmt.Fprintf(g.stdout, "vigil: daemon started (pid %d)\n", pid)
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
