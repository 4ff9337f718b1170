package cli

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/checkpoint"
)

// checkpointStore opens the state dir's checkpoint files for reading. The
// config, when it loads, gives the age limit; with only --state-dir (or a
// config being edited) the default applies, so the files stay readable.
func (g *globals) checkpointStore() (*checkpoint.Store, error) {
	if cfg, err := g.load(); err == nil {
		return &checkpoint.Store{Dir: cfg.StateDir, MaxAge: cfg.Checkpoint.MaxAge}, nil
	} else if g.stateDir == "" {
		return nil, err
	}
	dir, err := g.stateDirOnly()
	if err != nil {
		return nil, err
	}
	return &checkpoint.Store{Dir: dir}, nil
}

func checkpointCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint show|verify|now",
		Short: "Inspect, verify or write the recovery checkpoint",
		Args:  exactArgs(0, "a subcommand: show, verify or now"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageError{fmt.Errorf("checkpoint needs a subcommand: show, verify or now")}
		},
	}
	cmd.AddCommand(checkpointShowCmd(g), checkpointVerifyCmd(g), checkpointNowCmd(g))
	return cmd
}

// shownCheckpoint is `checkpoint show --json`: the chosen checkpoint and
// what was wrong with the rest.
type shownCheckpoint struct {
	Path       string           `json:"path"`
	Generation uint64           `json:"generation"`
	WrittenAt  time.Time        `json:"written_at"`
	FellBack   bool             `json:"fell_back"`
	Problems   []string         `json:"problems"`
	Skipped    []string         `json:"skipped"`
	State      checkpoint.State `json:"state"`
}

func checkpointShowCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show [--json]",
		Short: "Print the checkpoint recovery would use (works without a daemon)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := g.checkpointStore()
			if err != nil {
				return err
			}
			l, err := s.Read()
			if errors.Is(err, checkpoint.ErrNotFound) {
				return fmt.Errorf("no checkpoint in %s yet: the daemon writes one every checkpoint.interval and on `vigil checkpoint now`", s.Dir)
			}
			if err != nil {
				return err
			}
			out := shownCheckpoint{Path: l.Path, Generation: l.Generation, WrittenAt: l.WrittenAt, FellBack: l.FellBack,
				Problems: []string{}, Skipped: []string{}, State: l.State}
			for _, p := range l.Problems {
				out.Problems = append(out.Problems, p.Error())
			}
			for _, e := range l.Skipped {
				out.Skipped = append(out.Skipped, e.Error())
			}
			if asJSON {
				return writeJSON(g.stdout, out)
			}
			for _, p := range out.Problems {
				fmt.Fprintf(g.stderr, "vigil: warning: %s\n", p)
			}
			for _, p := range out.Skipped {
				fmt.Fprintf(g.stderr, "vigil: warning: %s\n", p)
			}
			fmt.Fprintf(g.stdout, "%s: generation %d, written %s (%s ago)\n", l.Path, l.Generation,
				l.WrittenAt.Local().Format("2006-01-02 15:04:05.000"), human(time.Since(l.WrittenAt)))
			if l.State.SafeMode {
				fmt.Fprintln(g.stdout, "safe mode: on")
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tDESIRED\tSTATE\tPID\tSTART TIME\tPGID\tRESTARTS\tBREAKER\tLEASES\tBLOB")
			for _, sv := range l.State.Services {
				pid, start, pgid, leases := "-", "-", "-", 0
				if in := sv.Instance; in != nil {
					pid, start, pgid, leases = fmt.Sprint(in.PID), fmt.Sprint(in.StartTime), fmt.Sprint(in.PGID), len(in.Leases)
				}
				breaker := string(sv.Tracker.Breaker)
				if breaker == "" {
					breaker = "closed"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%dB\n", sv.Name, sv.Desired, sv.State, pid, start, pgid,
					sv.Restarts, breaker, leases, len(sv.Blob))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the checkpoint as JSON")
	return cmd
}

func checkpointVerifyCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "verify [--json]",
		Short: "Check both checkpoint files; exit 1 if any is damaged or none is valid (works without a daemon)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := g.checkpointStore()
			if err != nil {
				return err
			}
			r, readErr := s.Verify()
			bad := 0
			for _, f := range r.Files {
				if (f.Present && !f.Valid) || len(f.Skipped) > 0 {
					bad++
				}
			}
			if asJSON {
				if err := writeJSON(g.stdout, r); err != nil {
					return err
				}
			} else {
				for _, f := range r.Files {
					switch {
					case !f.Present:
						fmt.Fprintf(g.stdout, "%s: absent\n", f.Path)
					case f.Valid:
						fmt.Fprintf(g.stdout, "%s: ok: generation %d, %d services, %d bytes, written %s\n", f.Path, f.Generation,
							f.Services, f.Size, f.WrittenAt.Local().Format("2006-01-02 15:04:05"))
					default:
						fmt.Fprintf(g.stdout, "%s: BAD: %s\n", f.Path, oneLine(f.Problem))
					}
					for _, sk := range f.Skipped {
						fmt.Fprintf(g.stdout, "  %s\n", oneLine(sk))
					}
				}
				if r.Chosen != "" {
					fmt.Fprintf(g.stdout, "recovery would use %s\n", r.Chosen)
				}
			}
			switch {
			case errors.Is(readErr, checkpoint.ErrNotFound):
				return fmt.Errorf("no checkpoint in %s", s.Dir)
			case readErr != nil:
				return fmt.Errorf("no valid checkpoint in %s: recovery would start from the config alone", s.Dir)
			case bad > 0:
				return fmt.Errorf("%d checkpoint file(s) damaged; recovery would use %s", bad, r.Chosen)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

func checkpointNowCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "now [--json]",
		Short: "Have the daemon write a checkpoint now",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			info, err := c.Checkpoint(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g.stdout, info)
			}
			fmt.Fprintf(g.stdout, "vigil: checkpoint written: %s, generation %d, %d bytes in %.2fms\n",
				info.Path, info.Generation, info.Size, info.DurationMS)
			if info.Warning != "" {
				fmt.Fprintf(g.stderr, "vigil: warning: %s\n", info.Warning)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was written as JSON")
	return cmd
}
