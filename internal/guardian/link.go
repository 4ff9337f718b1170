package guardian

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// OrphanExit is the exit of an orphan the guardian reaped: a process the
// previous daemon started that outlived it (an adopted service instance).
type OrphanExit struct {
	PID    int
	Status syscall.WaitStatus
}

// Link is the daemon's end of the link to its guardian. Its methods are safe
// for concurrent use.
type Link struct {
	f        *os.File
	interval time.Duration
	exits    chan OrphanExit
	done     chan struct{}
	once     sync.Once
}

// Attach returns the daemon's end of the link to its guardian, or nil, nil
// when EnvFD is unset (the daemon runs without a guardian). It marks the fd
// close-on-exec and removes EnvFD and EnvHeartbeat from the environment so
// that no process the daemon starts inherits either; call it before starting
// any. A second call therefore returns nil, nil.
func Attach() (*Link, error) {
	v := os.Getenv(EnvFD)
	if v == "" {
		return nil, nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("guardian: bad %s=%q", EnvFD, v)
	}
	if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil {
		return nil, fmt.Errorf("guardian: %s=%d: %w", EnvFD, fd, err)
	} else if typ != unix.SOCK_SEQPACKET {
		return nil, fmt.Errorf("guardian: %s=%d is not a SOCK_SEQPACKET socket", EnvFD, fd)
	}
	interval := time.Second
	if d, err := time.ParseDuration(os.Getenv(EnvHeartbeat)); err == nil && d > 0 {
		interval = d
	}
	unix.CloseOnExec(fd)
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("guardian: link fd %d: %w", fd, err)
	}
	os.Unsetenv(EnvFD)
	os.Unsetenv(EnvHeartbeat)
	return newLink(fd, interval), nil
}

// newLink makes a Link of fd, a non-blocking SOCK_SEQPACKET socket.
func newLink(fd int, interval time.Duration) *Link {
	l := &Link{f: os.NewFile(uintptr(fd), "guardian-link"), interval: interval,
		exits: make(chan OrphanExit, 64), done: make(chan struct{})}
	go l.read()
	return l
}

func (l *Link) read() {
	defer close(l.exits)
	buf := make([]byte, 512)
	for {
		n, err := l.f.Read(buf)
		if err != nil {
			return
		}
		e, ok := parseExit(string(buf[:n]))
		if !ok {
			continue // unknown message
		}
		select {
		case l.exits <- e:
		case <-l.done:
			return
		}
	}
}

// Interval is the heartbeat interval the guardian asked for (EnvHeartbeat;
// 1s if unset).
func (l *Link) Interval() time.Duration { return l.interval }

// Heartbeat sends "hb" now and then every every (Interval if every <= 0)
// until ctx is done or the link is closed. The guardian counts the silence
// from the daemon's start, so start it (or Beat) early, before any slow
// recovery. A daemon that wants its heartbeat to prove more than that the
// process is scheduled calls Beat from its event loop instead.
func (l *Link) Heartbeat(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = l.interval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := l.Beat(); errors.Is(err, os.ErrClosed) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-l.done:
			return
		case <-t.C:
		}
	}
}

// Beat sends one heartbeat.
func (l *Link) Beat() error { return l.send("hb") }

// Stopping tells the guardian that the daemon is stopping every service on
// purpose: should it die before Bye, the guardian ends what it left
// instead of restarting it.
func (l *Link) Stopping() error { return l.send("stopping") }

// Bye tells the guardian that the daemon is about to exit on purpose; an
// exit with code 0 after it ends the guardian instead of a restart.
func (l *Link) Bye() error { return l.send("bye") }

// Exits delivers the exits of orphans the guardian reaped, including those
// reaped before this daemon started. It is closed when the link ends. While
// it is not drained the guardian queues what does not fit in the socket (the
// newest 4096) and sends it later, to this daemon or the next.
func (l *Link) Exits() <-chan OrphanExit { return l.exits }

// Close closes the link. The guardian then sees no more heartbeats.
func (l *Link) Close() error {
	err := os.ErrClosed
	l.once.Do(func() {
		close(l.done)
		err = l.f.Close()
	})
	return err
}

func (l *Link) send(msg string) error {
	if _, err := l.f.Write([]byte(msg)); err != nil {
		return fmt.Errorf("guardian: send %q: %w", msg, err)
	}
	return nil
}

// parseExit parses "exit <pid> <status>".
func parseExit(msg string) (OrphanExit, bool) {
	f := strings.Fields(msg)
	if len(f) != 3 || f[0] != "exit" {
		return OrphanExit{}, false
	}
	pid, err1 := strconv.Atoi(f[1])
	ws, err2 := strconv.ParseUint(f[2], 10, 32)
	if err1 != nil || err2 != nil || pid <= 0 {
		return OrphanExit{}, false
	}
	return OrphanExit{PID: pid, Status: syscall.WaitStatus(ws)}, true
}
