package session

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ownerWatch tells when the owner has died.
type ownerWatch struct {
	gone chan struct{} // closed once the owner is gone; never, with no owner
	f    *os.File      // the owner's pidfd, nil when not watched
}

// watchOwner watches pid, which must be the guard's parent as first seen.
// With pid ≤ 0 (the guard is pid 1 of its namespace) there is no owner.
func watchOwner(pid int) (*ownerWatch, error) {
	w := &ownerWatch{gone: make(chan struct{})}
	if pid <= 0 {
		return w, nil
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err == unix.ESRCH {
		close(w.gone)
		return w, nil
	}
	if err != nil {
		return nil, fmt.Errorf("session: watch the owner (pid %d): pidfd_open: %w", pid, err)
	}
	// Had the owner died before the open, we would have been reparented
	// already, and the pid might now name a stranger. Checked after the
	// open: until we are reparented the owner cannot be reaped, so an
	// unchanged parent proves the pidfd is the owner's.
	if os.Getppid() != pid {
		unix.Close(fd)
		close(w.gone)
		return w, nil
	}
	w.f = os.NewFile(uintptr(fd), "pidfd")
	go func() {
		if waitReadable(w.f) {
			close(w.gone)
		}
	}()
	return w, nil
}

// stop ends the watch.
func (w *ownerWatch) stop() {
	if w.f != nil {
		w.f.Close()
	}
}

// waitReadable waits in the runtime's poller (no thread is blocked) until
// the pidfd f is readable, which is when its process has ended. It returns
// false when f was closed first.
func waitReadable(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	ended := false
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			return false
		}
		ended = n > 0 || err != nil
		return ended
	})
	return err == nil && ended
}
