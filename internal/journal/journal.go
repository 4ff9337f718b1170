package journal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vigil-dev/vigil/internal/fsutil"
)

// Options configures Open. Dir is required; every other zero value works.
type Options struct {
	Dir string
	// FS is where the journal lives; default fsutil.OS{}.
	FS fsutil.FS
	// SegmentSize is the size at which the newest segment is rotated;
	// default 8 MiB.
	SegmentSize int64
	// MaxTotal is the size beyond which the oldest segments are removed;
	// default 256 MiB.
	MaxTotal int64
	// MaxAge removes segments whose records are all older; default 30 days.
	MaxAge time.Duration
	// MaxRecord is the largest payload accepted; default 1 MiB.
	MaxRecord int
	// MaxPending bounds the bytes waiting for the writer; an Append beyond
	// it fails with ErrBehind instead of growing memory without limit
	// while the disk stalls. Default 16 MiB.
	MaxPending int
	// Now stamps records; default time.Now.
	Now func() time.Time
}

func (o *Options) fill() {
	if o.FS == nil {
		o.FS = fsutil.OS{}
	}
	if o.SegmentSize <= 0 {
		o.SegmentSize = 8 << 20
	}
	if o.MaxTotal <= 0 {
		o.MaxTotal = 256 << 20
	}
	if o.MaxAge <= 0 {
		o.MaxAge = 30 * 24 * time.Hour
	}
	if o.MaxRecord <= 0 {
		o.MaxRecord = 1 << 20
	}
	if o.MaxPending <= 0 {
		o.MaxPending = 16 << 20
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Repair is damage Open found in the newest segment and what it did.
type Repair struct {
	Segment string `json:"segment"`
	Offset  int64  `json:"offset"`
	// Kind is "torn_tail" (a crash cut the last write short) or
	// "corruption" (damage with valid records after it).
	Kind string `json:"kind"`
	// Copy is the untouched copy of the segment kept before cutting it back.
	Copy string `json:"copy"`
	// Cut is how many bytes were cut off the segment.
	Cut int64 `json:"cut"`
}

func (r Repair) String() string {
	return fmt.Sprintf("journal: %s in %s at offset %d: %d bytes cut, copy kept as %s", r.Kind, r.Segment, r.Offset, r.Cut, r.Copy)
}

// Stats counts what the journal has done since Open.
type Stats struct {
	Appended uint64 `json:"appended"` // records made durable
	Failed   uint64 `json:"failed"`   // records whose write or fsync failed
	Behind   uint64 `json:"behind"`   // appends refused with ErrBehind
	Syncs    uint64 `json:"syncs"`
	LastErr  string `json:"last_error,omitempty"`
}

// Journal appends records. Its methods are safe for concurrent use.
type Journal struct {
	opts    Options
	repairs []Repair

	mu      sync.Mutex
	wake    *sync.Cond
	queue   []pending
	spare   []pending
	queued  int
	nextSeq uint64
	closed  bool
	stats   Stats
	exited  chan struct{}

	// Owned by the writer goroutine (and Open before it starts).
	seg         fsutil.File
	segs        []segment // oldest first; the last is seg
	needRecover bool
	unreported  error // a failed batch not yet told to a barrier
	buf         []byte
}

type segment struct {
	name      string
	first     uint64
	firstTime time.Time // of its first record; zero while empty
	size      int64
}

type pending struct {
	rec     Record
	done    func(error)
	barrier bool
}

const segSuffix = ".seg"

func segName(first uint64) string { return fmt.Sprintf("%016x%s", first, segSuffix) }

func parseSegName(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, segSuffix)
	if !ok || len(hex) != 16 {
		return 0, false
	}
	n, err := strconv.ParseUint(hex, 16, 64)
	return n, err == nil && n > 0
}

// Open opens the journal in opts.Dir, creating it if needed, and repairs
// a torn or damaged tail of the newest segment (see Repairs).
func Open(opts Options) (*Journal, error) {
	opts.fill()
	j := &Journal{opts: opts, exited: make(chan struct{})}
	j.wake = sync.NewCond(&j.mu)
	fsys, dir := opts.FS, opts.Dir
	if err := fsys.MkdirAll(dir); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	names, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	for _, n := range fsutil.SortedNames(names, segSuffix) {
		if first, ok := parseSegName(n); ok {
			j.segs = append(j.segs, segment{name: n, first: first})
		}
	}
	for i := range j.segs[:max(len(j.segs)-1, 0)] {
		s := &j.segs[i]
		s.size, s.firstTime = peekSegment(fsys, filepath.Join(dir, s.name), opts.MaxRecord)
	}
	if len(j.segs) == 0 {
		if err := j.create(1); err != nil {
			return nil, err
		}
		j.nextSeq = 1
	} else if err := j.openLast(); err != nil {
		return nil, err
	}
	go j.writer()
	return j, nil
}

// peekSegment returns a sealed segment's size and the time of its first record.
func peekSegment(fsys fsutil.FS, path string, maxRecord int) (int64, time.Time) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return 0, time.Time{}
	}
	defer f.Close()
	size, _ := f.Size()
	var h [headerSize]byte
	if _, err := f.ReadAt(h[:], 0); err == nil {
		if hd, ok := parseHeader(h[:]); ok {
			return size, time.Unix(0, hd.nanos)
		}
	}
	return size, time.Time{}
}

