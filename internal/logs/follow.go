package logs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// maxPartial is the most of an unfinished line a reader holds back; beyond
// it the line is passed on in pieces.
const maxPartial = 64 << 10

// tailer reads what is appended to one log file, a whole line at a time.
type tailer struct {
	f       *os.File
	off     int64  // next byte to read
	partial []byte // an unfinished last line
	buf     []byte
}

// newTailer starts reading f at its current end.
func newTailer(f *os.File) (*tailer, error) {
	size, err := fileSize(f)
	if err != nil {
		return nil, err
	}
	return &tailer{f: f, off: size, buf: make([]byte, 32<<10)}, nil
}

// drain passes every line completed since the last call to emit (without
// its newline). It reads up to the size the file has when drain starts:
// anything appended later raises a new inotify event. A file shorter than
// what was read was rotated by copy-truncate, so reading restarts at 0 and
// the unfinished line is passed on as it is; its rest is in .1.
func (t *tailer) drain(emit func(line []byte) error) error {
	size, err := fileSize(t.f)
	if err != nil {
		return err
	}
	if size < t.off {
		if err := t.flush(emit); err != nil {
			return err
		}
		t.off = 0
	}
	for t.off < size {
		n, err := t.f.ReadAt(t.buf[:min(int64(len(t.buf)), size-t.off)], t.off)
		t.off += int64(n)
		if err := t.split(t.buf[:n], emit); err != nil {
			return err
		}
		if errors.Is(err, io.EOF) {
			return nil // shrank meanwhile; the next drain starts over
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (t *tailer) split(data []byte, emit func([]byte) error) error {
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		line := data[:i]
		if len(t.partial) > 0 {
			line = append(t.partial, line...)
			t.partial = t.partial[:0]
		}
		if err := emit(line); err != nil {
			return err
		}
		data = data[i+1:]
	}
	t.partial = append(t.partial, data...)
	for len(t.partial) > maxPartial {
		if err := emit(t.partial[:maxPartial]); err != nil {
			return err
		}
		t.partial = append(t.partial[:0], t.partial[maxPartial:]...)
	}
	return nil
}

// flush passes on an unfinished line, if there is one.
func (t *tailer) flush(emit func([]byte) error) error {
	if len(t.partial) == 0 {
		return nil
	}
	defer func() { t.partial = t.partial[:0] }()
	return emit(t.partial)
}

// Follow writes each line appended to service's live file after Follow
// starts to w, newline-terminated, until ctx is done, and then returns
// ctx.Err(). It waits on inotify, not by polling, and carries on across a
// copy-truncate rotation (seen as the file shrinking). An unfinished line is
// held back until its newline and written when ctx is done. It stays with
// the file it opened: a file deleted and created anew is not picked up.
func Follow(ctx context.Context, stateDir, service string, w io.Writer) error {
	return follow(ctx, stateDir, service, w, func() {})
}

// follow is Follow; ready is called once lines appended from then on are
// sure to be seen.
func follow(ctx context.Context, stateDir, service string, w io.Writer, ready func()) error {
	if err := checkName(service); err != nil {
		return err
	}
	path := Path(stateDir, service)
	f, err := openNoFollow(path, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	in, err := newInotify()
	if err != nil {
		return err
	}
	defer in.close()
	if _, err := in.add(path, unix.IN_MODIFY); err != nil {
		return err
	}
	t, err := newTailer(f) // after the watch: no append can fall between
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { in.close() })
	defer stop()
	ready()

	var out []byte
	emit := func(line []byte) error {
		out = append(append(out, line...), '\n')
		if len(out) < maxPartial {
			return nil
		}
		_, err := w.Write(out)
		out = out[:0]
		return err
	}
	write := func() error {
		if len(out) == 0 {
			return nil
		}
		_, err := w.Write(out)
		out = out[:0]
		return err
	}
	for {
		_, rerr := in.read()
		if rerr != nil && ctx.Err() == nil {
			return fmt.Errorf("logs: follow %s: %w", service, rerr)
		}
		if err := t.drain(emit); err != nil {
			return err
		}
		if rerr != nil {
			if err := t.flush(emit); err != nil {
				return err
			}
			if err := write(); err != nil {
				return err
			}
			return ctx.Err()
		}
		if err := write(); err != nil {
			return err
		}
	}
}
