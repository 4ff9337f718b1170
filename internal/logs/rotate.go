package logs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// checkInterval is the least time between two size checks of one file.
const checkInterval = 250 * time.Millisecond

// Rotator rotates service log files that outgrow Limits.MaxSize. One inotify
// instance watches every file for IN_MODIFY; a write after a quiet spell is
// checked at once, and the writes of a busy service cost one deferred check
// per interval (a one-shot timer armed only by a write), so an idle service
// costs nothing at all.
type Rotator struct {
	dir      string
	lim      Limits
	interval time.Duration
	onCheck  func(service string, at time.Time) // test hook; nil in production
	in       *inotify
	loopDone chan struct{}

	rotating sync.Mutex // serialises rotations, from events and RotateIfNeeded alike

	mu      sync.Mutex // guards the fields below
	closed  bool
	watches map[string]*watch
	byWD    map[int32]*watch
	checks  sync.WaitGroup // deferred checks in flight
}

type watch struct {
	service string
	wd      int32
	gate    gate
	timer   *time.Timer // armed while gate.pending
}

// NewRotator starts a rotator for the logs under stateDir. Call Watch for
// each service whose file exists, and Close when done.
func NewRotator(stateDir string, lim Limits) (*Rotator, error) {
	return newRotator(stateDir, lim, checkInterval, nil)
}

func newRotator(stateDir string, lim Limits, interval time.Duration, onCheck func(string, time.Time)) (*Rotator, error) {
	in, err := newInotify()
	if err != nil {
		return nil, err
	}
	r := &Rotator{
		dir:      stateDir,
		lim:      lim.withDefaults(),
		interval: interval,
		onCheck:  onCheck,
		in:       in,
		loopDone: make(chan struct{}),
		watches:  map[string]*watch{},
		byWD:     map[int32]*watch{},
	}
	go r.loop()
	return r, nil
}

// Watch starts watching service's live file, which must exist. Watching a
// watched service again is a no-op, unless the file was replaced, in which
// case the new file is watched instead of the old one.
func (r *Rotator) Watch(service string) error {
	if err := checkName(service); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	wd, err := r.in.add(Path(r.dir, service), unix.IN_MODIFY)
	if err != nil {
		return err
	}
	w := r.watches[service]
	switch {
	case w == nil:
		w = &watch{service: service, wd: wd}
		r.watches[service] = w
	case w.wd != wd:
		r.in.remove(w.wd)
		delete(r.byWD, w.wd)
		w.wd = wd
	}
	r.byWD[wd] = w
	return nil
}

// Unwatch stops watching service's file; RotateIfNeeded still works on it.
func (r *Rotator) Unwatch(service string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.watches[service]
	if w == nil {
		return
	}
	r.in.remove(w.wd)
	r.forget(w)
}

// forget drops w's bookkeeping; r.mu is held.
func (r *Rotator) forget(w *watch) {
	delete(r.byWD, w.wd)
	delete(r.watches, w.service)
	if w.timer != nil {
		w.timer.Stop()
	}
}

// Close stops watching and waits until no check is running.
func (r *Rotator) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	for _, w := range r.watches {
		r.forget(w)
	}
	r.mu.Unlock()
	err := r.in.close()
	<-r.loopDone
	r.checks.Wait()
	if err != nil {
		return fmt.Errorf("logs: close inotify: %w", err)
	}
	return nil
}

func (r *Rotator) loop() {
	defer close(r.loopDone)
	for {
		evs, err := r.in.read()
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				slog.Error("logs: rotator stopped", "err", err)
			}
			return
		}
		for _, ev := range evs {
			r.handle(ev)
		}
	}
}

func (r *Rotator) handle(ev inotifyEvent) {
	now := time.Now()
	r.mu.Lock()
	var due []string
	switch {
	case ev.mask&unix.IN_Q_OVERFLOW != 0: // events were lost: any file may have grown
		for _, w := range r.watches {
			if r.modified(w, now) {
				due = append(due, w.service)
			}
		}
	case r.byWD[ev.wd] == nil:
	case ev.mask&unix.IN_IGNORED != 0: // the file is gone
		r.forget(r.byWD[ev.wd])
	default:
		if w := r.byWD[ev.wd]; r.modified(w, now) {
			due = append(due, w.service)
		}
	}
	r.mu.Unlock()
	for _, service := range due {
		r.check(service, now)
	}
}

// modified passes a write seen at now to w's gate, arms the deferred check
// if the gate says so, and reports whether to check now. r.mu is held.
func (r *Rotator) modified(w *watch, now time.Time) (checkNow bool) {
	checkNow, wait := w.gate.modified(now, r.interval)
	if wait > 0 {
		w.timer = time.AfterFunc(wait, func() { r.deferred(w) })
	}
	return checkNow
}

func (r *Rotator) deferred(w *watch) {
	r.mu.Lock()
	if r.closed || r.watches[w.service] != w {
		r.mu.Unlock()
		return
	}
	now := time.Now()
	w.gate.fired(now)
	w.timer = nil
	r.checks.Add(1)
	r.mu.Unlock()
	defer r.checks.Done()
	r.check(w.service, now)
}

func (r *Rotator) check(service string, at time.Time) {
	if r.onCheck != nil {
		r.onCheck(service, at)
	}
	if _, err := r.RotateIfNeeded(service); err != nil {
		slog.Warn("logs: rotation failed", "service", service, "err", err)
	}
}

// gate spaces one file's size checks at least an interval apart.
type gate struct {
	last    time.Time // when the file was last checked
	pending bool      // a deferred check is armed
}

