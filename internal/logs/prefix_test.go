package logs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// appendTo opens service's log for appending, as a child would write it.
func appendTo(t *testing.T, state, service string) func(string) {
	t.Helper()
	f, err := OpenForChild(state, service)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return func(s string) {
		t.Helper()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPrefixerFormat(t *testing.T) {
	t.Parallel()
	for _, color := range []bool{false, true} {
		t.Run(fmt.Sprint("color=", color), func(t *testing.T) {
			t.Parallel()
			state := t.TempDir()
			web := appendTo(t, state, "web")
			web("written before Add\n")
			out := newSyncBuffer()
			p := NewPrefixer(state, out, color)
			defer p.Close()
			for _, s := range []string{"web", "worker", "web"} {
				if err := p.Add(s); err != nil {
					t.Fatal(err)
				}
			}
			worker := appendTo(t, state, "worker") // Add created the file
			web("hello\n")
			out.waitFor(t, "web's line", func(s string) bool { return strings.Count(s, "\n") == 1 })
			worker("hi there\n")
			got := out.waitFor(t, "worker's line", func(s string) bool { return strings.Count(s, "\n") == 2 })
			want := "web    | hello\nworker | hi there\n"
			if color {
				want = "\x1b[33mweb    |\x1b[0m hello\n\x1b[91mworker |\x1b[0m hi there\n"
			}
			if got != want {
				t.Errorf("output %q, want %q", got, want)
			}
		})
	}
}

func TestPrefixerHoldsPartialLines(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	out := newSyncBuffer()
	p := NewPrefixer(state, out, false)
	defer p.Close()
	for _, s := range []string{"a", "b"} {
		if err := p.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	a, b := appendTo(t, state, "a"), appendTo(t, state, "b")

	// a's event is queued before b's and handled first, so once b's line is
	// out, a's partial line has been read and must have been held back.
	a("begin-")
	b("other\n")
	out.waitFor(t, "b's line", func(s string) bool { return strings.Contains(s, "b | other\n") })
	if got := out.String(); got != "b | other\n" {
		t.Fatalf("output %q: a's unfinished line was not held", got)
	}
	a("end\n")
	out.waitFor(t, "a's line", func(s string) bool { return s == "b | other\na | begin-end\n" })

	a("cut off")
	p.Remove("a")
	if got := out.String(); got != "b | other\na | begin-end\na | cut off\n" {
		t.Errorf("after Remove: %q, want the unfinished line flushed", got)
	}
	a("after remove\n")
	b("last\n")
	got := out.waitFor(t, "b's last line", func(s string) bool { return strings.HasSuffix(s, "b | last\n") })
	if strings.Contains(got, "after remove") {
		t.Errorf("a was still followed after Remove: %q", got)
	}
}

// TestPrefixerNoInterleaving has two real processes write long lines at
// once; every output line must be one whole line of one of them.
func TestPrefixerNoInterleaving(t *testing.T) {
	t.Parallel()
	const count, size = 2000, 3000 // lines span pages, so reads see half lines
	state := t.TempDir()
	out := newSyncBuffer()
	p := NewPrefixer(state, out, false)
	defer p.Close()
	var cmds []*os.File
	for _, s := range []string{"a", "b"} {
		if err := p.Add(s); err != nil {
			t.Fatal(err)
		}
		f, err := OpenForChild(state, s)
		if err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, f)
	}
	a := startHelper(t, cmds[0], "lines", "a", strconv.Itoa(count), strconv.Itoa(size))
	b := startHelper(t, cmds[1], "lines", "b", strconv.Itoa(count), strconv.Itoa(size))
	for _, f := range cmds {
		f.Close()
	}
	for _, c := range []interface{ Wait() error }{a, b} {
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	out.waitFor(t, "all lines", func(s string) bool { return strings.Count(s, "\n") == 2*count })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	next := map[string]int{"a": 0, "b": 0}
	for i, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		name, line, ok := strings.Cut(l, " | ")
		if !ok || line != helperLine(name, next[name], size) {
			t.Fatalf("output line %d is not the next whole line of a service: %.80q…", i, l)
		}
		next[name]++
	}
	if next["a"] != count || next["b"] != count {
		t.Errorf("lines per service = %v, want %d each", next, count)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestPrefixerLifecycle(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	p := NewPrefixer(state, failingWriter{}, false)
	if err := p.Add("web"); err != nil {
		t.Fatal(err)
	}
	if err := p.Add("../x"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("Add(../x): err = %v, want ErrInvalidName", err)
	}
	appendTo(t, state, "web")("unfinished")
	if err := p.Close(); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("Close = %v, want the write error", err)
	}
	if err := p.Add("web"); !errors.Is(err, ErrClosed) {
		t.Errorf("Add after Close: err = %v, want ErrClosed", err)
	}
	p.Remove("web")

	if err := NewPrefixer(state, failingWriter{}, false).Close(); err != nil {
		t.Errorf("Close of an unused Prefixer = %v", err)
	}
}

func TestColorEnabled(t *testing.T) { // not parallel: it sets NO_COLOR
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer ptmx.Close()
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	tty, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	file, err := os.Create(t.TempDir() + "/out")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()

	t.Setenv("NO_COLOR", "")
	if !ColorEnabled(tty) {
		t.Error("terminal, NO_COLOR empty: want colour")
	}
	if ColorEnabled(file) {
		t.Error("regular file: want no colour")
	}
	t.Setenv("NO_COLOR", "1")
	if ColorEnabled(tty) {
		t.Error("terminal, NO_COLOR=1: want no colour")
	}
}

func TestNoticeComesAfterTheServiceOutputSoFar(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	buf := newSyncBuffer()
	p := NewPrefixer(dir, buf, false)
	if err := p.Add("web"); err != nil {
		t.Fatal(err)
	}
	f, err := OpenForChild(dir, "web")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("last words\n"); err != nil {
		t.Fatal(err)
	}
	p.Notice("web", "web crashed: exit_code 1")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	want := "web | last words\nvigil | web crashed: exit_code 1\n" // the width grows with the first notice
	if got := buf.String(); got != want {
		t.Fatalf("output\n%q\nwant\n%q", got, want)
	}
}
