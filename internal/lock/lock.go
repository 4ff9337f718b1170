// Package lock gives scripts and vigil named locks that die with their
// holder: `vigil lock NAME -- CMD` runs CMD while holding NAME, and no
// crash — not even SIGKILL — can leave a lock held by nobody.
//
// A lock is an flock(2) exclusive lock on a dedicated file, DIR/NAME.lock
// (DIR is <state dir>/locks, see Dir). The kernel attaches an flock lock to
// the open file description, not to a pid: it is inherited across fork and
// exec along with the descriptor and released the moment the last
// descriptor sharing it is closed — which the kernel does itself when the
// processes holding it exit, however they exit. Nothing in the file is ever
// consulted to decide whether a lock is held.
//
// Invariants:
//   - A lock file is never renamed or replaced. It is created 0600 with
//     O_NOFOLLOW (a symlink is refused, never followed) in a directory
//     created 0700 that must not itself be a symlink; names follow the
//     service-name rule (ValidName), so a name can never reach outside DIR.
//   - A lock file is unlinked only by a process holding the lock on the
//     inode the path names (Sweep). So after taking the lock, Acquire checks
//     that its descriptor's inode is still the one at the path (and still
//     linked); if not, it lost a race with Sweep and starts again on the
//     new file. Whoever returns from Acquire holds the lock on the inode
//     the path names, and that inode cannot be unlinked while it does:
//     mutual exclusion holds across Sweep.
//   - Who holds a lock is read from the kernel: /proc/locks reports, for an
//     flock lock, the pid of the process that took it, by device and inode
//     (open-file-description fcntl locks, the other lock that dies with its
//     descriptor, show pid -1 there, which is why this package uses flock).
//     After taking a lock, Acquire writes the holder's pid, its start time
//     (/proc/PID/stat field 22) and the time it took the lock into the file.
//     That content is for display only: it is shown when it agrees with the
//     kernel's pid and that process's start time, and ignored otherwise.
//     When the process that took a lock has exited and a child that
//     inherited the descriptor holds it on, the kernel still names the dead
//     process (0 outside the initial pid namespace): Holder.Exited says so.
//
// Descriptors are always opened close-on-exec. A lock ends with Release,
// which unlocks it for every process sharing the descriptor, or with Close,
// which leaves it to the children that inherited it (see Close for the
// instant a concurrent fork can extend it).
//
// What it deliberately does not do: it does not unlink a lock file on
// release (Sweep does that, for `vigil gc`), it does not offer shared
// locks, and it cannot interrupt a wait already blocked in the kernel: when
// Acquire's context ends first, one goroutine stays blocked until the lock
// is next free, takes it and releases it at once. It is meant for processes
// that exit soon after giving up, like `vigil lock`.
package lock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/vigil-dev/vigil/internal/proc"
	"golang.org/x/sys/unix"
)

// Suffix ends every lock file's name.
const Suffix = ".lock"

// Errors. Test with errors.Is.
var (
	// ErrHeld is returned (as a *HeldError) when a lock was not acquired
	// because someone else holds it.
	ErrHeld = errors.New("lock: held by another process")
	// ErrBadName is returned for a name that breaks the naming rule.
	ErrBadName = errors.New("lock: bad name")
	// ErrRefused is returned when a lock file or the lock directory is a
	// symlink, or not a regular file (directory) at all: it is never
	// followed or used.
	ErrRefused = errors.New("lock: refused")
)

// name is the service-name rule (internal/config), so that a service's
// name is always a valid lock name.
var name = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

const nameRule = "names are 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"

// ValidName reports whether n can name a lock: the same rule as service
// names, so no name is empty, starts with a dot or contains a slash.
func ValidName(n string) error {
	if !name.MatchString(n) {
		return fmt.Errorf("%w %q: %s", ErrBadName, n, nameRule)
	}
	return nil
}

// Dir returns the lock directory of a state dir.
func Dir(stateDir string) string { return filepath.Join(stateDir, "locks") }

// Path returns the file that backs the lock name in dir.
func Path(dir, n string) (string, error) {
	if err := ValidName(n); err != nil {
		return "", err
	}
	return filepath.Join(dir, n+Suffix), nil
}

// Lock is a held lock. It stays held until Release and until every
// process that inherited File has exited or closed it.
type Lock struct {
	name string
	path string
	f    *os.File
}

// Name returns the lock's name.
func (l *Lock) Name() string { return l.name }

// Path returns the lock's file.
func (l *Lock) Path() string { return l.path }

// File returns the descriptor that holds the lock. A child given it (as
// exec.Cmd.ExtraFiles) holds the lock too, for as long as it keeps it open,
// even after this process exits; see Close. It is close-on-exec here.
func (l *Lock) File() *os.File { return l.f }

// Release unlocks and closes the lock's descriptor: the lock is free at
// once, also for any child that inherited the descriptor. The file stays
// (see Sweep).
func (l *Lock) Release() error {
	err := unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("lock: release %s: %w", l.path, err)
	}
	return nil
}

