package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/journal"
)

// The journal commands read the state dir directly, like fsck: they work
// with no daemon running, which is when people need them most.

func (g *globals) journalReader() (*journal.Reader, error) {
	dir, err := g.stateDirOnly()
	if err != nil {
		return nil, err
	}
	return &journal.Reader{Dir: filepath.Join(dir, "journal")}, nil
}

// newest reads records q selects; a journal not yet created is empty.
func (g *globals) newest(q journal.Query) ([]journal.Record, error) {
	rd, err := g.journalReader()
	if err != nil {
		return nil, err
	}
	recs, probs, err := rd.Newest(q)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	for _, p := range probs {
		fmt.Fprintf(g.stderr, "vigil: warning: %v\n", p)
	}
	return recs, nil
}

func sinceFlag(since time.Duration) time.Time {
	if since <= 0 {
		return time.Time{}
	}
	return time.Now().Add(-since)
}

func decodeEvent(r journal.Record) (event.Event, error) {
	var e event.Event
	if err := json.Unmarshal(r.Payload, &e); err != nil {
		return e, fmt.Errorf("journal: record %d: %w", r.Seq, err)
	}
	e.Seq = r.Seq // the journal's sequence, not the daemon run's
	return e, nil
}

func crashesCmd(g *globals) *cobra.Command {
	var since time.Duration
	var n int
	var asJSON, output bool
	cmd := &cobra.Command{
		Use:   "crashes [NAME] [--since DUR] [-n N] [--json] [-o]",
		Short: "List recorded crashes, newest first (works without a daemon)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageError{fmt.Errorf("crashes takes at most one service name (usage: %s)", cmd.UseLine())}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			q := journal.Query{Types: []journal.Type{journal.TypeCrash}, Since: sinceFlag(since), Limit: n}
			if len(args) == 1 {
				// A cheap byte test first: only candidates are decoded.
				key, _ := json.Marshal(args[0])
				needle := append([]byte(`"service":`), key...)
				q.Match = func(r journal.Record) bool {
					if !bytes.Contains(r.Payload, needle) {
						return false
					}
					e, err := decodeEvent(r)
					return err == nil && e.Crash != nil && e.Crash.Service == args[0]
				}
			}
			recs, err := g.newest(q)
			if err != nil {
				return err
			}
			crashes := make([]apitype.Crash, 0, len(recs))
			for _, r := range recs {
				e, err := decodeEvent(r)
				if err != nil || e.Crash == nil {
					fmt.Fprintf(g.stderr, "vigil: warning: journal record %d is not a crash record\n", r.Seq)
					continue
				}
				c := *e.Crash
				c.Seq = r.Seq
				crashes = append(crashes, c)
			}
			if len(crashes) == 0 && len(args) == 1 {
				// A typo must not pass for a service that never crashed. A
				// name the config no longer has may still have records, so
				// this is only asked when there are none.
				if cfg, err := g.load(); err == nil {
					if _, err := cfg.Lookup(args[0]); err != nil {
						return err
					}
				}
			}
			if asJSON {
				return writeJSON(g.stdout, crashes)
			}
			if len(crashes) == 0 {
				fmt.Fprintln(g.stdout, "no crashes recorded")
				return nil
			}
			for _, c := range crashes {
				fmt.Fprintf(g.stdout, "%s  %s  pid %d  %s  up %s  %s",
					c.Exit.At.Local().Format("2006-01-02 15:04:05.000"), c.Service, c.PID, c.Exit.Summary(),
					(time.Duration(c.UptimeMS) * time.Millisecond).String(), c.Action)
				if len(c.Leases) > 0 {
					fmt.Fprintf(g.stdout, "  leases: %s", strings.Join(c.Leases, ","))
				}
				fmt.Fprintln(g.stdout)
				if output {
					for _, l := range c.Output {
						fmt.Fprintf(g.stdout, "    | %s\n", l)
					}
				}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&since, "since", 0, `only crashes within this long ago, such as "1h"`)
	cmd.Flags().IntVarP(&n, "lines", "n", 20, "how many crashes at most (0: all)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of crash records")
	cmd.Flags().BoolVarP(&output, "output", "o", false, "show each crash's last lines of output")
	return cmd
}

func eventsCmd(g *globals) *cobra.Command {
	var since time.Duration
	var n int
	var asJSON, follow bool
	cmd := &cobra.Command{
		Use:   "events [--since DUR] [-n N] [-f] [--json]",
		Short: "Show journaled events, newest first; -f follows new ones (works without a daemon)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			recs, err := g.newest(journal.Query{Types: []journal.Type{journal.TypeEvent, journal.TypeCrash},
				Since: sinceFlag(since), Limit: n})
			if err != nil {
				return err
			}
			show := func(r journal.Record) error {
				e, err := decodeEvent(r)
				if err != nil {
					fmt.Fprintf(g.stderr, "vigil: warning: %v\n", err)
					return nil
				}
				if asJSON {
					b, _ := json.Marshal(e)
					_, err = fmt.Fprintf(g.stdout, "%s\n", b)
					return err
				}
				_, err = fmt.Fprintln(g.stdout, formatEvent(e))
				return err
			}
			if !follow {
				for _, r := range recs {
					if err := show(r); err != nil {
						return err
					}
				}
				return nil
			}
			// Following reads like tail -f: oldest first, then each new one.
			var last uint64
			for i := len(recs) - 1; i >= 0; i-- {
				show(recs[i])
				last = recs[i].Seq
			}
			rd, err := g.journalReader()
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			if last == 0 {
				// Nothing shown yet: start after whatever is there now.
				if newest, _, _ := rd.Newest(journal.Query{Limit: 1}); len(newest) == 1 {
					last = newest[0].Seq
				}
			}
			return rd.Follow(ctx, last, 0, func(r journal.Record) {
				if r.Type == journal.TypeEvent || r.Type == journal.TypeCrash {
					show(r)
				}
			})
		},
	}
	cmd.Flags().DurationVar(&since, "since", 0, `only events within this long ago, such as "10m"`)
	cmd.Flags().IntVarP(&n, "lines", "n", 50, "how many events at most (0: all)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events until interrupted")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per event")
	return cmd
}

// formatEvent is an event on one line: when, journal seq, topic, what.
func formatEvent(e event.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  #%d  %-18s", e.Time.Local().Format("2006-01-02 15:04:05.000"), e.Seq, e.Topic)
	if e.Service != "" {
		fmt.Fprintf(&b, "  %s", e.Service)
	}
	switch {
	case e.Topic == event.CrashDetected:
		fmt.Fprintf(&b, "  pid %d  %s", e.PID, e.Exit.Summary())
		if e.Crash != nil {
			fmt.Fprintf(&b, "  %s", e.Crash.Action)
		}
	case e.From != "" || e.State != "":
		fmt.Fprintf(&b, "  %s → %s", e.From, e.State)
		if e.PID != 0 {
			fmt.Fprintf(&b, "  pid %d", e.PID)
		}
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, "  (%s)", e.Reason)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, "  %s", e.Message)
	}
	return strings.TrimRight(b.String(), " ")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
