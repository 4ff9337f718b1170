package journal

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vigil-dev/vigil/internal/fsutil"
)

// Problem is damage a reader found and skipped.
type Problem struct {
	Segment string `json:"segment"`
	Offset  int64  `json:"offset"`
	Skipped int64  `json:"skipped"` // bytes up to the next verifying frame, or to the end
}

func (p Problem) Error() string {
	return fmt.Sprintf("%v: %s at offset %d (%d bytes skipped)", ErrCorrupt, p.Segment, p.Offset, p.Skipped)
}

// Reader reads a journal directory without changing it. It may run beside
// a live writer. Its zero value needs Dir.
type Reader struct {
	Dir       string
	FS        fsutil.FS // default fsutil.OS{}
	MaxRecord int       // default 1 MiB, as Options
}

// Query selects records for Newest.
type Query struct {
	Types []Type    // nil: every type
	Since time.Time // zero: no limit
	Limit int       // 0: no limit
	// Match, if set, must also accept a record. Its Payload is only valid
	// during the call.
	Match func(Record) bool
}

func (q *Query) accepts(r Record) bool {
	if q.Types != nil && !slices.Contains(q.Types, r.Type) {
		return false
	}
	if !q.Since.IsZero() && r.Time.Before(q.Since) {
		return false
	}
	return q.Match == nil || q.Match(r)
}

func (rd *Reader) fill() (fsutil.FS, int) {
	fsys, max := rd.FS, rd.MaxRecord
	if fsys == nil {
		fsys = fsutil.OS{}
	}
	if max <= 0 {
		max = 1 << 20
	}
	return fsys, max
}

func (rd *Reader) segments() ([]string, error) {
	fsys, _ := rd.fill()
	names, err := fsys.ReadDir(rd.Dir)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	var out []string
	for _, n := range fsutil.SortedNames(names, segSuffix) {
		if _, ok := parseSegName(n); ok {
			out = append(out, n)
		}
	}
	return out, nil
}

// scanSegment calls fn for every verifying frame of one segment's bytes,
// oldest first, and returns the damage it skipped and the offset after
// the last frame. In the newest segment (last) an unverifiable tail is a
// write in progress, not damage.
func scanSegment(path string, b []byte, maxRecord int, last bool, fn func(Record, int64) bool) (probs []Problem, end int64) {
	off := 0
	for off < len(b) {
		r, n, ok := frameAt(b[off:], maxRecord)
		if ok {
			if !fn(r, int64(off)) {
				return probs, int64(off + n)
			}
			off += n
			continue
		}
		skip := nextValid(b[off:], maxRecord)
		if skip < 0 {
			if !last {
				probs = append(probs, Problem{Segment: path, Offset: int64(off), Skipped: int64(len(b) - off)})
			}
			return probs, int64(off)
		}
		probs = append(probs, Problem{Segment: path, Offset: int64(off), Skipped: int64(skip)})
		off += skip
	}
	return probs, int64(off)
}

// scanFile is scanSegment over the segment file at path, read through a
// buffer of a few hundred KiB rather than whole, so that a reader's memory
// and time do not grow with the segment size. Damage is rare: at the first
// frame that does not verify, the rest of the file is read whole and
// handed to scanSegment, which knows tails from corruption. A Record's
// Payload is valid only during fn.
func scanFile(fsys fsutil.FS, path string, maxRecord int, last bool, fn func(Record, int64) bool) ([]Problem, int64, error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	buf := make([]byte, 0, 256<<10)
	var base int64 // file offset of buf[0]
	pos, eof := 0, false
	// more makes buf hold at least need bytes from pos on, unless the file
	// ends first.
	more := func(need int) error {
		if len(buf)-pos >= need || eof {
			return nil
		}
		n := copy(buf, buf[pos:])
		base += int64(pos)
		buf, pos = buf[:n], 0
		if need > cap(buf) {
			buf = append(make([]byte, 0, need), buf...)
		}
		for len(buf) < need && !eof {
			m, err := f.ReadAt(buf[len(buf):cap(buf)], base+int64(len(buf)))
			buf = buf[:len(buf)+m]
			switch {
			case err == io.EOF || (err == nil && m == 0):
				eof = true
			case err != nil:
				return err
			}
		}
		return nil
	}
	for {
		if err := more(headerSize); err != nil {
			return nil, base + int64(pos), err
		}
		if len(buf) == pos {
			return nil, base + int64(pos), nil
		}
		if h, ok := parseHeader(buf[pos:]); ok && int64(h.length) <= int64(maxRecord) {
			if err := more(headerSize + int(h.length)); err != nil {
				return nil, base + int64(pos), err
			}
			if r, n, ok := frameAt(buf[pos:], maxRecord); ok {
				if !fn(r, base+int64(pos)) {
					return nil, base + int64(pos+n), nil
				}
				pos += n
				continue
			}
		}
		// Damage, a torn tail or a write in progress: decide on the rest.
		at := base + int64(pos)
		size, err := f.Size()
		if err != nil {
			return nil, at, err
		}
		rest := make([]byte, max(size-at, 0))
		n, err := f.ReadAt(rest, at)
		if err != nil && err != io.EOF {
			return nil, at, err
		}
		probs, end := scanSegment(path, rest[:n], maxRecord, last, func(r Record, off int64) bool { return fn(r, at+off) })
		for i := range probs {
			probs[i].Offset += at
		}
		return probs, at + end, nil
	}
}