// Close closes the lock's descriptor without unlocking it: the lock is
// free once no child that inherited the descriptor has it open any more
// (at once if none did), the way flock(1) leaves it to its command.
//
// A child this process forks has a copy of every descriptor until its exec
// closes the close-on-exec ones, so a lock closed while a fork is under way
// could stay held until that exec. Close holds syscall.ForkLock for reading
// meanwhile (Go's exec holds it from fork until the child's exec is under
// way), which leaves only the few microseconds before the exec'ing kernel
// closes the copy; Release, which unlocks first, has no such window.
func (l *Lock) Close() error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("lock: close %s: %w", l.path, err)
	}
	return nil
}

// HeldError says a lock was not acquired because another process holds
// it, and who that is as far as the kernel tells.
type HeldError struct {
	Name   string
	Path   string
	Holder Holder
	// Err is why Acquire stopped waiting (its context's error); nil after
	// a single try.
	Err error
}

func (e *HeldError) Error() string {
	h := e.Holder
	switch {
	case h.PID == 0:
		return fmt.Sprintf("lock %q is held (the kernel does not say by whom)", e.Name)
	case h.Exited:
		return fmt.Sprintf("lock %q is held by a process that inherited it from pid %d, which has exited", e.Name, h.PID)
	case !h.Since.IsZero():
		return fmt.Sprintf("lock %q is held by pid %d (since %s, %s ago)", e.Name, h.PID,
			h.Since.Local().Format(time.DateTime), time.Since(h.Since).Truncate(time.Second))
	default:
		return fmt.Sprintf("lock %q is held by pid %d", e.Name, h.PID)
	}
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// Unwrap returns why the wait ended, so errors.Is(err,
// context.DeadlineExceeded) works.
func (e *HeldError) Unwrap() error { return e.Err }

// TryAcquire takes the lock name in dir if it is free, and otherwise
// returns a *HeldError at once. It creates dir (0700) and the lock file
// (0600) as needed.
func TryAcquire(dir, n string) (*Lock, error) {
	return acquire(nil, dir, n, nil)
}

// Acquire takes the lock name in dir, waiting until it is free or ctx
// ends; then it returns a *HeldError wrapping ctx's error. The wait is the
// kernel's: the lock is taken the moment its holder releases it or dies.
func Acquire(ctx context.Context, dir, n string) (*Lock, error) {
	return acquire(ctx, dir, n, nil)
}

// acquire is Acquire, or TryAcquire when ctx is nil. afterOpen, when not
// nil, runs between opening the file and locking it (tests race Sweep
// there).
func acquire(ctx context.Context, dir, n string, afterOpen func()) (*Lock, error) {
	path, err := Path(dir, n)
	if err != nil {
		return nil, err
	}
	if err := makeDir(dir); err != nil {
		return nil, err
	}
	l, err := lockLoop(path, n, false, afterOpen)
	if ctx == nil || !errors.Is(err, ErrHeld) {
		return l, err
	}
	if ctx.Done() == nil {
		return lockLoop(path, n, true, afterOpen)
	}
	type result struct {
		l   *Lock
		err error
	}
	ch := make(chan result, 1)
	go func() {
		l, err := lockLoop(path, n, true, afterOpen)
		ch <- result{l, err}
	}()
	select {
	case r := <-ch:
		return r.l, r.err
	case <-ctx.Done():
	}
	select {
	case r := <-ch: // ready at the same moment: take it
		return r.l, r.err
	default:
	}
	// A wait blocked in flock(2) cannot be cancelled: let it finish and
	// give the lock straight back.
	go func() {
		if r := <-ch; r.l != nil {
			r.l.Release()
		}
	}()
	he := &HeldError{Name: n, Path: path, Err: ctx.Err()}
	if fi, err := os.Lstat(path); err == nil {
		he.Holder = holderOf(path, fi.Sys().(*syscall.Stat_t))
	}
	return nil, he
}

// lockLoop opens path and locks it, again and again until the inode it
// locked is the one the path names.
func lockLoop(path, n string, wait bool, afterOpen func()) (*Lock, error) {
	for {
		f, err := openFile(path, create)
		if err != nil {
			return nil, err
		}
		if afterOpen != nil {
			afterOpen()
		}
		st, err := flock(f, wait)
		if errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, &HeldError{Name: n, Path: path, Holder: holderOf(path, st)}
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock: %s: %w", path, err)
		}
		cur, err := os.Lstat(path)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			f.Close()
			return nil, fmt.Errorf("lock: %s: %w", path, err)
		}
		if err != nil || !sameFile(st, cur.Sys().(*syscall.Stat_t)) || st.Nlink == 0 {
			// Swept while we waited: this inode no longer is the lock.
			f.Close()
			continue
		}
		writeInfo(f)
		return &Lock{name: n, path: path, f: f}, nil
	}
}

