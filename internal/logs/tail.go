package logs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"slices"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// tailBlock is how much Tail reads at a time, backwards from the end.
const tailBlock = 16 << 10

// errShrunk means a file got shorter while it was being read: it was rotated.
var errShrunk = errors.New("logs: file shrank while reading")

// Tail returns the last n lines of service's output, oldest first, without
// their newlines, reading backwards from the end of the live file and on
// into .1 if the live file has fewer lines. A last line without a newline
// counts. The lines hold at most maxBytes bytes together (newlines not
// counted): older lines that do not fit are left out, and a newest line
// longer than maxBytes is cut to its last maxBytes bytes. n ≤ 0 or
// maxBytes ≤ 0 returns nothing. Memory is bounded by maxBytes, not by the
// file. A missing live file is an error wrapping fs.ErrNotExist.
func Tail(stateDir, service string, n int, maxBytes int) ([]string, error) {
	if err := checkName(service); err != nil {
		return nil, err
	}
	live := Path(stateDir, service)
	for attempt := 1; ; attempt++ {
		lines, err := tailFiles(live, n, maxBytes)
		if !errors.Is(err, errShrunk) || attempt == 3 {
			return lines, err
		}
	}
}

func tailFiles(live string, n, maxBytes int) ([]string, error) {
	var parts concat
	for _, path := range []string{rotatedPath(live, 1), live} {
		f, err := openNoFollow(path, unix.O_RDONLY, 0)
		if errors.Is(err, fs.ErrNotExist) && path != live {
			continue
		}
		if err != nil {
			return nil, err
		}
		defer f.Close()
		size, err := fileSize(f)
		if err != nil {
			return nil, err
		}
		parts = append(parts, part{f, size})
	}
	return tailLines(parts, parts.size(), n, maxBytes, tailBlock)
}

// tailLines is Tail on the first size bytes of r, read block bytes at a time.
func tailLines(r io.ReaderAt, size int64, n, maxBytes, block int) ([]string, error) {
	if size == 0 || n <= 0 || maxBytes <= 0 {
		return nil, nil
	}
	// Enough to hold n lines within the budget, their separators and a
	// final newline; no line beyond that could be returned whole.
	limit := int64(maxBytes) + int64(n) + 1
	if limit < 0 {
		limit = math.MaxInt64
	}
	var blocks [][]byte // newest first
	pos, newlines, endsWithNewline := size, 0, 0
	for pos > 0 && size-pos < limit {
		buf := make([]byte, min(int64(block), pos))
		pos -= int64(len(buf))
		if _, err := r.ReadAt(buf, pos); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, errShrunk
			}
			return nil, fmt.Errorf("logs: tail: %w", err)
		}
		if len(blocks) == 0 && buf[len(buf)-1] == '\n' {
			endsWithNewline = 1
		}
		blocks = append(blocks, buf)
		if newlines += bytes.Count(buf, []byte{'\n'}); newlines-endsWithNewline >= n {
			break
		}
	}
	slices.Reverse(blocks)
	data := bytes.Join(blocks, nil)
	segs := bytes.Split(data[:len(data)-endsWithNewline], []byte{'\n'})
	newest := segs[len(segs)-1]
	if pos > 0 {
		segs = segs[1:] // may have begun before pos
	}
	var out []string
	budget := maxBytes
	for i := len(segs) - 1; i >= 0 && len(out) < n && len(segs[i]) <= budget; i-- {
		budget -= len(segs[i])
		out = append(out, string(segs[i]))
	}
	if len(out) == 0 {
		// The newest line alone is over budget: its end is what matters.
		cut := newest[max(0, len(newest)-maxBytes):]
		for len(cut) > 0 && !utf8.RuneStart(cut[0]) {
			cut = cut[1:]
		}
		out = append(out, string(cut))
	}
	slices.Reverse(out)
	return out, nil
}

// concat reads several files as one, each up to the size it had when opened.
type concat []part

type part struct {
	f    *os.File
	size int64
}

func (c concat) size() int64 {
	var n int64
	for _, p := range c {
		n += p.size
	}
	return n
}

// ReadAt fills b from off, or fails with io.EOF if a file has shrunk.
func (c concat) ReadAt(b []byte, off int64) (int, error) {
	done := 0
	for _, p := range c {
		if len(b) == done {
			break
		}
		if off >= p.size {
			off -= p.size
			continue
		}
		want := min(int64(len(b)-done), p.size-off)
		n, err := p.f.ReadAt(b[done:done+int(want)], off)
		done += n
		if err != nil {
			return done, err
		}
		off = 0
	}
	if done < len(b) {
		return done, io.EOF
	}
	return done, nil
}
