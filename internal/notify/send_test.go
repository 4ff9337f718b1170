package notify

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The barrier returns once the server has closed the passed fd, by which
// time Handle has seen everything sent before it. (The fd is closed before
// the BARRIER=1 datagram itself is handled.)
func TestSendBarrier(t *testing.T) {
	t.Parallel()
	s, rec := listen(t, ServerOptions{})
	if err := Send(s.path, "READY=1\nSTATUS=up", true, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	got := rec.all() // no waiting: the barrier reply is the synchronisation
	if len(got) == 0 || !got[0].msg.Ready {
		t.Fatalf("handled before the barrier returned: %+v, want READY=1", got)
	}
	if got[0].from.PID != os.Getpid() {
		t.Errorf("sender pid = %d, want ours %d", got[0].from.PID, os.Getpid())
	}
	rec.waitMessage(t, "BARRIER=1", func(r received) bool { return r.msg.Barrier })
	if st := s.Stats(); st.FDsClosed != 1 {
		t.Errorf("FDsClosed = %d, want 1", st.FDsClosed)
	}
	// A barrier alone, as sd_notify_barrier sends it.
	if err := Send(s.path, "", true, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// The barrier from a child process (what `vigil notify --barrier`-style
// callers do) also completes.
func TestSendBarrierFromChild(t *testing.T) {
	t.Parallel()
	s, rec := listen(t, ServerOptions{})
	cmd := runHelperOK(t, []string{"NOTIFY_SOCKET=" + s.path}, "send", "WATCHDOG=1", "barrier")
	got := rec.all()
	if len(got) == 0 || !got[0].msg.Watchdog || got[0].from.PID != cmd.Process.Pid {
		t.Errorf("handled = %+v, want the child's WATCHDOG=1 before its barrier returned", got)
	}
}

// A receiver that never reads never closes the fd: Send gives up at the timeout.
func TestSendBarrierTimeout(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "deaf.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	const timeout = 100 * time.Millisecond
	began := time.Now()
	err = Send(path, "READY=1", true, timeout)
	took := time.Since(began)
	if !errors.Is(err, ErrBarrierTimeout) {
		t.Fatalf("Send = %v, want ErrBarrierTimeout", err)
	}
	if took < timeout || took > timeout+time.Second {
		t.Errorf("gave up after %v, want about %v", took, timeout)
	}
}

func TestSendAbstractSocket(t *testing.T) {
	t.Parallel()
	name := fmt.Sprintf("@vigil-notify-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := Send(name, "READY=1", false, time.Second); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
	if err != nil || string(buf[:n]) != "READY=1" {
		t.Errorf("abstract socket got %q, %v", buf[:n], err)
	}
}

func TestSendErrors(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "missing.sock")
	for _, tc := range []struct {
		env, payload string
		want         error
	}{
		{"", "READY=1", ErrNoSocket},
		{"relative.sock", "READY=1", ErrAddress},
		{"vsock:2:1234", "READY=1", ErrAddress},
		{"/x.sock", strings.Repeat("x", MaxDatagram+1), ErrTooLarge},
		{"/x.sock", "", ErrEmpty},
		{missing, "READY=1", unix.ENOENT},
	} {
		if err := Send(tc.env, tc.payload, false, time.Second); !errors.Is(err, tc.want) {
			t.Errorf("Send(%q, %.10q) = %v, want %v", tc.env, tc.payload, err, tc.want)
		}
	}
}
