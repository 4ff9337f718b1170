package logs

import (
	"encoding/binary"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// inotify is one inotify instance. Its descriptor is non-blocking and lives
// in Go's poller, so close wakes a goroutine blocked in read.
type inotify struct {
	f   *os.File
	rc  syscall.RawConn
	buf []byte
}

type inotifyEvent struct {
	wd   int32
	mask uint32
}

func newInotify() (*inotify, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("logs: inotify_init1: %w", err)
	}
	f := os.NewFile(uintptr(fd), "inotify")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("logs: inotify: %w", err)
	}
	return &inotify{f: f, rc: rc, buf: make([]byte, 64<<10)}, nil
}

// add watches path (never through a symlink) for mask and returns the watch
// descriptor; watching the same file again returns the same descriptor.
func (in *inotify) add(path string, mask uint32) (int32, error) {
	var wd int
	var err error
	if cerr := in.rc.Control(func(fd uintptr) {
		wd, err = unix.InotifyAddWatch(int(fd), path, mask|unix.IN_DONT_FOLLOW)
	}); cerr != nil {
		return -1, fmt.Errorf("logs: watch %s: %w", path, cerr)
	}
	if err != nil {
		return -1, fmt.Errorf("logs: watch %s: %w", path, err)
	}
	return int32(wd), nil
}

// remove drops a watch. The kernel answers with IN_IGNORED for wd, which
// callers ignore because they have forgotten wd by then; inotify allocates
// descriptors cyclically, so wd is not soon reused.
func (in *inotify) remove(wd int32) {
	in.rc.Control(func(fd uintptr) {
		unix.InotifyRmWatch(int(fd), uint32(wd))
	})
}

// read blocks until events arrive or the instance is closed.
func (in *inotify) read() ([]inotifyEvent, error) {
	n, err := in.f.Read(in.buf)
	if err != nil {
		return nil, err
	}
	var evs []inotifyEvent
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		b := in.buf[off:]
		evs = append(evs, inotifyEvent{
			wd:   int32(binary.NativeEndian.Uint32(b[0:])),
			mask: binary.NativeEndian.Uint32(b[4:]),
		})
		off += unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[12:]))
	}
	return evs, nil
}

func (in *inotify) close() error { return in.f.Close() }
