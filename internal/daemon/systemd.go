package daemon

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/vigil-dev/vigil/internal/notify"
	"github.com/vigil-dev/vigil/internal/supervisor"
)

// parentNotifier speaks sd_notify to whatever supervises vigil itself:
// systemd with Type=notify (and NotifyAccess=all, since the daemon is a
// child of the guardian that systemd started). The socket and watchdog
// interval are read once, at start, before any service could inherit them.
type parentNotifier struct {
	socket   string
	watchdog time.Duration // 0: no watchdog asked for
}

func newParentNotifier() *parentNotifier {
	n := &parentNotifier{socket: os.Getenv("NOTIFY_SOCKET")}
	if n.socket == "" {
		return nil
	}
	if usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64); err == nil && usec > 0 {
		n.watchdog = time.Duration(usec) * time.Microsecond
	}
	return n
}

func (n *parentNotifier) send(payload string) error {
	if n == nil {
		return nil
	}
	return notify.Send(n.socket, payload, false, time.Second)
}

// ready says the daemon is up, with what it supervises as STATUS=.
func (n *parentNotifier) ready(services int, safeMode bool) error {
	status := fmt.Sprintf("supervising %d services", services)
	if safeMode {
		status += " (SAFE MODE: essential services only)"
	}
	return n.send("READY=1\nSTATUS=" + status)
}

// watch sends WATCHDOG=1 at half the interval while the supervisor's loop
// answers, until ctx is done: a wedged loop stops the heartbeat, and
// systemd restarts vigil as it would any hung service.
func (n *parentNotifier) watch(ctx context.Context, sup *supervisor.Supervisor) {
	if n == nil || n.watchdog <= 0 {
		return
	}
	every := n.watchdog / 2
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if sup.Answers(every) {
			_ = n.send("WATCHDOG=1")
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