// openLast reads the newest segment to its end, repairs what follows its
// last verifying frame, and opens it for appending.
func (j *Journal) openLast() error {
	fsys, dir := j.opts.FS, j.opts.Dir
	last := &j.segs[len(j.segs)-1]
	path := filepath.Join(dir, last.name)
	b, err := fsutil.ReadFile(fsys, path)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	var off int
	lastSeq := uint64(0)
	for off < len(b) {
		r, n, ok := frameAt(b[off:], j.opts.MaxRecord)
		if !ok {
			break
		}
		if off == 0 {
			last.firstTime = r.Time
		}
		lastSeq = r.Seq
		off += n
	}
	f, err := fsys.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if off < len(b) {
		rep := Repair{Segment: path, Offset: int64(off), Kind: "torn_tail", Cut: int64(len(b) - off)}
		if nextValid(b[off:], j.opts.MaxRecord) >= 0 {
			rep.Kind = "corruption"
			qdir := filepath.Join(dir, "quarantine")
			if err := fsys.MkdirAll(qdir); err != nil {
				f.Close()
				return fmt.Errorf("journal: %w", err)
			}
			rep.Copy = filepath.Join(qdir, fmt.Sprintf("%s.%d", last.name, off))
		} else {
			rep.Copy = fmt.Sprintf("%s.%d.broken", path, off)
		}
		// The copy must be durable before the cut, or a crash in between
		// would lose what the cut removes.
		if err := fsutil.WriteFile(fsys, rep.Copy, b); err != nil {
			f.Close()
			return fmt.Errorf("journal: keeping a copy of %s: %w", path, err)
		}
		if err := f.Truncate(int64(off)); err == nil {
			err = f.Sync()
		}
		if err != nil {
			f.Close()
			return fmt.Errorf("journal: cutting %s back to offset %d: %w", path, off, err)
		}
		j.repairs = append(j.repairs, rep)
	}
	j.seg = f
	last.size = int64(off)
	j.nextSeq = max(lastSeq+1, last.first)
	return nil
}

