package cli

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/api/apitype"
)

func sessionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session register|heartbeat|end|list",
		Short: "Register external processes and what they own, so nothing outlives its owner",
		Args:  exactArgs(0, "a subcommand: register, heartbeat, end or list"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageError{fmt.Errorf("session needs a subcommand: register, heartbeat, end or list")}
		},
	}
	var req apitype.SessionRequest
	register := &cobra.Command{
		Use:   "register --name NAME [--type T] [--pid PID] [--group PGID]... [--heartbeat DUR] [--stale-after DUR]",
		Short: "Register a session (default owner: the calling process's parent, a shell script) and print its id",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.Name == "" {
				return usageError{fmt.Errorf("session register needs --name")}
			}
			if req.PID == 0 {
				req.PID = os.Getppid() // `vigil session register` run by the owner itself
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.RegisterSession(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, s.ID)
			return nil
		},
	}
	register.Flags().StringVar(&req.Name, "name", "", "the session's name")
	register.Flags().StringVar(&req.Type, "type", "", `what it is, such as "agent" or "editor"`)
	register.Flags().IntVar(&req.PID, "pid", 0, "the owner's pid (default: the parent of this command)")
	register.Flags().IntSliceVar(&req.Groups, "group", nil, "a process group the session owns (repeatable)")
	register.Flags().DurationVar(&req.Heartbeat, "heartbeat", 0, "how often the owner heartbeats (default: sessions.heartbeat)")
	register.Flags().DurationVar(&req.StaleAfter, "stale-after", 0, "no heartbeat for this long is stale (default: sessions.stale_after)")

	idCmd := func(use, short, past string, call func(g *globals, cmd *cobra.Command, id string) error) *cobra.Command {
		return &cobra.Command{
			Use:   use + " ID",
			Short: short,
			Args:  exactArgs(1, "exactly one session id"),
			RunE: func(cmd *cobra.Command, args []string) error {
				if err := call(g, cmd, args[0]); err != nil {
					return err
				}
				if past != "" {
					fmt.Fprintf(g.stdout, "vigil: session %s: %s\n", args[0], past)
				}
				return nil
			},
		}
	}
	heartbeat := idCmd("heartbeat", "Tell the daemon the session's owner is alive", "", func(g *globals, cmd *cobra.Command, id string) error {
		c, err := g.client()
		if err != nil {
			return err
		}
		return c.HeartbeatSession(cmd.Context(), id)
	})
	end := idCmd("end", "End a session (what it owned is left to its owner)", "ended", func(g *globals, cmd *cobra.Command, id string) error {
		c, err := g.client()
		if err != nil {
			return err
		}
		return c.EndSession(cmd.Context(), id)
	})
	var asJSON bool
	list := &cobra.Command{
		Use:   "list [--json]",
		Short: "The registered sessions",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ss, err := c.Sessions(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g.stdout, ss)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tTYPE\tPID\tGROUPS\tLAST SEEN\tSTALE")
			now := time.Now()
			for _, s := range ss {
				var groups []string
				for _, gr := range s.Groups {
					groups = append(groups, fmt.Sprint(gr.PGID))
				}
				typ := s.Type
				if typ == "" {
					typ = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s ago\t%v\n", s.ID, s.Name, typ, s.PID, orDash(strings.Join(groups, ",")),
					human(now.Sub(s.LastSeen)), s.Stale)
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print the sessions as JSON")
	cmd.AddCommand(register, heartbeat, end, list)
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func gcCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "gc [--json]",
		Short: "Clean up now: remove dead owners' sessions and terminate what they owned",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.Cleanup(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g.stdout, res)
			}
			for _, r := range res.Removed {
				fmt.Fprintf(g.stdout, "removed %s (%s, owner pid %d): killed %d processes\n", r.Session.Name, r.Verdict, r.Session.PID, len(r.Killed))
			}
			for _, s := range res.Stale {
				fmt.Fprintf(g.stdout, "stale %s (owner pid %d): no heartbeat for %s\n", s.Name, s.PID, human(time.Since(s.LastSeen)))
			}
			fmt.Fprintf(g.stdout, "vigil: gc: %d sessions removed, %d stale, %d processes killed, %d free lock files removed\n",
				len(res.Removed), len(res.Stale), res.Killed, len(res.Locks))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was done as JSON")
	return cmd
}