// modified takes a write seen at now and says whether to check at once or,
// if the last check was too recent, after wait. It says neither while a
// deferred check is armed: that check will see this write too.
func (g *gate) modified(now time.Time, interval time.Duration) (checkNow bool, wait time.Duration) {
	if g.pending {
		return false, 0
	}
	since := now.Sub(g.last)
	if since >= interval {
		g.last = now
		return true, 0
	}
	g.pending = true
	return false, interval - since
}

// fired records that the deferred check ran at now.
func (g *gate) fired(now time.Time) {
	g.pending = false
	g.last = now
}

// RotateIfNeeded rotates service's live file if it is larger than MaxSize
// and reports whether it did. A missing file needs no rotation.
func (r *Rotator) RotateIfNeeded(service string) (rotated bool, err error) {
	if err := checkName(service); err != nil {
		return false, err
	}
	r.rotating.Lock()
	defer r.rotating.Unlock()
	return rotate(Path(r.dir, service), r.lim)
}

// catchUps bounds how often rotate copies what was appended during its own
// copying before it truncates; a writer faster than the copy loses the rest.
const catchUps = 3

// rotate is copy-truncate: the live file's content goes to .1 (split into
// pieces .1, .2, … when it is a burst), older files move up, the live file
// is truncated. lim has its defaults applied.
func rotate(live string, lim Limits) (bool, error) {
	f, err := openNoFollow(live, unix.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	size, err := fileSize(f)
	if err != nil || size <= lim.MaxSize {
		return false, err
	}
	spans, err := planSpans(f, size, lim)
	if err != nil {
		return false, err
	}
	if err := shift(live, len(spans), lim.MaxFiles); err != nil {
		return false, err
	}
	// The oldest piece first, so that .1 is still open for the catch-up.
	var newest *os.File
	for k := len(spans); k >= 1; k-- {
		dst, err := copySpan(f, rotatedPath(live, k), spans[k-1])
		if err != nil {
			return false, err
		}
		if k > 1 {
			if err := dst.Close(); err != nil {
				return false, fmt.Errorf("logs: close %s: %w", dst.Name(), err)
			}
		} else {
			newest = dst
		}
	}
	defer newest.Close()
	for end, i := size, 0; i < catchUps; i++ {
		now, err := fileSize(f)
		if err != nil {
			return false, err
		}
		if now <= end {
			break
		}
		if err := copyTo(newest, f, end, now-end); err != nil {
			return false, err
		}
		end = now
	}
	if err := f.Truncate(0); err != nil {
		return false, fmt.Errorf("logs: truncate %s: %w", live, err)
	}
	if err := newest.Close(); err != nil {
		return false, fmt.Errorf("logs: close %s: %w", newest.Name(), err)
	}
	return true, nil
}

// span is the byte range [off, end) of the live file.
type span struct{ off, end int64 }

// planSpans cuts the first size bytes of f into the pieces that become .1,
// .2, … (newest first): at most MaxSize bytes each, starting at a line
// where a newline is near, and at most MaxFiles of them, older bytes being
// dropped. A remainder of MaxSize/MaxFiles or less stays with the piece
// after it rather than taking a file of its own.
func planSpans(f *os.File, size int64, lim Limits) ([]span, error) {
	var spans []span
	for end := size; end > 0 && len(spans) < lim.MaxFiles; {
		off := end - lim.MaxSize
		if off <= lim.MaxSize/int64(lim.MaxFiles) {
			off = 0
		}
		if off > 0 {
			var err error
			if off, err = lineStart(f, off, end); err != nil {
				return nil, err
			}
		}
		spans = append(spans, span{off, end})
		end = off
	}
	return spans, nil
}

// lineStart returns the first line start in f at or after off (0 < off <
// end), looking up to 64 KiB ahead, and off itself if it finds none before
// end: a line that long is cut.
func lineStart(f *os.File, off, end int64) (int64, error) {
	from := off - 1 // a newline just before off makes off a line start
	buf := make([]byte, min(64<<10, end-from))
	if _, err := f.ReadAt(buf, from); err != nil {
		return 0, fmt.Errorf("logs: read %s at %d: %w", f.Name(), from, err)
	}
	if i := bytes.IndexByte(buf, '\n'); i >= 0 && from+int64(i)+1 < end {
		return from + int64(i) + 1, nil
	}
	return off, nil
}

// shift makes room for by new files: .k becomes .k+by, and files that would
// go past .maxFiles are removed.
func shift(live string, by, maxFiles int) error {
	for k := maxFiles; k >= 1; k-- {
		old := rotatedPath(live, k)
		var err error
		if k+by > maxFiles {
			err = os.Remove(old)
		} else {
			err = os.Rename(old, rotatedPath(live, k+by))
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("logs: rotate: %w", err)
		}
	}
	return nil
}

// copySpan creates path and copies s of src into it.
func copySpan(src *os.File, path string, s span) (*os.File, error) {
	dst, err := openNoFollow(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := copyTo(dst, src, s.off, s.end-s.off); err != nil {
		dst.Close()
		return nil, err
	}
	return dst, nil
}

// copyTo appends n bytes of src from off to dst, in the kernel where it can.
func copyTo(dst, src *os.File, off, n int64) error {
	if _, err := src.Seek(off, io.SeekStart); err != nil {
		return fmt.Errorf("logs: seek %s: %w", src.Name(), err)
	}
	if _, err := io.CopyN(dst, src, n); err != nil {
		return fmt.Errorf("logs: copy %s to %s at %d: %w", src.Name(), dst.Name(), off, err)
	}
	return nil
}
