package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/api/client"
	"github.com/vigil-dev/vigil/internal/session"
)

// runCmd is `vigil run -- CMD…`: CMD runs in a process group of its own and
// never outlives the caller of `vigil run`. See package session for the
// contract; in short: the caller's death stops CMD's group (SIGTERM, SIGKILL
// after --grace), so does CMD's own exit for whatever it left running,
// signals to vigil run are forwarded, and vigil run exits with CMD's status
// (128 + the signal that killed it). It needs no daemon.
func runCmd(g *globals) *cobra.Command {
	var name string
	var heartbeat, grace time.Duration
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARG…]",
		Short: "Run CMD so that it never outlives the process that started vigil run",
		Long: `Run CMD in a process group of its own so that it never outlives its owner, the
process that started vigil run (an agent, an editor, a shell script): when the
owner dies, CMD's whole group gets SIGTERM, then SIGKILL after --grace. When CMD
exits, anything it left running in its group is stopped the same way, and vigil
run exits with CMD's status (128 + the signal number when a signal killed it).
SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to the group.
CMD sees VIGIL_SESSION_NAME (--name, default the base name of CMD). A command
that cannot be started exits 127 (not found) or 126 (not executable).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			switch {
			case dash < 0 || dash > 0:
				return usageError{fmt.Errorf("run takes the command after -- (usage: %s)", cmd.UseLine())}
			case len(args) == 0:
				return usageError{fmt.Errorf("run: no command after -- (usage: %s)", cmd.UseLine())}
			case grace < 0:
				return usageError{fmt.Errorf("run: --grace must not be negative, not %v", grace)}
			case heartbeat <= 0:
				return usageError{fmt.Errorf("run: --heartbeat must be positive, not %v", heartbeat)}
			}
			if grace == 0 {
				grace = time.Nanosecond // SIGKILL right after SIGTERM
			}
			stdout, flushOut, err := asFile(g.stdout, os.Stdout)
			if err != nil {
				return err
			}
			defer flushOut()
			stderr, flushErr, err := asFile(g.stderr, os.Stderr)
			if err != nil {
				return err
			}
			defer flushErr()
			exit, err := session.Run(cmd.Context(), session.Config{
				Args:      args,
				Name:      name,
				Stdin:     os.Stdin,
				Stdout:    stdout,
				Stderr:    stderr,
				Grace:     grace,
				Heartbeat: heartbeat,
				Registrar: sessionRegistrar(g),
				Log: slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{
					Level: slog.LevelWarn,
					ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
						if len(groups) == 0 && a.Key == slog.TimeKey {
							return slog.Attr{}
						}
						return a
					},
				})),
			})
			var se *session.StartError
			switch {
			case errors.As(err, &se):
				why := "command not found"
				if !errors.Is(se.Err, session.ErrNotFound) {
					why = se.Err.Error()
				}
				fmt.Fprintf(g.stderr, "vigil: %s: %s\n", se.Name, why)
				return exitError(se.Code())
			case err != nil:
				return err
			case exit.Code != 0:
				return exitError(exit.Code)
			}
			return nil
		},
	}
	// Everything after CMD is CMD's, never vigil's.
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().StringVar(&name, "name", "", "the session's name, given to CMD as VIGIL_SESSION_NAME (default: the base name of CMD)")
	cmd.Flags().DurationVar(&heartbeat, "heartbeat", session.DefaultHeartbeat, "with a daemon running: how often the session tells it that it is alive")
	cmd.Flags().DurationVar(&grace, "grace", session.DefaultGrace, "how long CMD's group has between SIGTERM and SIGKILL")
	return cmd
}

// sessionRegistrar registers the session with the project's daemon when
// one answers (nil when none does: the session guards CMD alone). The
// registered owner is the guard itself and CMD's group what it owns, so
// that if the guard is SIGKILLed the daemon's cleanup ends the group.
func sessionRegistrar(g *globals) session.Registrar {
	dir, err := g.stateDirOnly()
	if err != nil {
		return nil
	}
	c := &client.Client{SocketPath: filepath.Join(dir, "vigil.sock")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if c.Ping(ctx) != nil {
		return nil
	}
	return daemonRegistrar{c}
}

// daemonRegistrar is a session.Registrar backed by the daemon's registry.
type daemonRegistrar struct{ c *client.Client }

func (r daemonRegistrar) Register(ctx context.Context, info session.Info) (string, error) {
	s, err := r.c.RegisterSession(ctx, apitype.SessionRequest{Name: info.Name, Type: "run",
		PID: info.Guard.PID, StartTime: info.Guard.StartTime, Groups: []int{info.PGID}, Heartbeat: info.Heartbeat})
	return s.ID, err
}

func (r daemonRegistrar) Heartbeat(ctx context.Context, id string) error {
	return r.c.HeartbeatSession(ctx, id)
}

func (r daemonRegistrar) End(ctx context.Context, id string, _ session.Exit) error {
	return r.c.EndSession(ctx, id)
}

// asFile returns w as a file CMD can inherit: w itself when it is one (the
// usual case, os.Stdout or os.Stderr), else a pipe copied into w; wait
// waits for the copy once CMD and its group are gone.
func asFile(w io.Writer, std *os.File) (f *os.File, wait func(), err error) {
	if f, ok := w.(*os.File); ok {
		return f, func() {}, nil
	}
	if w == nil {
		return std, func() {}, nil
	}
	r, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("run: %w", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { io.Copy(w, r); r.Close() })
	return pw, func() { pw.Close(); wg.Wait() }, nil
}
