package lock

import (
	"context"
	"os"
	"slices"
	"syscall"
	"testing"
)

// sameInode fails unless l's descriptor is the inode its path names now.
func sameInode(t *testing.T, l *Lock) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(l.File().Fd()), &st); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(l.Path())
	if err != nil {
		t.Fatalf("the lock's path: %v", err)
	}
	if !sameFile(&st, fi.Sys().(*syscall.Stat_t)) || st.Nlink != 1 {
		t.Fatalf("the lock holds inode %d (%d links), the path names %d", st.Ino, st.Nlink, fi.Sys().(*syscall.Stat_t).Ino)
	}
}

// A try that opened the file just before Sweep unlinked it notices, and
// takes the lock on the new file instead.
func TestTrySweptBetweenOpenAndLock(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opens := 0
	l, err := acquire(nil, dir, "job", func() {
		opens++
		if opens == 1 {
			if rm, err := Sweep(dir); err != nil || !slices.Equal(rm, []string{"job"}) {
				t.Errorf("Sweep: %v, %v", rm, err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if opens != 2 {
		t.Errorf("%d opens, want 2 (the swept file, then the new one)", opens)
	}
	sameInode(t, l)
}

// A waiter blocked on a file that its holder released and Sweep then
// unlinked wakes up holding a dead inode: it must start again, or a
// newcomer on the new file would hold the lock at the same time.
func TestWaiterSweptWhileBlocked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	holder, err := TryAcquire(dir, "job")
	if err != nil {
		t.Fatal(err)
	}
	opens := 0
	l, err := acquire(context.Background(), dir, "job", func() {
		opens++
		if opens != 2 { // the first open is the try; the second is the blocking wait
			return
		}
		// Just before the wait blocks: the holder goes, Sweep unlinks the
		// file, a newcomer creates and takes a new one.
		holder.Release()
		if rm, err := Sweep(dir); err != nil || len(rm) != 1 {
			t.Errorf("Sweep: %v, %v", rm, err)
		}
		newcomer, nerr := TryAcquire(dir, "job")
		if nerr != nil {
			t.Errorf("newcomer: %v", nerr)
			return
		}
		go newcomer.Release() // lets the waiter in, once it has started again

	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if opens < 3 {
		t.Errorf("%d opens: the waiter kept the swept inode", opens)
	}
	sameInode(t, l)
}

func TestParseLocks(t *testing.T) {
	t.Parallel()
	in := `1: FLOCK  ADVISORY  WRITE 6782 fe:00:9978179 0 EOF
1: -> FLOCK  ADVISORY  WRITE 6790 fe:00:9978179 0 EOF
2: POSIX  ADVISORY  WRITE 10 00:1a:5 0 EOF
3: OFDLCK ADVISORY  WRITE -1 08:01:77 0 EOF
4: FLOCK  ADVISORY  READ 0 103:0a:12 0 EOF
5: FLOCK  broken
`
	got := parseLocks([]byte(in))
	want := []flockEntry{{pid: 6782, major: 0xfe, minor: 0, ino: 9978179}, {pid: 0, major: 0x103, minor: 0xa, ino: 12}}
	if !slices.Equal(got, want) {
		t.Fatalf("parseLocks = %+v, want %+v", got, want)
	}
	st := &syscall.Stat_t{Ino: 12, Dev: 1} // another device: found by inode alone
	if pid, held := find(got, st); !held || pid != 0 {
		t.Errorf("find by inode: %d, %v", pid, held)
	}
	if _, held := find(got, &syscall.Stat_t{Ino: 13}); held {
		t.Error("found a lock on an inode no one locks")
	}
}
