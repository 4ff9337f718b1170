// Package cli is vigil's command tree. Each command turns its flags into one
// API client call (or, for the read-only commands, a read of the state dir)
// and prints a table or JSON. Errors print as one line, `vigil: …`, with a
// non-zero exit: 1 for failures, 2 for usage mistakes.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/api/client"
	"github.com/vigil-dev/vigil/internal/config"
)

// usageError marks mistakes in how a command was called (exit 2).
type usageError struct{ error }

// Main runs vigil with os.Args and returns the process exit code.
func Main() int { return Run(os.Args[1:], os.Stdout, os.Stderr) }

// Run runs vigil with args, writing to stdout and stderr.
func Run(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ce config.Errors
	var ee exitError
	switch {
	case errors.As(err, &ee):
		// Already reported.
	case errors.As(err, &ce):
		for _, e := range ce {
			fmt.Fprintln(stderr, "vigil: "+oneLine(e.Error()))
		}
	default:
		fmt.Fprintln(stderr, "vigil: "+oneLine(err.Error()))
	}
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	if errors.As(err, &ee) {
		return int(ee)
	}
	return 1
}

// exitError carries a specific exit code whose message was already printed.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// globals are the root flags every command shares.
type globals struct {
	config   string
	stateDir string
	stdout   io.Writer
	stderr   io.Writer
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "vigil",
		Short:         "A crash-recovering process supervisor",
		SilenceUsage:  true,
		SilenceErrors: true,
		// Suggest commands within two edits (cobra's default distance).
		SuggestionsMinimumDistance: 2,
		// With Args set, cobra hands an unknown command to the root instead
		// of failing with a plain error, so it becomes a usage error (exit 2).
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				return usageError{fmt.Errorf(`unknown command %q; did you mean "%s"?`, args[0], strings.Join(s, `" or "`))}
			}
			return usageError{fmt.Errorf("unknown command %q; see vigil help", args[0])}
		},
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVarP(&g.config, "config", "c", "", "config file (default: vigil.toml, else Procfile, in the current directory)")
	root.PersistentFlags().StringVar(&g.stateDir, "state-dir", "", "state directory (default: the config's state_dir, .vigil beside it)")
	root.AddCommand(
		upCmd(g), downCmd(g), statusCmd(g),
		serviceCmd(g, "start", "Start a service (and what it depends on)", (*client.Client).Start),
		serviceCmd(g, "stop", "Stop a service; returns once it has stopped", (*client.Client).Stop),
		serviceCmd(g, "restart", "Restart a service (planned: never counted as a crash)", (*client.Client).Restart),
		serviceCmd(g, "reset", "Close a service's crash-loop breaker and start it again", (*client.Client).Reset),
		reloadCmd(g), logsCmd(g), checkCmd(g), versionCmd(g), notifyCmd(g),
		crashesCmd(g), eventsCmd(g), checkpointCmd(g), recoveryCmd(g), safeModeCmd(g), daemonCmd(g),
		lockCmd(g), sessionCmd(g), gcCmd(g),
		runCmd(g),
	)
	return root
}

// exactArgs is cobra.ExactArgs with a usage error and our wording.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s takes %s (usage: %s)", cmd.Name(), what, cmd.UseLine())}
		}
		return nil
	}
}

// configPath resolves the -c flag.
func (g *globals) configPath() (string, error) {
	if g.config != "" {
		return g.config, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return config.Find(wd)
}

// load reads and validates the config, with --state-dir applied.
func (g *globals) load() (*config.Config, error) {
	path, err := g.configPath()
	if err != nil {
		return nil, err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	if g.stateDir != "" {
		if cfg.StateDir, err = filepath.Abs(g.stateDir); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// stateDirOnly finds the state dir without needing a valid config when
// --state-dir is given: commands that only talk to a daemon work even while
// the config on disk is being edited.
func (g *globals) stateDirOnly() (string, error) {
	if g.stateDir != "" {
		return filepath.Abs(g.stateDir)
	}
	cfg, err := g.load()
	if err != nil {
		return "", err
	}
	return cfg.StateDir, nil
}

func (g *globals) client() (*client.Client, error) {
	dir, err := g.stateDirOnly()
	if err != nil {
		return nil, err
	}
	return &client.Client{SocketPath: filepath.Join(dir, "vigil.sock")}, nil
}

func serviceCmd(g *globals, verb, short string, call func(*client.Client, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:   verb + " NAME",
		Short: short,
		Args:  exactArgs(1, "exactly one service name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := call(c, cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "vigil: %s: %s\n", args[0], pastTense[verb])
			return nil
		},
	}
}

var pastTense = map[string]string{"start": "started", "stop": "stopped", "restart": "restarted", "reset": "reset"}

func reloadCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "reload",
		Short: "Apply config changes: new services start, removed ones stop, changed ones restart",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.Reload(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "vigil: reloaded: added %s, removed %s, changed %s, unchanged %d\n",
				list(res.Added), list(res.Removed), list(res.Changed), len(res.Unchanged))
			return nil
		},
	}
}

func list(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " ")
}

func downCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop every service (dependents first) and the daemon",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.Shutdown(cmd.Context()); err != nil {
				return err
			}
			deadline := time.Now().Add(timeout)
			for c.Ping(cmd.Context()) == nil {
				if time.Now().After(deadline) {
					return fmt.Errorf("the daemon still answers after %v", timeout)
				}
				time.Sleep(10 * time.Millisecond)
			}
			fmt.Fprintln(g.stdout, "vigil: stopped")
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for every service to stop")
	return cmd
}

func checkCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Validate the config; problems are printed as file:line:col: message",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := g.configPath()
			if err != nil {
				return err
			}
			cfg, err := config.Load(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "vigil: %s: OK (%d services)\n", path, len(cfg.Services))
			return nil
		},
	}
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print vigil's version",
		Args:  exactArgs(0, "no arguments"),
		Run:   func(cmd *cobra.Command, args []string) { fmt.Fprintln(g.stdout, "vigil", Version) },
	}
}
