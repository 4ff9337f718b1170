package cli

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/api/apitype"
)

func recoveryCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "recovery status|retry",
		Short: "Show or retry the daemon's own recovery after it crashed",
		Args:  exactArgs(0, "a subcommand: status or retry"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageError{fmt.Errorf("recovery needs a subcommand: status or retry")}
		},
	}
	var asJSON bool
	status := &cobra.Command{
		Use:   "status [--json]",
		Short: "The recovery stage, its attempts and its history",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			st, err := c.Recovery(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g.stdout, st)
			}
			printRecovery(g, st)
			return nil
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print the recovery state as JSON")
	retry := &cobra.Command{
		Use:   "retry",
		Short: "Resume a recovery whose stage failed",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			st, err := c.RetryRecovery(cmd.Context())
			if err != nil {
				return err
			}
			printRecovery(g, st)
			return nil
		},
	}
	cmd.AddCommand(status, retry)
	return cmd
}

func printRecovery(g *globals, st apitype.Recovery) {
	switch {
	case st.Stage == "live" && len(st.History) == 0:
		fmt.Fprintln(g.stdout, "recovery: live (no recovery in progress)")
		return
	case st.LastError != "":
		fmt.Fprintf(g.stdout, "recovery: %s (attempt %d): %s\n", st.Stage, st.Attempt, st.LastError)
	default:
		fmt.Fprintf(g.stdout, "recovery: %s (attempt %d)\n", st.Stage, st.Attempt)
	}
	for _, t := range st.History {
		line := fmt.Sprintf("  %s  %s → %s  attempt %d", t.At.Local().Format("15:04:05.000"), t.From, t.To, t.Attempt)
		if t.Error != "" {
			line += "  " + t.Error
		}
		fmt.Fprintln(g.stdout, line)
	}
}

func safeModeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "safe-mode enter|exit",
		Short: "Run only essential services (enter), or every service again (exit)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 || (args[0] != "enter" && args[0] != "exit") {
				return usageError{fmt.Errorf("safe-mode takes enter or exit (usage: %s)", cmd.UseLine())}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			on := args[0] == "enter"
			if err := c.SetSafeMode(cmd.Context(), on); err != nil {
				return err
			}
			if on {
				fmt.Fprintln(g.stdout, "vigil: safe mode on: only essential services run (vigil safe-mode exit brings the rest back)")
			} else {
				fmt.Fprintln(g.stdout, "vigil: safe mode off: every service runs again")
			}
			return nil
		},
	}
	return cmd
}
