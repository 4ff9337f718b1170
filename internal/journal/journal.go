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
	"sync/atomic"
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
	// LazySync is how long a record of AppendLazy may wait for an fsync
	// that another record starts before it gets one of its own. Default 1s.
	LazySync time.Duration
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
	if o.LazySync <= 0 {
		o.LazySync = time.Second
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
	// writtenSeq is the last record whose write is over: handed to the
	// kernel (maybe not yet synced), or failed. Written waits for it.
	writtenSeq uint64
	writers    []writtenWaiter
	// syncing is the fsync running beside the writer; unsyncedBytes what
	// is written but not durable: past MaxPending the writer stops taking
	// records, and Append refuses them, until the disk catches up.
	syncing       syncState
	syncDone      *sync.Cond // broadcast when the running fsync ends
	syncWanted    bool       // a Written caller wrote records: the writer must sync them
	lazyArmed     bool       // a timer will make the lazy records' fsync due
	lazyDue       bool       // lazy records have waited Options.LazySync
	unsyncedBytes int

	// Guarded by wmu: the writer goroutine holds it, and so does Written
	// when it writes the queue itself (and Open before the writer starts).
	wmu sync.Mutex
	// helperWaiting: a goroutine Written started waits for wmu to write
	// the queue (not guarded by wmu).
	helperWaiting atomic.Bool
	seg           fsutil.File
	segs          []segment // oldest first; the last is seg
	needRecover   bool
	unreported    error // a failed batch not yet told to a barrier
	buf           []byte
	// unsynced are the records written but not yet durable, and the
	// barriers among and after them, in order; the running fsync covers
	// the first syncCovers of them, up to offset syncTo.
	unsynced   []pending
	syncCovers int
	syncTo     int64
	syncNeeded bool // unsynced holds more than lazy records
}

type segment struct {
	name      string
	first     uint64
	firstTime time.Time // of its first record; zero while empty
	size      int64     // durable bytes
	written   int64     // bytes handed to the kernel: size, plus what awaits an fsync
}

type writtenWaiter struct {
	seq  uint64
	done func(error)
}