// create starts a new segment whose first record will be seq first. Its
// name is made durable before anything is written to it.
func (j *Journal) create(first uint64) error {
	path := filepath.Join(j.opts.Dir, segName(first))
	// O_TRUNC, not O_EXCL: a segment of this name can only be left over
	// from a rotation that failed before anything was acknowledged in it.
	f, err := j.opts.FS.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if err := j.opts.FS.SyncDir(j.opts.Dir); err != nil {
		f.Close()
		return fmt.Errorf("journal: %w", err)
	}
	if j.seg != nil {
		j.seg.Close()
	}
	j.seg = f
	if n := len(j.segs); n > 0 && j.segs[n-1].first == first {
		j.segs[n-1] = segment{name: segName(first), first: first}
	} else {
		j.segs = append(j.segs, segment{name: segName(first), first: first})
	}
	j.needRecover = false
	return nil
}

// Repairs lists what Open found damaged and repaired.
func (j *Journal) Repairs() []Repair { return j.repairs }

// Dir is the journal's directory.
func (j *Journal) Dir() string { return j.opts.Dir }

// Stats returns the journal's counters.
func (j *Journal) Stats() Stats {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.stats
}

// Append queues a record of type t and returns its sequence number
// without waiting for I/O. done, if not nil, is called from the writer's
// goroutine once the record is durable (nil) or could not be written.
func (j *Journal) Append(t Type, payload []byte, done func(error)) (uint64, error) {
	if len(payload) > j.opts.MaxRecord {
		return 0, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(payload), j.opts.MaxRecord)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return 0, ErrClosed
	}
	if j.queued+len(payload) > j.opts.MaxPending {
		j.stats.Behind++
		return 0, ErrBehind
	}
	seq := j.nextSeq
	j.nextSeq++
	j.queue = append(j.queue, pending{rec: Record{Seq: seq, Type: t, Time: j.opts.Now(), Payload: payload}, done: done})
	j.queued += len(payload) + headerSize
	j.wake.Signal()
	return seq, nil
}

// Write appends a record and waits until it is durable.
func (j *Journal) Write(t Type, payload []byte) (uint64, error) {
	c := make(chan error, 1)
	seq, err := j.Append(t, payload, func(err error) { c <- err })
	if err != nil {
		return 0, err
	}
	return seq, <-c
}

// Barrier calls done once every record appended before it is durable, or
// with the error of a write that failed since the last barrier.
func (j *Journal) Barrier(done func(error)) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		go done(ErrClosed)
		return
	}
	j.queue = append(j.queue, pending{barrier: true, done: done})
	j.wake.Signal()
}

// Sync waits until every record appended so far is durable.
func (j *Journal) Sync() error {
	c := make(chan error, 1)
	j.Barrier(func(err error) { c <- err })
	return <-c
}

// Close writes what is queued and closes the journal.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		<-j.exited
		return nil
	}
	j.closed = true
	j.wake.Signal()
	j.mu.Unlock()
	<-j.exited
	err := j.seg.Close()
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return nil
}

func (j *Journal) writer() {
	defer close(j.exited)
	for {
		j.mu.Lock()
		for len(j.queue) == 0 && !j.closed {
			j.wake.Wait()
		}
		if len(j.queue) == 0 {
			j.mu.Unlock()
			return
		}
		batch := j.queue
		j.queue, j.spare = j.spare[:0], nil
		j.queued = 0
		j.mu.Unlock()

		n, err := j.writeBatch(batch)

		j.mu.Lock()
		j.stats.Syncs++
		if err != nil {
			j.stats.Failed += uint64(n)
			j.stats.LastErr = err.Error()
		} else {
			j.stats.Appended += uint64(n)
		}
		j.mu.Unlock()
		for i := range batch {
			p := &batch[i]
			if p.done == nil {
				continue
			}
			if p.barrier && err == nil && j.unreported != nil {
				p.done(j.unreported)
				j.unreported = nil
				continue
			}
			p.done(err)
		}
		clear(batch)
		j.mu.Lock()
		j.spare = batch[:0]
		j.mu.Unlock()
		// Let the appenders just woken by done queue their next records,
		// so that they share the next fsync instead of each taking one.
		runtime.Gosched()
	}
}

