package cli

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/logs"
)

func logsCmd(g *globals) *cobra.Command {
	var n int
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs NAME [-n N] [-f]",
		Short: "Show a service's output (works without a daemon)",
		Args:  exactArgs(1, "exactly one service name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			name := args[0]
			if _, err := cfg.Lookup(name); err != nil {
				return err
			}
			lines, err := logs.Tail(cfg.StateDir, name, n, 1<<30)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			for _, l := range lines {
				fmt.Fprintln(g.stdout, l)
			}
			if !follow {
				return nil
			}
			ctx, stop := signalContext()
			defer stop()
			if err := logs.Follow(ctx, cfg.StateDir, name, g.stdout); err != nil && ctx.Err() == nil {
				return err
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "lines", "n", 100, "how many of the last lines to show")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new lines until interrupted")
	return cmd
}
