package notify

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// Clients nobody here wrote must work unchanged: systemd's own
// systemd-notify and coreos/go-systemd.

const systemdNotify = "/usr/bin/systemd-notify"

// systemd-notify (v252 here) sends its message on behalf of its parent when
// it may (as root, with explicit SCM_CREDENTIALS), since it is usually run
// from the service's shell script; then, unless --no-block, it sends
// BARRIER=1 from itself and waits up to 5s for the passed fd to be closed,
// failing if it is not.
func TestSystemdNotifyCompat(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(systemdNotify); err != nil {
		t.Skip("systemd-notify not installed: apt-get install systemd")
	}
	for _, tc := range []struct {
		name string
		args []string
		want func(Message) bool
	}{
		{"ready", []string{"--ready", "--status=warming up"}, func(m Message) bool {
			return m.Ready && m.Status != nil && *m.Status == "warming up"
		}},
		{"watchdog", []string{"WATCHDOG=1"}, func(m Message) bool { return m.Watchdog }},
		{"lease", []string{"LEASE=job-17", "WATCHDOG_USEC=3000000"}, func(m Message) bool {
			return len(m.Leases) == 1 && m.Leases[0] == "job-17" && m.HasWatchdogUSec && m.WatchdogUSec == 3*time.Second
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, rec := listen(t, ServerOptions{})
			cmd := exec.Command(systemdNotify, tc.args...)
			cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+s.path)
			began := time.Now()
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("systemd-notify %v: %v: %s", tc.args, err, out)
			}
			// Without a barrier reply it would have waited 5s and failed.
			if took := time.Since(began); took > 3*time.Second {
				t.Errorf("systemd-notify took %v: the barrier was not answered promptly", took)
			}
			wantPID := cmd.Process.Pid
			if os.Geteuid() == 0 {
				wantPID = os.Getpid() // its parent, which it may claim as root
			}
			got := rec.waitMessage(t, "the message", func(r received) bool { return tc.want(r.msg) })
			if got.from.PID != wantPID {
				t.Errorf("message attributed to pid %d, want %d", got.from.PID, wantPID)
			}
			barrier := rec.waitMessage(t, "BARRIER=1", func(r received) bool { return r.msg.Barrier })
			if barrier.from.PID != cmd.Process.Pid {
				t.Errorf("barrier from pid %d, want systemd-notify's %d", barrier.from.PID, cmd.Process.Pid)
			}
			if st := s.Stats(); st.FDsClosed != 1 || st.Accepted != 2 {
				t.Errorf("Stats = %+v, want 2 accepted and the barrier fd closed", st)
			}
		})
	}
}

// A Go service using github.com/coreos/go-systemd/v22/daemon: SdWatchdogEnabled
// reads WATCHDOG_USEC (WATCHDOG_PID unset counts for any pid), SdNotify sends
// READY=1 and WATCHDOG=1 from the service's own pid.
func TestGoSystemdCompat(t *testing.T) {
	t.Parallel()
	s, rec := listen(t, ServerOptions{})
	cmd := runHelperOK(t, []string{"NOTIFY_SOCKET=" + s.path, "WATCHDOG_USEC=2000000"}, "go-systemd")
	ready := rec.waitMessage(t, "READY=1", func(r received) bool { return r.msg.Ready })
	ping := rec.waitMessage(t, "WATCHDOG=1", func(r received) bool { return r.msg.Watchdog })
	for _, r := range []received{ready, ping} {
		if r.from.PID != cmd.Process.Pid {
			t.Errorf("%q from pid %d, want the service's %d", r.msg.Assignments, r.from.PID, cmd.Process.Pid)
		}
	}
	if ready.msg.Status == nil || *ready.msg.Status != "serving" {
		t.Errorf("READY datagram status = %v, want serving", ready.msg.Status)
	}
}
