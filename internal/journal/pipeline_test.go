package journal

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/fsutil"
	"github.com/vigil-dev/vigil/internal/fsutil/fstest"
)

// gatedFS holds every file sync while closed is set, until the test
// answers it on the channel it receives from held: nil lets the sync go
// on, an error fails it.
type gatedFS struct {
	fsutil.FS
	closed atomic.Bool
	held   chan chan error
	// writesClosed holds every write likewise, until the test closes the
	// channel it receives from writeHeld.
	writesClosed atomic.Bool
	writeHeld    chan chan struct{}
}

func newGated(fsys fsutil.FS) *gatedFS {
	return &gatedFS{FS: fsys, held: make(chan chan error), writeHeld: make(chan chan struct{})}
}

func (g *gatedFS) OpenFile(name string, flag int, perm fs.FileMode) (fsutil.File, error) {
	f, err := g.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return gatedFile{File: f, g: g}, nil
}

type gatedFile struct {
	fsutil.File
	g *gatedFS
}

func (f gatedFile) Sync() error {
	if f.g.closed.Load() {
		answer := make(chan error)
		f.g.held <- answer
		if err := <-answer; err != nil {
			return err
		}
	}
	return f.File.Sync()
}

func (f gatedFile) Write(p []byte) (int, error) {
	if f.g.writesClosed.Load() {
		release := make(chan struct{})
		f.g.writeHeld <- release
		<-release
	}
	return f.File.Write(p)
}

// heldSync waits for the journal's next sync to reach the gate.
func heldSync(t *testing.T, g *gatedFS) chan error {
	t.Helper()
	select {
	case answer := <-g.held:
		return answer
	case <-time.After(10 * time.Second):
		t.Fatal("no sync reached the gate within 10s")
		return nil
	}
}

func waitFor(t *testing.T, c <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing within 10s", what)
		return nil
	}
}

// firstSyncHeld opens a journal on fsys behind a gate, appends record 1,
// and returns once its sync is held there, with the channel that answers
// the sync and the one record 1's done reports to (room for n reports).
func firstSyncHeld(t *testing.T, fsys fsutil.FS, n int) (*Journal, *gatedFS, chan error, chan error) {
	t.Helper()
	g := newGated(fsys)
	j := open(t, Options{FS: g, Dir: "/j"})
	g.closed.Store(true)
	done := make(chan error, n)
	j.Append(TypeEvent, payload(1), func(err error) { done <- err })
	return j, g, heldSync(t, g), done
}

// TestWrittenDoesNotWaitForAnotherSync: while the sync of one record
// hangs, the next is written (Written answers) but not called durable; it
// is once a sync after its write has succeeded.
func TestWrittenDoesNotWaitForAnotherSync(t *testing.T) {
	t.Parallel()
	j, g, sync1, first := firstSyncHeld(t, &fstest.Crash{}, 1)

	second := make(chan error, 1)
	j.Append(TypeEvent, payload(2), func(err error) { second <- err })
	written := make(chan error, 1)
	j.Written(func(err error) { written <- err })
	if err := waitFor(t, written, "Written of record 2 while record 1's sync hangs"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-second:
		t.Fatalf("record 2 called durable (%v) before any sync after its write", err)
	case err := <-first:
		t.Fatalf("record 1 called durable (%v) while its sync hangs", err)
	default:
	}
	sync1 <- nil
	if err := waitFor(t, first, "record 1"); err != nil {
		t.Fatal(err)
	}
	g.closed.Store(false)
	heldOrNot := make(chan struct{})
	go func() { // the second sync may have reached the gate before it opened
		select {
		case answer := <-g.held:
			answer <- nil
		case <-heldOrNot:
		}
	}()
	defer close(heldOrNot)
	if err := waitFor(t, second, "record 2"); err != nil {
		t.Fatal(err)
	}
	if st := j.Stats(); st.Appended != 2 || st.Syncs < 2 {
		t.Fatalf("stats %+v: want 2 records, in 2 syncs at least", st)
	}
}