// flock takes an exclusive flock on f (waiting when wait is set) and
// returns f's stat, taken after the lock so it is current.
func flock(f *os.File, wait bool) (*syscall.Stat_t, error) {
	how := unix.LOCK_EX
	if !wait {
		how |= unix.LOCK_NB
	}
	var err error
	for {
		if err = unix.Flock(int(f.Fd()), how); err != unix.EINTR {
			break
		}
	}
	var st syscall.Stat_t
	if serr := syscall.Fstat(int(f.Fd()), &st); serr != nil && err == nil {
		err = serr
	}
	return &st, err
}

func sameFile(a, b *syscall.Stat_t) bool { return a.Dev == b.Dev && a.Ino == b.Ino }

// Flags for openFile.
const (
	create   = unix.O_RDWR | unix.O_CREAT
	existing = unix.O_RDWR
	readOnly = unix.O_RDONLY
)

// openFile opens a lock file with flags (create, existing or readOnly)
// without following a symlink, and refuses anything but a regular file.
func openFile(path string, flags int) (*os.File, error) {
	flags |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	var fd int
	var err error
	for {
		if fd, err = unix.Open(path, flags, 0o600); err != unix.EINTR {
			break
		}
	}
	switch err {
	case unix.ELOOP:
		return nil, fmt.Errorf("%w: %s is a symlink (never followed)", ErrRefused, path)
	case unix.EISDIR:
		return nil, fmt.Errorf("%w: %s is a directory", ErrRefused, path)
	}
	if err != nil {
		return nil, &fs.PathError{Op: "lock: open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock: %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%w: %s is a %s", ErrRefused, path, kind(fi.Mode()))
	}
	return f, nil
}

func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	default:
		return "special file (" + m.Type().String() + ")"
	}
}

// makeDir creates dir 0700 (and its parents) and refuses a dir that is a
// symlink or not a directory.
func makeDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: lock directory %s is a %s", ErrRefused, dir, kind(fi.Mode()))
	}
	return nil
}

// info is what a holder writes into its lock file, for display only.
type info struct {
	PID        int       `json:"pid"`
	StartTime  uint64    `json:"start_time"`
	AcquiredAt time.Time `json:"acquired_at"`
}

// writeInfo records this process as the holder. It is best effort: the
// content never decides anything.
func writeInfo(f *os.File) {
	id, err := proc.ReadIdentity(os.Getpid())
	if err != nil {
		return
	}
	b, _ := json.Marshal(info{PID: id.PID, StartTime: id.StartTime, AcquiredAt: time.Now()})
	if f.Truncate(0) == nil {
		f.WriteAt(append(b, '\n'), 0)
	}
}

// readInfo reads what the holder recorded; a zero info when unreadable.
func readInfo(path string) info {
	var in info
	f, err := openFile(path, readOnly)
	if err != nil {
		return in
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 4096))
	json.Unmarshal(b, &in)
	return in
}

// Sweep removes the lock files in dir that no one holds, for `vigil gc`,
// and returns the names it removed. For each file it takes the lock
// without waiting (a held lock is skipped), checks the path still names
// the inode it locked, and unlinks it while holding it; a waiter that had
// opened the old file notices and retries on a new one. A sweep holds each
// free lock for a moment, so a `vigil lock --timeout 0` racing with it may
// find the lock held. Symlinks and other strangers are left alone and
// reported in the error, which joins every problem met; a missing dir is
// empty.
func Sweep(dir string) (removed []string, err error) {
	names, err := names(dir)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, n := range names {
		ok, err := sweepOne(filepath.Join(dir, n+Suffix))
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			removed = append(removed, n)
		}
	}
	return removed, errors.Join(errs...)
}

func sweepOne(path string) (bool, error) {
	f, err := openFile(path, existing)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil // swept by someone else
	}
	if err != nil {
		return false, err
	}
	defer func() {
		unix.Flock(int(f.Fd()), unix.LOCK_UN) // waiters on this inode wake and start again
		f.Close()
	}()
	st, err := flock(f, false)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lock: sweep %s: %w", path, err)
	}
	cur, err := os.Lstat(path)
	if err != nil || !sameFile(st, cur.Sys().(*syscall.Stat_t)) {
		return false, nil // replaced by a sweep and a new lock since we opened it
	}
	// Only a holder of the path's inode unlinks it, and we hold it now.
	if err := os.Remove(path); err != nil {
		return false, fmt.Errorf("lock: sweep: %w", err)
	}
	return true, nil
}

// names lists the lock names in dir, sorted; files that are not
// NAME.lock with a valid name are not locks and are ignored.
func names(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	var out []string
	for _, e := range ents {
		n, ok := strings.CutSuffix(e.Name(), Suffix)
		if ok && ValidName(n) == nil {
			out = append(out, n)
		}
	}
	return out, nil
}