// writeBatch writes every record of batch with one write and one fsync
// (one more for each segment boundary the batch crosses, so that a burst
// never makes a segment larger than SegmentSize) and returns how many
// records it held. A failed attempt is retried once after cutting the
// segment back to its last durable size.
func (j *Journal) writeBatch(batch []pending) (int, error) {
	j.buf = j.buf[:0]
	var first Record
	n := 0
	var err error
	flush := func() {
		if len(j.buf) == 0 || err != nil {
			return
		}
		if err = j.commit(first); err != nil {
			err = j.commit(first)
		}
		j.buf = j.buf[:0]
	}
	for i := range batch {
		if batch[i].barrier {
			continue
		}
		rec := batch[i].rec
		cur := j.segs[len(j.segs)-1].size
		if len(j.buf) > 0 && cur+int64(len(j.buf)+headerSize+len(rec.Payload)) > j.opts.SegmentSize {
			flush() // what fits closes this segment; the rest starts the next
		}
		if len(j.buf) == 0 {
			first = rec
		}
		j.buf = appendFrame(j.buf, rec)
		n++
	}
	flush()
	if err != nil {
		j.unreported = err
	}
	return n, err
}

func (j *Journal) commit(first Record) error {
	if j.needRecover {
		if err := j.recover(first.Seq); err != nil {
			return err
		}
	}
	cur := &j.segs[len(j.segs)-1]
	if cur.size > 0 && cur.size+int64(len(j.buf)) > j.opts.SegmentSize {
		if err := j.create(first.Seq); err != nil {
			return err
		}
		j.prune()
		cur = &j.segs[len(j.segs)-1]
	}
	if _, err := j.seg.Seek(cur.size, 0); err != nil {
		j.needRecover = true
		return fmt.Errorf("journal: %s: %w", cur.name, err)
	}
	if _, err := j.seg.Write(j.buf); err != nil {
		j.needRecover = true
		return fmt.Errorf("journal: %s: %w", cur.name, err)
	}
	// After a failed fsync the kernel may have dropped the dirty pages and
	// a second fsync would succeed without them (fsyncgate): the bytes past
	// cur.size are never trusted again, see recover.
	if err := fsutil.Datasync(j.seg); err != nil {
		j.needRecover = true
		return fmt.Errorf("journal: %s: %w", cur.name, err)
	}
	if cur.size == 0 {
		cur.firstTime = first.Time
	}
	cur.size += int64(len(j.buf))
	return nil
}

// recover cuts the segment back to its last durable size after a failed
// write or fsync. If even that fails, the segment is left as it is (its
// durable prefix is intact; readers report the damage after it) and
// appending continues in a new segment.
func (j *Journal) recover(nextSeq uint64) error {
	cur := &j.segs[len(j.segs)-1]
	err := j.seg.Truncate(cur.size)
	if err == nil {
		err = j.seg.Sync()
	}
	if err == nil {
		j.needRecover = false
		return nil
	}
	if cur.size == 0 {
		return fmt.Errorf("journal: %s: %w", cur.name, err)
	}
	return j.create(nextSeq)
}

// prune removes the oldest segments while the journal is over MaxTotal or
// they hold only records older than MaxAge. The newest is never removed.
func (j *Journal) prune() {
	var total int64
	for _, s := range j.segs {
		total += s.size
	}
	cutoff := j.opts.Now().Add(-j.opts.MaxAge)
	removed := false
	for len(j.segs) > 1 {
		old, next := j.segs[0], j.segs[1]
		tooOld := !next.firstTime.IsZero() && next.firstTime.Before(cutoff)
		if total <= j.opts.MaxTotal && !tooOld {
			break
		}
		err := j.opts.FS.Remove(filepath.Join(j.opts.Dir, old.name))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			break
		}
		total -= old.size
		j.segs = j.segs[1:]
		removed = true
	}
	if removed {
		j.opts.FS.SyncDir(j.opts.Dir)
	}
}