// TestWrittenIsNotHeldBehindTheNextSync: a Written that finds the writer
// busy writing other records has its own written as soon as that write
// is done, not after the fsync the writer runs next.
func TestWrittenIsNotHeldBehindTheNextSync(t *testing.T) {
	t.Parallel()
	g := newGated(&fstest.Crash{})
	j := open(t, Options{FS: g, Dir: "/j"})
	g.closed.Store(true)
	g.writesClosed.Store(true)
	j.Append(TypeEvent, payload(1), nil)
	var release chan struct{}
	select {
	case release = <-g.writeHeld: // the writer is writing record 1, with the write lock
	case <-time.After(10 * time.Second):
		t.Fatal("no write reached the gate within 10s")
	}
	g.writesClosed.Store(false)
	j.Append(TypeEvent, payload(2), nil)
	written := make(chan error, 1)
	j.Written(func(err error) { written <- err })
	close(release)
	sync1 := heldSync(t, g) // record 1's fsync, which the writer runs next
	select {
	case err := <-written:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		g.closed.Store(false)
		sync1 <- nil // so that the journal can close
		t.Fatal("record 2 not written within 10s while record 1's fsync hangs")
	}
	g.closed.Store(false)
	heldOrNot := make(chan struct{})
	go func() { // record 2's sync may have reached the gate before it opened
		select {
		case answer := <-g.held:
			answer <- nil
		case <-heldOrNot:
		}
	}()
	defer close(heldOrNot)
	sync1 <- nil
	if err := j.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestFailedSyncRedoesWhatFollowedIt: the sync of record 1 fails after
// records 2 and 3 were written behind it. Nothing past the last durable
// size is trusted (fsyncgate): the segment is cut back and all three are
// written and synced again, once each, and a power loss then keeps them.
func TestFailedSyncRedoesWhatFollowedIt(t *testing.T) {
	t.Parallel()
	mem := &fstest.Crash{}
	j, g, sync1, done := firstSyncHeld(t, mem, 3)
	for i := 2; i <= 3; i++ {
		j.Append(TypeEvent, payload(i), func(err error) { done <- err })
	}
	written := make(chan error, 1)
	j.Written(func(err error) { written <- err })
	if err := waitFor(t, written, "Written of records 2 and 3"); err != nil {
		t.Fatal(err)
	}
	g.closed.Store(false)
	sync1 <- fstest.EIO
	for i := range 3 {
		if err := waitFor(t, done, fmt.Sprint("record ", i+1)); err != nil {
			t.Fatalf("a single failed sync was not absorbed: %v", err)
		}
	}
	j.Close()
	crashed := mem.Crash(rand.New(rand.NewPCG(3, 4)))
	recs, probs := all(t, crashed, "/j")
	var seqs []uint64
	for _, r := range recs {
		seqs = append(seqs, r.Seq)
	}
	if fmt.Sprint(seqs) != "[1 2 3]" || len(probs) != 0 {
		t.Fatalf("after a power loss: records %v, problems %v; want [1 2 3] and none", seqs, probs)
	}
}

// TestPersistentSyncFailureFailsWhatFollowedIt: when the redo fails too,
// every record not durable fails with the error, a barrier reports it,
// and the journal appends again once the disk heals.
func TestPersistentSyncFailureFailsWhatFollowedIt(t *testing.T) {
	t.Parallel()
	mem := &fstest.Crash{}
	faulty := &fstest.Faulty{FS: mem}
	g := newGated(faulty)
	j := open(t, Options{FS: g, Dir: "/j"})
	if _, err := j.Write(TypeEvent, payload(0)); err != nil {
		t.Fatal(err)
	}
	g.closed.Store(true)
	done := make(chan error, 3)
	j.Append(TypeEvent, payload(1), func(err error) { done <- err })
	sync1 := heldSync(t, g)
	for i := 2; i <= 3; i++ {
		j.Append(TypeEvent, payload(i), func(err error) { done <- err })
	}
	written := make(chan error, 1)
	j.Written(func(err error) { written <- err })
	waitFor(t, written, "Written of records 2 and 3")
	g.closed.Store(false)
	faulty.FailNth(fstest.OpSync, 1, fstest.EIO, true)
	sync1 <- fstest.EIO
	for i := range 3 {
		if err := waitFor(t, done, fmt.Sprint("record ", i+1)); !errors.Is(err, fstest.EIO) {
			t.Fatalf("record %d: %v; want EIO", i+1, err)
		}
	}
	if err := j.Sync(); !errors.Is(err, fstest.EIO) {
		t.Fatalf("barrier after the failure: %v", err)
	}
	faulty.Heal()
	if _, err := j.Write(TypeEvent, payload(4)); err != nil {
		t.Fatalf("after healing: %v", err)
	}
	j.Close()
	// Records 2-4 were never acknowledged: they may or may not have
	// reached the disk (the cut of the segment could not be synced either).
	recs, _ := all(t, mem.Crash(rand.New(rand.NewPCG(5, 6))), "/j")
	got := map[uint64]bool{}
	for _, r := range recs {
		if r.Seq < 1 || r.Seq > 5 {
			t.Fatalf("record %d after a power loss: nothing like it was appended", r.Seq)
		}
		got[r.Seq] = true
	}
	if !got[1] || !got[5] {
		t.Fatalf("after a power loss: records %v; the acknowledged 1 and 5 must be there", got)
	}
}

// TestLazyRecordsRideAnotherSync: lazy records are written at once but
// start no fsync; the next record's fsync covers them, and Close syncs
// what is left.
func TestLazyRecordsRideAnotherSync(t *testing.T) {
	t.Parallel()
	mem := &fstest.Crash{}
	faulty := &fstest.Faulty{FS: mem}
	j := open(t, Options{FS: faulty, Dir: "/j", LazySync: time.Hour})
	syncs := faulty.Count(fstest.OpSync)
	lazy := make(chan error, 3)
	for i := 1; i <= 3; i++ {
		if _, err := j.AppendLazy(TypeEvent, payload(i), func(err error) { lazy <- err }); err != nil {
			t.Fatal(err)
		}
	}
	written := make(chan error, 1)
	j.Written(func(err error) { written <- err })
	if err := waitFor(t, written, "Written of lazy records"); err != nil {
		t.Fatal(err)
	}
	// The writer may still be deciding; a durable record after them is
	// what settles it, and its fsync must be the only one.
	if _, err := j.Write(TypeEvent, payload(4)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := waitFor(t, lazy, fmt.Sprint("lazy record ", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if n := faulty.Count(fstest.OpSync) - syncs; n != 1 {
		t.Fatalf("%d fsyncs for 3 lazy records and 1 durable one; want 1", n)
	}
	// Close syncs a lazy record that nothing else would.
	if _, err := j.AppendLazy(TypeEvent, payload(5), func(err error) { lazy <- err }); err != nil {
		t.Fatal(err)
	}
	j.Close()
	if err := waitFor(t, lazy, "lazy record at Close"); err != nil {
		t.Fatal(err)
	}
	recs, _ := all(t, mem.Crash(rand.New(rand.NewPCG(7, 8))), "/j")
	if len(recs) != 5 {
		t.Fatalf("%d records after a power loss after Close; want 5", len(recs))
	}
}

// TestLazyRecordsAreSyncedWithinLazySync: with nothing else appended, a
// lazy record gets its own fsync once LazySync has passed, not before.
func TestLazyRecordsAreSyncedWithinLazySync(t *testing.T) {
	t.Parallel()
	mem := &fstest.Crash{}
	faulty := &fstest.Faulty{FS: mem}
	const lazySync = 200 * time.Millisecond
	j := open(t, Options{FS: faulty, Dir: "/j", LazySync: lazySync})
	done := make(chan error, 1)
	began := time.Now()
	if _, err := j.AppendLazy(TypeEvent, payload(1), func(err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(t, done, "the lazy record's fsync"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < lazySync {
		t.Fatalf("a lazy record was synced after %v, before LazySync (%v) and with nothing else to sync", took, lazySync)
	}
}

// TestWrittenReportsAFailedWrite: a caller waiting in Written hears of a
// write that failed (after its retry) while it waited; one that came after
// the failure hears nothing, the record's own done does. Later records are
// written once the disk heals.
func TestWrittenReportsAFailedWrite(t *testing.T) {
	t.Parallel()
	mem := &fstest.Crash{}
	faulty := &fstest.Faulty{FS: mem}
	j := open(t, Options{FS: faulty, Dir: "/j"})
	if _, err := j.Write(TypeEvent, payload(1)); err != nil {
		t.Fatal(err)
	}
	faulty.FailNth(fstest.OpWrite, 1, fstest.ENOSPC, true)
	done := make(chan error, 1)
	if _, err := j.AppendLazy(TypeEvent, payload(2), func(err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	written := make(chan error, 1)
	j.Written(func(err error) { written <- err })
	if err := waitFor(t, written, "Written during a full disk"); err != nil && !errors.Is(err, fstest.ENOSPC) {
		t.Fatalf("Written during a full disk: %v; want ENOSPC (or nil, if the write had failed before it)", err)
	}
	if err := waitFor(t, done, "the record's done during a full disk"); !errors.Is(err, fstest.ENOSPC) {
		t.Fatalf("the record's done during a full disk: %v; want ENOSPC", err)
	}
	faulty.Heal()
	if _, err := j.AppendLazy(TypeEvent, payload(3), nil); err != nil {
		t.Fatal(err)
	}
	j.Written(func(err error) { written <- err })
	if err := waitFor(t, written, "Written after healing"); err != nil {
		t.Fatalf("Written after healing: %v", err)
	}
	if err := j.Sync(); err != nil && !errors.Is(err, fstest.ENOSPC) {
		t.Fatal(err)
	}
	j.Close()
	recs, _ := all(t, mem.Crash(rand.New(rand.NewPCG(9, 10))), "/j")
	got := map[uint64]bool{}
	for _, r := range recs {
		got[r.Seq] = true
	}
	if !got[1] || !got[3] {
		t.Fatalf("records after a power loss: %v; want 1 and 3", got)
	}
}