// Scan calls fn for every record, oldest first, until fn returns false.
// A Record's Payload is valid only during fn.
func (rd *Reader) Scan(fn func(Record) bool) ([]Problem, error) {
	fsys, maxRec := rd.fill()
	segs, err := rd.segments()
	if err != nil {
		return nil, err
	}
	var probs []Problem
	for i, name := range segs {
		path := filepath.Join(rd.Dir, name)
		stop := false
		p, _, err := scanFile(fsys, path, maxRec, i == len(segs)-1, func(r Record, _ int64) bool {
			stop = !fn(r)
			return !stop
		})
		if err != nil {
			if os.IsNotExist(err) { // pruned while we read
				continue
			}
			return probs, fmt.Errorf("journal: %w", err)
		}
		probs = append(probs, p...)
		if stop {
			break
		}
	}
	return probs, nil
}

// Newest returns the records q selects, newest first. It reads one
// segment at a time from the newest back and stops as soon as it has
// Limit records or reaches records older than Since, so listing recent
// records never loads the whole journal.
func (rd *Reader) Newest(q Query) ([]Record, []Problem, error) {
	fsys, maxRec := rd.fill()
	segs, err := rd.segments()
	if err != nil {
		return nil, nil, err
	}
	var out []Record
	var probs []Problem
	for i := len(segs) - 1; i >= 0; i-- {
		path := filepath.Join(rd.Dir, segs[i])
		// Keep only the newest Limit matches of this segment in a ring.
		want := q.Limit - len(out)
		var ring []Record
		head := 0
		older := false
		p, _, err := scanFile(fsys, path, maxRec, i == len(segs)-1, func(r Record, _ int64) bool {
			if !q.Since.IsZero() && r.Time.Before(q.Since) {
				older = true
			}
			if !q.accepts(r) {
				return true
			}
			if q.Limit <= 0 || len(ring) < want {
				r.Payload = slices.Clone(r.Payload)
				ring = append(ring, r)
			} else { // reuse the slot's payload buffer
				r.Payload = append(ring[head].Payload[:0], r.Payload...)
				ring[head] = r
				head = (head + 1) % len(ring)
			}
			return true
		})
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return out, probs, fmt.Errorf("journal: %w", err)
		}
		probs = append(probs, p...)
		for k := len(ring) - 1; k >= 0; k-- {
			out = append(out, ring[(head+k)%len(ring)])
		}
		if (q.Limit > 0 && len(out) >= q.Limit) || older {
			break
		}
	}
	return out, probs, nil
}

// Follow calls fn for every record with a sequence number above after, as
// it is appended, until ctx is done. It polls every interval (default
// 200 ms): it is meant for a person watching, not for the daemon.
func (rd *Reader) Follow(ctx context.Context, after uint64, interval time.Duration, fn func(Record)) error {
	fsys, maxRec := rd.fill()
	if interval <= 0 {
		interval = 200 * time.Millisecond
	}
	cur, off := "", int64(0)
	for {
		segs, err := rd.segments()
		if err != nil {
			return err
		}
		for _, name := range segs {
			if name < cur {
				continue
			}
			if name != cur {
				cur, off = name, 0
			}
			f, err := fsys.OpenFile(filepath.Join(rd.Dir, name), os.O_RDONLY, 0)
			if err != nil {
				continue
			}
			size, _ := f.Size()
			b := make([]byte, max(size-off, 0))
			n, _ := f.ReadAt(b, off)
			f.Close()
			_, end := scanSegment(name, b[:n], maxRec, true, func(r Record, _ int64) bool {
				if r.Seq > after {
					after = r.Seq
					fn(r)
				}
				return true
			})
			off += end
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}
