package guardian

import (
	"context"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// seqpacketPair returns a connected SOCK_SEQPACKET pair, closed at the end
// of the test unless the caller hands an end to a Link.
func seqpacketPair(t *testing.T) (a, b int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fds[0], fds[1]
}

func recvMsg(t *testing.T, fd int) string {
	t.Helper()
	buf := make([]byte, 512)
	n, err := unix.Read(fd, buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

// Not parallel: Attach reads and changes the process environment.
func TestAttach(t *testing.T) {
	t.Run("no guardian", func(t *testing.T) {
		t.Setenv(EnvFD, "")
		if l, err := Attach(); l != nil || err != nil {
			t.Fatalf("Attach() = %v, %v; want nil, nil", l, err)
		}
	})
	t.Run("not a seqpacket socket", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer w.Close()
		for _, v := range []string{strconv.Itoa(int(r.Fd())), "x", "1"} {
			t.Setenv(EnvFD, v)
			if l, err := Attach(); l != nil || err == nil {
				t.Errorf("Attach() with %s=%s = %v, %v; want an error", EnvFD, v, l, err)
			}
		}
	})
	t.Run("link", func(t *testing.T) {
		ours, theirs := seqpacketPair(t)
		defer unix.Close(ours)
		unix.FcntlInt(uintptr(theirs), unix.F_SETFD, 0) // as inherited: not close-on-exec
		t.Setenv(EnvFD, strconv.Itoa(theirs))
		t.Setenv(EnvHeartbeat, "25ms")
		l, err := Attach()
		if err != nil || l == nil {
			t.Fatalf("Attach() = %v, %v", l, err)
		}
		defer l.Close()
		if v, ok := os.LookupEnv(EnvFD); ok {
			t.Errorf("%s=%s is still in the environment", EnvFD, v)
		}
		if flags, _ := unix.FcntlInt(uintptr(theirs), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC == 0 {
			t.Error("the link fd is not close-on-exec: services would inherit it")
		}
		if l.Interval() != 25*time.Millisecond {
			t.Errorf("Interval() = %v, want 25ms", l.Interval())
		}

		if err := l.Bye(); err != nil {
			t.Fatal(err)
		}
		if m := recvMsg(t, ours); m != "bye" {
			t.Errorf("got %q, want bye", m)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { l.Heartbeat(ctx, 0); close(done) }()
		for range 2 {
			if m := recvMsg(t, ours); m != "hb" {
				t.Errorf("got %q, want hb", m)
			}
		}
		cancel()
		<-done

		for _, m := range []string{"hello", "exit 12 1792", "exit x 1", "exit 13 9"} {
			unix.Write(ours, []byte(m))
		}
		for _, want := range []OrphanExit{{12, 7 << 8}, {13, syscall.WaitStatus(syscall.SIGKILL)}} {
			if got := <-l.Exits(); got != want {
				t.Errorf("Exits() gave %+v, want %+v", got, want)
			}
		}
		unix.Shutdown(ours, unix.SHUT_RDWR)
		if e, ok := <-l.Exits(); ok {
			t.Errorf("Exits() gave %+v after the guardian closed the link, want it closed", e)
		}
		if err := l.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
}

// Orphan exits queued while no daemon runs are bounded to the newest
// maxQueued and reach the next daemon in order, even when they do not fit in
// the socket buffer at once: flush never blocks, the rest stays queued.
func TestQueuedOrphanExitsReachTheNextDaemon(t *testing.T) {
	t.Parallel()
	g := &guardian{o: Options{}.withDefaults()}
	const n = maxQueued + 1000
	for pid := 1; pid <= n; pid++ {
		g.orphan(OrphanExit{PID: pid, Status: syscall.WaitStatus(pid % 256)})
	}
	if len(g.queue) != maxQueued || g.queue[0].PID != n-maxQueued+1 {
		t.Fatalf("queue has %d entries from pid %d, want the newest %d", len(g.queue), g.queue[0].PID, maxQueued)
	}

	ours, theirs := seqpacketPair(t)
	defer unix.Close(ours)
	g.d = &daemon{link: ours}
	unix.SetNonblock(theirs, true)
	l := newLink(theirs, time.Second)
	defer l.Close()

	g.flush()
	if len(g.queue) == 0 {
		t.Log("the socket buffer took every exit at once; the partial-flush path was not exercised")
	}
	want := n - maxQueued + 1
	deadline := time.After(waitLimit)
	for want <= n {
		select {
		case e := <-l.Exits():
			if e.PID != want || e.Status != syscall.WaitStatus(want%256) {
				t.Fatalf("got %+v, want pid %d", e, want)
			}
			want++
		case <-time.After(time.Millisecond):
			g.flush() // as Run's ticker does
		case <-deadline:
			t.Fatalf("received up to pid %d of %d", want-1, n)
		}
	}
	if len(g.queue) != 0 {
		t.Errorf("%d exits still queued", len(g.queue))
	}
}
