package notify

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Errors from Send.
var (
	ErrNoSocket       = errors.New("notify: NOTIFY_SOCKET is not set")
	ErrAddress        = errors.New("notify: NOTIFY_SOCKET is neither an absolute path nor an @abstract name")
	ErrBarrierTimeout = errors.New("notify: timed out waiting for the barrier reply")
)

// Send sends payload as one datagram to the socket named by socketEnv (the
// value of $NOTIFY_SOCKET: an absolute path, or "@name" for an abstract
// socket), like sd_notify(3); the kernel attaches our credentials. With
// barrier it then sends BARRIER=1 with one end of a pipe and waits until the
// receiver has closed it, like sd_notify_barrier(3): the receiver has then
// handled everything sent before. An empty payload with barrier sends only
// the barrier. timeout bounds each send and the wait; zero means no bound.
// It returns ErrNoSocket when socketEnv is empty.
func Send(socketEnv string, payload string, barrier bool, timeout time.Duration) error {
	switch {
	case socketEnv == "":
		return ErrNoSocket
	case socketEnv[0] != '/' && socketEnv[0] != '@':
		return fmt.Errorf("%w: %q", ErrAddress, socketEnv)
	case len(payload) > MaxDatagram:
		return ErrTooLarge
	case payload == "" && !barrier:
		return ErrEmpty
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("notify: socket: %w", err)
	}
	defer unix.Close(fd)
	if timeout > 0 {
		tv := unix.NsecToTimeval(timeout.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
			return fmt.Errorf("notify: SO_SNDTIMEO: %w", err)
		}
	}
	to := &unix.SockaddrUnix{Name: socketEnv} // a leading '@' means abstract
	if payload != "" {
		if err := unix.Sendmsg(fd, []byte(payload), nil, to, unix.MSG_NOSIGNAL); err != nil {
			return fmt.Errorf("notify: send to %s: %w", socketEnv, err)
		}
	}
	if !barrier {
		return nil
	}
	return sendBarrier(fd, to, socketEnv, timeout)
}

// sendBarrier passes the write end of a fresh pipe with BARRIER=1, drops its
// own copy, and waits for POLLHUP on the read end: the receiver's close.
func sendBarrier(fd int, to *unix.SockaddrUnix, name string, timeout time.Duration) error {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("notify: barrier pipe: %w", err)
	}
	defer unix.Close(p[0])
	err := unix.Sendmsg(fd, []byte("BARRIER=1"), unix.UnixRights(p[1]), to, unix.MSG_NOSIGNAL)
	unix.Close(p[1])
	if err != nil {
		return fmt.Errorf("notify: send barrier to %s: %w", name, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		wait := -1
		if timeout > 0 {
			left := time.Until(deadline)
			if left <= 0 {
				return ErrBarrierTimeout
			}
			wait = int(left.Milliseconds()) + 1
		}
		pfd := []unix.PollFd{{Fd: int32(p[0])}}
		n, err := unix.Poll(pfd, wait)
		switch {
		case errors.Is(err, unix.EINTR):
		case err != nil:
			return fmt.Errorf("notify: barrier poll: %w", err)
		case n > 0 && pfd[0].Revents&unix.POLLHUP != 0:
			return nil
		}
	}
}
