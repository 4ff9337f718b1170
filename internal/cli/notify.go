package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/vigil-dev/vigil/internal/notify"
)

func notifyCmd(g *globals) *cobra.Command {
	var ready, noBlock bool
	var status string
	var mainPID int
	cmd := &cobra.Command{
		Use:   "notify [--ready] [--status=TEXT] [KEY=VALUE…]",
		Short: "Send sd_notify messages to $NOTIFY_SOCKET, like systemd-notify (READY=1, WATCHDOG=1, STATUS=…)",
		RunE: func(cmd *cobra.Command, args []string) error {
			var lines []string
			if ready {
				lines = append(lines, "READY=1")
			}
			if status != "" {
				lines = append(lines, "STATUS="+status)
			}
			if mainPID != 0 {
				lines = append(lines, fmt.Sprintf("MAINPID=%d", mainPID))
			}
			for _, a := range args {
				if !strings.Contains(a, "=") {
					return usageError{fmt.Errorf("notify: %q is not KEY=VALUE", a)}
				}
				lines = append(lines, a)
			}
			if len(lines) == 0 {
				return usageError{errors.New("notify: nothing to send (give --ready, --status or KEY=VALUE)")}
			}
			payload := strings.Join(lines, "\n")
			if _, err := notify.Parse([]byte(payload)); err != nil {
				return usageError{err}
			}
			return notify.Send(os.Getenv("NOTIFY_SOCKET"), payload, !noBlock, 5*time.Second)
		},
	}
	cmd.Flags().BoolVar(&ready, "ready", false, "send READY=1")
	cmd.Flags().StringVar(&status, "status", "", "send STATUS=TEXT")
	cmd.Flags().IntVar(&mainPID, "pid", 0, "send MAINPID=PID")
	cmd.Flags().BoolVar(&noBlock, "no-block", false, "do not wait until the supervisor has read the message")
	return cmd
}
