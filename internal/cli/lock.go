package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/daemon"
	"github.com/vigil-dev/vigil/internal/lock"
)

// The lock commands work on the state dir directly, with no daemon: a
// lock is a kernel flock on <state>/locks/NAME.lock (see package lock).

// lockSignals are forwarded to the command `vigil lock` runs; while it
// still waits for the lock, they end the wait.
var lockSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

func lockCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "lock NAME [--timeout DUR] -- CMD [ARG...]",
		Short: "Run a command holding a named lock that dies with its holder (works without a daemon)",
		Long: `Run CMD while holding the lock NAME, waiting for it first if another process
holds it, and exit with CMD's exit status (128+N if a signal N killed it).

A lock is a kernel flock(2) on <state dir>/locks/NAME.lock: it is released the
moment its holders are gone, however they die, even by SIGKILL. CMD inherits it
as file descriptor 3 (VIGIL_LOCK_FD=3, VIGIL_LOCK=NAME), so the lock stays held
for as long as CMD, or anything it passed the descriptor on to, still runs,
even if vigil lock itself is killed. SIGINT, SIGTERM and SIGHUP are passed on
to CMD.

--timeout bounds the wait (0: try once); without it vigil lock waits as long
as it takes. When the lock cannot be had it exits 1 and says who holds it.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 || len(args) < 2 {
				return usageError{fmt.Errorf("lock takes a lock name, then -- and the command to run (usage: %s)", cmd.UseLine())}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runLocked(g, cmd, args[0], timeout, args[1:])
		},
	}
	cmd.PersistentFlags().DurationVar(&timeout, "timeout", 0, `how long to wait for the lock, such as "30s"; 0 tries once (default: no limit)`)
	cmd.AddCommand(lockListCmd(g, func(cmd *cobra.Command, name string, argv []string) error {
		return runLocked(g, cmd, name, timeout, argv)
	}))
	return cmd
}

// runLocked takes the lock name, runs argv holding it and returns with its
// exit status.
func runLocked(g *globals, cmd *cobra.Command, name string, timeout time.Duration, argv []string) error {
	if err := lock.ValidName(name); err != nil {
		return usageError{err}
	}
	wait := timeout
	if !cmd.Flags().Changed("timeout") {
		wait = -1 // forever
	} else if timeout < 0 {
		return usageError{fmt.Errorf("lock: --timeout must not be negative (%v)", timeout)}
	}
	state, err := g.stateDirOnly()
	if err != nil {
		return err
	}
	if err := daemon.MakeStateDir(state); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, lockSignals...)
	defer signal.Stop(sigs)

	l, sig, err := acquireLock(lock.Dir(state), name, wait, sigs)
	if sig != nil {
		return exitError(128 + int(sig.(syscall.Signal)))
	}
	if err != nil {
		return err
	}
	// Close, not Release: whatever CMD left running with fd 3 keeps the
	// lock, as with flock(1).
	defer l.Close()
	return runHolding(g, l, argv, sigs)
}

// acquireLock takes the lock, trying once when wait is 0, waiting at most
// wait when it is positive and for as long as it takes when negative. A
// signal in sigs ends the wait: then it returns that signal and no lock.
func acquireLock(dir, name string, wait time.Duration, sigs <-chan os.Signal) (*lock.Lock, os.Signal, error) {
	if wait == 0 {
		l, err := lock.TryAcquire(dir, name)
		return l, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if wait > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), wait)
	}
	defer cancel()
	var got os.Signal
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		select {
		case got = <-sigs:
			cancel()
		case <-stop:
		}
	}()
	l, err := lock.Acquire(ctx, dir, name)
	close(stop)
	<-done
	if got != nil {
		if l != nil {
			l.Release()
		}
		return nil, got, nil
	}
	return l, nil, err
}

// runHolding runs argv with the lock's descriptor as its fd 3, passes
// signals on, and returns its exit status as an exitError.
func runHolding(g *globals, l *lock.Lock, argv []string, sigs <-chan os.Signal) error {
	c := exec.Command(argv[0], argv[1:]...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, g.stdout, g.stderr
	c.ExtraFiles = []*os.File{l.File()}
	c.Env = append(os.Environ(), "VIGIL_LOCK="+l.Name(), "VIGIL_LOCK_FD=3")
	if err := c.Start(); err != nil {
		// The shell's codes: 127 not found, 126 found but not runnable.
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = 127
		}
		fmt.Fprintf(g.stderr, "vigil: lock %q: %s\n", l.Name(), oneLine(err.Error()))
		return exitError(code)
	}
	waited := make(chan error, 1)
	go func() { waited <- c.Wait() }()
	for {
		select {
		case s := <-sigs:
			c.Process.Signal(s)
		case err := <-waited:
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				return fmt.Errorf("lock %q: %s: %w", l.Name(), argv[0], err)
			}
			ws := c.ProcessState.Sys().(syscall.WaitStatus)
			switch {
			case ws.Signaled():
				return exitError(128 + int(ws.Signal()))
			case ws.ExitStatus() != 0:
				return exitError(ws.ExitStatus())
			}
			return nil
		}
	}
}

// lockListCmd is `vigil lock list`. Since "list" is also a valid lock
// name, `vigil lock list -- CMD` runs CMD holding the lock "list".
func lockListCmd(g *globals, runNamed func(cmd *cobra.Command, name string, argv []string) error) *cobra.Command {
	var asJSON bool
	named := func(cmd *cobra.Command, args []string) bool { return cmd.ArgsLenAtDash() == 0 && len(args) > 0 }
	cmd := &cobra.Command{
		Use:   "list [--json]",
		Short: "List the locks: held or free, the holder's pid and start time, how long it has held it",
		Args: func(cmd *cobra.Command, args []string) error {
			if named(cmd, args) {
				return nil
			}
			return exactArgs(0, "no arguments")(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if named(cmd, args) {
				return runNamed(cmd, "list", args)
			}
			state, err := g.stateDirOnly()
			if err != nil {
				return err
			}
			locks, err := lock.List(lock.Dir(state), time.Now())
			if err != nil {
				return err
			}
			if asJSON {
				if locks == nil {
					locks = []lock.Status{}
				}
				return writeJSON(g.stdout, locks)
			}
			if len(locks) == 0 {
				fmt.Fprintln(g.stdout, "no locks")
				return nil
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tPID\tSTARTED\tAGE\tPATH")
			for _, s := range locks {
				pid, started, age := "-", "-", "-"
				if s.State == "held" {
					pid = "?"
				}
				if s.PID != 0 {
					pid = strconv.Itoa(s.PID)
					if s.Exited {
						pid += " (exited)"
					}
				}
				if !s.StartedAt.IsZero() {
					started = s.StartedAt.Local().Format(time.DateTime)
				}
				if !s.Since.IsZero() {
					age = (time.Duration(s.AgeMS) * time.Millisecond).Truncate(time.Second).String()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.State, pid, started, age, s.Path)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of locks")
	return cmd
}