type pending struct {
	rec     Record
	done    func(error)
	barrier bool
	lazy    bool // AppendLazy: no fsync of its own
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
	j.syncDone = sync.NewCond(&j.mu)
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
	j.writtenSeq = j.nextSeq - 1
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
	last.size, last.written = int64(off), int64(off)
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
// without waiting for I/O. done, if not nil, is called once the record is
// durable (nil) or could not be written, from the goroutine that wrote or
// synced it (the journal's writer, or a caller of Written) with the
// journal's write lock held: it must not wait for the journal.
func (j *Journal) Append(t Type, payload []byte, done func(error)) (uint64, error) {
	return j.append(t, payload, done, false)
}

// AppendLazy is Append for a record that need not be durable at once: it
// is written like any other (Written waits for it), but starts no fsync
// of its own. The next fsync, for another record or a barrier, covers it,
// and at the latest one Options.LazySync after it was written. It suits
// what only has to survive the daemon's death, which write(2) assures.
func (j *Journal) AppendLazy(t Type, payload []byte, done func(error)) (uint64, error) {
	return j.append(t, payload, done, true)
}

func (j *Journal) append(t Type, payload []byte, done func(error), lazy bool) (uint64, error) {
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
	j.queue = append(j.queue, pending{rec: Record{Seq: seq, Type: t, Time: j.opts.Now(), Payload: payload}, done: done, lazy: lazy})
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

// Written calls done once every record appended before it has been
// written to its segment — handed to the kernel, so that it survives the
// death of this process, though not yet a power loss — or with the error
// of a write that failed while it waited (a failure before it is for
// Barrier and the done of Append to report). The records' sync follows as
// for any other. If the writer is not busy, Written writes the queue
// itself (so done may run before it returns); if it is, a goroutine does
// as soon as it may. done must not wait for the journal.
func (j *Journal) Written(done func(error)) {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		done(ErrClosed)
		return
	}
	seq := j.nextSeq - 1
	if j.writtenSeq >= seq {
		j.mu.Unlock()
		done(nil)
		return
	}
	j.writers = append(j.writers, writtenWaiter{seq: seq, done: done})
	j.mu.Unlock()
	// Write it here rather than wait for the writer to wake up for it: a
	// hand-over between goroutines less on the caller's path. If the
	// writer is writing, it would run an fsync next and take the queue
	// only after that: a goroutine writes it as soon as the writer is
	// done writing instead.
	if j.wmu.TryLock() {
		j.writeQueuedLocked()
		return
	}
	// One such goroutine waiting is enough: it takes the queue only once
	// it has the lock, so it writes what later callers queued too.
	if j.helperWaiting.CompareAndSwap(false, true) {
		go func() {
			j.wmu.Lock()
			j.helperWaiting.Store(false)
			j.writeQueuedLocked()
		}()
	}
}

// writeQueuedLocked writes what is queued, for a caller of Written, and
// releases j.wmu, which it holds.
func (j *Journal) writeQueuedLocked() {
	j.writeQueued()
	j.wmu.Unlock()
	j.mu.Lock()
	j.syncWanted = true // what it wrote; the writer may have seen an empty queue
	j.wake.Signal()
	j.mu.Unlock()
}

// wrote records that the records up to last were written (err nil) or
// failed to be, and tells the Written waiters that waited for them.
func (j *Journal) wrote(last uint64, err error) {
	j.mu.Lock()
	j.writtenSeq = max(j.writtenSeq, last)
	var due []writtenWaiter
	keep := j.writers[:0]
	for _, w := range j.writers {
		if w.seq <= last {
			due = append(due, w)
		} else {
			keep = append(keep, w)
		}
	}
	clear(j.writers[len(keep):])
	j.writers = keep
	j.mu.Unlock()
	for _, w := range due {
		w.done(err)
	}
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
	j.wmu.Lock()
	defer j.wmu.Unlock()
	err := j.seg.Close()
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return nil
}

// writer writes what Append queues and runs the fsyncs: one at a time,
// outside the write lock, so that the next records are written (by it, or
// by a caller of Written) while one runs; the records the fsync covers
// are told when it ends, and the next one covers what was written
// meanwhile.
func (j *Journal) writer() {
	defer close(j.exited)
	for {
		j.mu.Lock()
		for !j.closed && j.syncing.result == nil && !j.syncWanted &&
			(len(j.queue) == 0 || j.unsyncedBytes >= j.opts.MaxPending) {
			j.wake.Wait()
		}
		j.syncWanted = false
		j.mu.Unlock()

		j.wmu.Lock()
		if j.takeSyncResult() {
			// Let the appenders just told theirs are durable queue their
			// next records, so that they share the next fsync with those
			// written meanwhile instead of taking one after it.
			j.wmu.Unlock()
			runtime.Gosched()
			j.wmu.Lock()
		}
		j.mu.Lock()
		done := j.closed && len(j.queue) == 0 && len(j.unsynced) == 0
		j.mu.Unlock()
		if done {
			j.wmu.Unlock()
			return
		}
		j.writeQueued()
		f := j.beginSync()
		j.wmu.Unlock()
		if f != nil {
			err := fsutil.Datasync(f)
			j.mu.Lock()
			j.syncing.result = &syncResult{err}
			j.syncDone.Broadcast()
			j.mu.Unlock()
			continue // its outcome is taken first thing
		}
		runtime.Gosched()
	}
}

// writeQueued writes what is queued, unless too much already awaits an
// fsync. j.wmu must be held.
func (j *Journal) writeQueued() {
	j.mu.Lock()
	var batch []pending
	if j.unsyncedBytes < j.opts.MaxPending || j.closed {
		batch = j.queue
		j.queue, j.spare = j.spare[:0], nil
		j.queued = 0
	}
	j.mu.Unlock()
	if len(batch) > 0 {
		j.writeBatch(batch)
		clear(batch)
		j.mu.Lock()
		j.spare = batch[:0]
		j.mu.Unlock()
	}
}

// errRecovering stands for the error of an earlier failed write while the
// segment has not been cut back yet; redo reports its own error instead.
var errRecovering = errors.New("journal: a failed write is being recovered")

// syncState is the fsync the writer runs outside the write lock; guarded
// by j.mu.
type syncState struct {
	running bool
	result  *syncResult // set when it has finished, until taken
}

type syncResult struct{ err error }

// beginSync readies the fsync of what is written but not yet durable and
// returns the file to sync, or nil: nothing is unsynced, or an fsync is
// running already (the writer takes its outcome, then begins the next).
// With nothing written to sync, what waits (barriers) is told at once.
// j.wmu must be held.
func (j *Journal) beginSync() fsutil.File {
	if len(j.unsynced) == 0 {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.syncing.running {
		return nil
	}
	cur := &j.segs[len(j.segs)-1]
	if cur.written == cur.size {
		j.mu.Unlock()
		j.fire(len(j.unsynced), nil) // barriers, or records a sync already covered
		j.mu.Lock()
		return nil
	}
	if !j.syncNeeded && !j.lazyDue && !j.closed && j.unsyncedBytes < j.opts.MaxPending/2 {
		if !j.lazyArmed { // only lazy records wait: their fsync comes later
			j.lazyArmed = true
			time.AfterFunc(j.opts.LazySync, func() {
				j.mu.Lock()
				j.lazyDue, j.syncWanted = true, true
				j.wake.Signal()
				j.mu.Unlock()
			})
		}
		return nil
	}
	j.syncNeeded, j.lazyDue, j.lazyArmed = false, false, false
	j.syncTo, j.syncCovers = cur.written, len(j.unsynced)
	j.syncing.running = true
	return j.seg
}

// takeSyncResult takes the outcome of a finished fsync, if there is one,
// and reports whether there was. j.wmu must be held.
func (j *Journal) takeSyncResult() bool {
	j.mu.Lock()
	r := j.syncing.result
	if r != nil {
		j.syncing = syncState{}
	}
	j.mu.Unlock()
	if r != nil {
		j.synced(r.err)
	}
	return r != nil
}

// waitSync waits until no fsync runs and returns the outcome of the one
// that ran, if it is not taken yet. j.wmu must be held.
func (j *Journal) waitSync() *syncResult {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.syncing.running && j.syncing.result == nil {
		j.syncDone.Wait()
	}
	r := j.syncing.result
	j.syncing = syncState{}
	return r
}

// awaitSync waits for the running fsync, if any, and takes its outcome.
// j.wmu must be held.
func (j *Journal) awaitSync() {
	if r := j.waitSync(); r != nil {
		j.synced(r.err)
	}
}

// synced takes the outcome of the fsync that covered the first
// j.syncCovers unsynced entries, up to offset j.syncTo.
func (j *Journal) synced(err error) {
	j.mu.Lock()
	j.stats.Syncs++
	j.mu.Unlock()
	if err != nil {
		j.redo(err)
		return
	}
	cur := &j.segs[len(j.segs)-1]
	cur.size = max(cur.size, j.syncTo)
	j.fire(j.syncCovers, nil)
}

// fire tells the first n unsynced entries their outcome and drops them.
func (j *Journal) fire(n int, err error) {
	var bytes, records int
	for i := range j.unsynced[:n] {
		if p := &j.unsynced[i]; !p.barrier {
			bytes += len(p.rec.Payload) + headerSize
			records++
		}
	}
	// Counted before anyone is told, so that a caller told its record is
	// durable finds it in Stats.
	j.mu.Lock()
	j.unsyncedBytes -= bytes
	if err != nil {
		j.stats.Failed += uint64(records)
		j.stats.LastErr = err.Error()
	} else {
		j.stats.Appended += uint64(records)
	}
	j.mu.Unlock()
	for i := range j.unsynced[:n] {
		p := &j.unsynced[i]
		switch {
		case p.done == nil:
		case p.barrier && err == nil && j.unreported != nil:
			p.done(j.unreported)
			j.unreported = nil
		default:
			p.done(err)
		}
	}
	rest := copy(j.unsynced, j.unsynced[n:])
	if rest == 0 {
		j.syncNeeded = false
	}
	clear(j.unsynced[rest:])
	j.unsynced = j.unsynced[:rest]
	j.syncCovers = 0
}

// writeBatch writes the records of batch with one write (one more for
// each segment boundary the batch crosses, so that a burst never makes a
// segment larger than SegmentSize) and queues them for the next fsync. A
// failure is retried once, see redo.
func (j *Journal) writeBatch(batch []pending) {
	j.buf = j.buf[:0]
	var first Record
	var last uint64
	from := 0 // batch[from:] is not yet among the unsynced
	var err error
	flush := func(upto int) {
		if len(j.buf) > 0 && err == nil {
			err = j.write(first, last)
			j.buf = j.buf[:0]
		}
		j.addUnsynced(batch[from:upto])
		from = upto
	}
	for i := range batch {
		if batch[i].barrier {
			continue
		}
		rec := batch[i].rec
		cur := j.segs[len(j.segs)-1].written
		if len(j.buf) > 0 && cur+int64(len(j.buf)+headerSize+len(rec.Payload)) > j.opts.SegmentSize {
			flush(i) // what fits closes this segment; the rest starts the next
		}
		if len(j.buf) == 0 {
			first = rec
		}
		j.buf = appendFrame(j.buf, rec)
		last = rec.Seq
	}
	flush(len(batch))
	if err != nil {
		j.redo(err)
	}
}

func (j *Journal) addUnsynced(ps []pending) {
	var bytes int
	for i := range ps {
		if !ps[i].barrier {
			bytes += len(ps[i].rec.Payload) + headerSize
		}
	}
	j.unsynced = append(j.unsynced, ps...)
	for i := range ps {
		j.syncNeeded = j.syncNeeded || !ps[i].lazy
	}
	j.mu.Lock()
	j.unsyncedBytes += bytes
	j.mu.Unlock()
}

// write writes j.buf, which holds the records first.Seq to last, at the
// end of the newest segment, starting a new one first if it would grow
// past SegmentSize; the old one is made durable before that.
func (j *Journal) write(first Record, last uint64) error {
	if j.needRecover {
		return errRecovering
	}
	cur := &j.segs[len(j.segs)-1]
	if cur.written > 0 && cur.written+int64(len(j.buf)) > j.opts.SegmentSize {
		if err := j.drain(); err != nil {
			return err
		}
		if err := j.create(first.Seq); err != nil {
			return err
		}
		j.prune()
		cur = &j.segs[len(j.segs)-1]
	}
	if _, err := j.seg.Seek(cur.written, 0); err != nil {
		j.needRecover = true
		return fmt.Errorf("journal: %s: %w", cur.name, err)
	}
	if _, err := j.seg.Write(j.buf); err != nil {
		j.needRecover = true
		return fmt.Errorf("journal: %s: %w", cur.name, err)
	}
	if cur.written == 0 {
		cur.firstTime = first.Time
	}
	cur.written += int64(len(j.buf))
	j.wrote(last, nil)
	return nil
}

// drain makes everything written so far durable, waiting for the running
// fsync and running one more if needed.
func (j *Journal) drain() error {
	j.awaitSync()
	if j.needRecover {
		return errRecovering
	}
	cur := &j.segs[len(j.segs)-1]
	if cur.written == cur.size {
		return nil
	}
	j.syncTo, j.syncCovers = cur.written, len(j.unsynced)
	err := fsutil.Datasync(j.seg)
	j.mu.Lock()
	j.stats.Syncs++
	j.mu.Unlock()
	if err != nil {
		// After a failed fsync the kernel may have dropped the dirty pages
		// and a second fsync would succeed without them (fsyncgate): the
		// bytes past cur.size are never trusted again, see recover.
		j.needRecover = true
		return fmt.Errorf("journal: %s: %w", cur.name, err)
	}
	cur.size = cur.written
	j.fire(j.syncCovers, nil)
	return nil
}

// redo handles a failed write or fsync. After a failed fsync the kernel
// may have dropped the dirty pages and a second fsync would succeed
// without them (fsyncgate), so nothing past the last durable size is
// trusted: the segment is cut back to it (see recover) and every record
// not yet durable is written and synced once more. If that fails too,
// they fail with err.
func (j *Journal) redo(err error) {
	j.needRecover = true
	if r := j.waitSync(); r != nil {
		// Its outcome is moot (everything unsynced is redone), but it had
		// to be over before the segment is cut.
		j.mu.Lock()
		j.stats.Syncs++
		j.mu.Unlock()
	}
	var first Record
	var last uint64
	j.buf = j.buf[:0]
	for i := range j.unsynced {
		if p := &j.unsynced[i]; !p.barrier {
			if len(j.buf) == 0 {
				first = p.rec
			}
			j.buf = appendFrame(j.buf, p.rec)
			last = p.rec.Seq
		}
	}
	if len(j.buf) == 0 { // a new segment, if recover needs one, starts at the next record
		j.mu.Lock()
		first.Seq = j.nextSeq
		j.mu.Unlock()
	}
	rerr := j.recover(first.Seq)
	cur := &j.segs[len(j.segs)-1]
	if rerr == nil && len(j.buf) > 0 {
		if _, rerr = j.seg.Seek(cur.size, 0); rerr == nil {
			if _, rerr = j.seg.Write(j.buf); rerr == nil {
				rerr = fsutil.Datasync(j.seg)
				j.mu.Lock()
				j.stats.Syncs++
				j.mu.Unlock()
			}
		}
		if rerr != nil {
			j.needRecover = true
		} else {
			if cur.size == 0 {
				cur.firstTime = first.Time
			}
			cur.size += int64(len(j.buf))
			cur.written = cur.size
		}
	}
	j.buf = j.buf[:0]
	if rerr != nil {
		if errors.Is(err, errRecovering) || err == nil {
			err = rerr
		}
		j.unreported = err
		j.wrote(last, err)
		j.fire(len(j.unsynced), err)
		return
	}
	j.wrote(last, nil)
	j.fire(len(j.unsynced), nil)
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
		cur.written = cur.size
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
