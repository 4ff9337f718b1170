package logs

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Prefixer copies the output of several services to one writer, foreman
// style: each line as "name | line", names padded to one width, the prefix
// optionally coloured. It follows each file from where it was when Add was
// called. One goroutine, woken by one inotify instance, does all writing and
// writes only whole lines, so lines of different services never interleave.
type Prefixer struct {
	dir   string
	w     io.Writer
	color bool

	mu       sync.Mutex // guards the fields below and every write to w
	in       *inotify   // created by the first Add
	loopDone chan struct{}
	closed   bool
	sources  map[string]*source
	byWD     map[int32]*source
	width    int   // the longest name added so far; it never shrinks, so columns do not jump
	err      error // the first write error; nothing is written after it
	out      []byte
}

type source struct {
	service string
	wd      int32
	t       *tailer
}

// NewPrefixer returns a Prefixer writing to w; color adds ANSI colours (see
// ColorEnabled). It starts nothing until Add.
func NewPrefixer(stateDir string, w io.Writer, color bool) *Prefixer {
	return &Prefixer{dir: stateDir, w: w, color: color, sources: map[string]*source{}, byWD: map[int32]*source{}}
}

// Add starts copying service's output, from the current end of its file,
// which is created if missing. Adding a service twice is a no-op.
func (p *Prefixer) Add(service string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if p.sources[service] != nil {
		return nil
	}
	if p.in == nil {
		in, err := newInotify()
		if err != nil {
			return err
		}
		p.in, p.loopDone = in, make(chan struct{})
		go p.loop(in)
	}
	f, err := openLog(p.dir, service, unix.O_RDONLY|unix.O_CREAT)
	if err != nil {
		return err
	}
	wd, err := p.in.add(f.Name(), unix.IN_MODIFY)
	if err != nil {
		f.Close()
		return err
	}
	t, err := newTailer(f) // after the watch: no append can fall between
	if err != nil {
		p.in.remove(wd)
		f.Close()
		return err
	}
	s := &source{service: service, wd: wd, t: t}
	p.sources[service], p.byWD[wd] = s, s
	p.width = max(p.width, len(service))
	return nil
}

// Remove copies what service has written so far, including an unfinished
// last line, and stops following it.
func (p *Prefixer) Remove(service string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.sources[service]; s != nil {
		p.finish(s)
	}
}

// Close copies what every service has written so far, including unfinished
// last lines, stops, and returns the first error writing to w.
func (p *Prefixer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return p.err
	}
	p.closed = true
	for _, s := range p.sources {
		p.finish(s)
	}
	in, done := p.in, p.loopDone
	p.mu.Unlock()
	if in != nil {
		in.close()
		<-done
	}
	return p.err
}

// Notice writes one of vigil's own messages as "vigil | msg". When about
// is a followed service, its output so far is copied first, so a crash
// notice comes after the service's last words rather than before them.
func (p *Prefixer) Notice(about, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.err != nil {
		return
	}
	if s := p.sources[about]; s != nil {
		p.copy(s, false)
	}
	p.width = max(p.width, len(noticeName))
	name := noticeName + strings.Repeat(" ", p.width-len(noticeName))
	line := name + " | " + msg + "\n"
	if p.color {
		line = "\x1b[1m" + name + " |\x1b[0m " + msg + "\n"
	}
	if _, err := io.WriteString(p.w, line); err != nil {
		p.err = fmt.Errorf("logs: prefixer notice: %w", err)
	}
}

// noticeName prefixes vigil's own lines in the foreground output.
const noticeName = "vigil"

// finish copies the rest of s and forgets it; p.mu is held.
func (p *Prefixer) finish(s *source) {
	p.copy(s, true)
	p.in.remove(s.wd)
	s.t.f.Close()
	delete(p.sources, s.service)
	delete(p.byWD, s.wd)
}

func (p *Prefixer) loop(in *inotify) {
	defer close(p.loopDone)
	for {
		evs, err := in.read()
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				slog.Error("logs: prefixer stopped", "err", err)
			}
			return
		}
		p.mu.Lock()
		for _, ev := range evs {
			if ev.mask&unix.IN_Q_OVERFLOW != 0 { // events were lost: any file may have grown
				for _, s := range p.sources {
					p.copy(s, false)
				}
			} else if s := p.byWD[ev.wd]; s != nil {
				p.copy(s, false)
			}
		}
		p.mu.Unlock()
	}
}

// copy writes s's new complete lines to w, and with all its unfinished
// line too; p.mu is held.
func (p *Prefixer) copy(s *source, all bool) {
	if p.err != nil {
		return
	}
	prefix := p.prefix(s.service)
	emit := func(line []byte) error {
		p.out = append(append(append(p.out, prefix...), line...), '\n')
		if len(p.out) < maxPartial {
			return nil
		}
		return p.write()
	}
	err := s.t.drain(emit)
	if err == nil && all {
		err = s.t.flush(emit)
	}
	if err == nil {
		err = p.write()
	}
	if err != nil && p.err == nil {
		p.err = fmt.Errorf("logs: prefixer %s: %w", s.service, err)
	}
	p.out = p.out[:0]
}

func (p *Prefixer) write() error {
	if len(p.out) == 0 {
		return nil
	}
	_, err := p.w.Write(p.out)
	p.out = p.out[:0]
	return err
}

// palette holds the prefix colours (ANSI SGR codes), as foreman's.
var palette = []string{"36", "33", "32", "35", "34", "31", "96", "93", "92", "95", "94", "91"}

// prefix is "name | " padded to the current width, coloured if asked.
func (p *Prefixer) prefix(service string) string {
	name := service + strings.Repeat(" ", p.width-len(service))
	if !p.color {
		return name + " | "
	}
	return "\x1b[" + colorOf(service) + "m" + name + " |\x1b[0m "
}

// colorOf picks service's colour from its name alone, so a service keeps
// its colour across runs and whatever else runs beside it.
func colorOf(service string) string {
	h := fnv.New32a()
	h.Write([]byte(service))
	return palette[h.Sum32()%uint32(len(palette))]
}

// ColorEnabled reports whether output to f should be coloured: f is a
// terminal and NO_COLOR is unset or empty (https://no-color.org).
func ColorEnabled(f *os.File) bool {
	if os.Getenv("NO_COLOR") != "" {
		return false
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	tty := false
	rc.Control(func(fd uintptr) {
		_, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
		tty = err == nil
	})
	return tty
}
