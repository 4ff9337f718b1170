package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/api/apitype"
)

func statusCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [--json]",
		Short: "Show the state of every service",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			printStatus(g.stdout, st, time.Now())
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	return cmd
}

// printStatus renders the status table.
func printStatus(w io.Writer, st apitype.Status, now time.Time) {
	fmt.Fprintf(w, "vigil %s, daemon pid %d, up %s\n", st.Daemon.Version, st.Daemon.PID, human(now.Sub(st.Daemon.StartedAt)))
	if st.Daemon.SafeMode {
		fmt.Fprintln(w, "SAFE MODE: only essential services run (vigil safe-mode exit)")
	}
	if stage := st.Daemon.RecoveryStage; stage != "" && stage != "live" {
		fmt.Fprintf(w, "RECOVERING from the daemon's own crash: %s (vigil recovery status)\n", stage)
	}
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tPID\tUPTIME\tRESTARTS\tLAST EXIT\tBREAKER\tNOTE")
	for _, s := range st.Services {
		pid, uptime := "-", "-"
		if s.PID != 0 {
			pid = fmt.Sprint(s.PID)
		}
		if s.StartedAt != nil && s.PID != 0 {
			uptime = human(now.Sub(*s.StartedAt))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.Name, s.State, pid, uptime, s.Restarts,
			s.LastExit.Summary(), s.Breaker, note(s, now))
	}
	tw.Flush()
	// An empty NOTE still gets its column's padding; drop it.
	for _, line := range strings.Split(strings.TrimSuffix(table.String(), "\n"), "\n") {
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
}

func note(s apitype.Service, now time.Time) string {
	switch {
	case s.State == "failed":
		return "manual action required: vigil reset " + s.Name
	case s.NextRestartAt != nil:
		return "restart in " + human(s.NextRestartAt.Sub(now))
	case s.Reason != "" && s.State == "starting":
		return s.Reason
	}
	return ""
}

// human prints a duration the way people read uptimes: 3m12s, 2h5m, 4d3h.
func human(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}
