// Package fsutil holds vigil's only durability primitives: the small file
// system interface every store writes through, its real implementation,
// and the recipes built on it — create without following symlinks, write a
// file atomically, fsync a directory.
//
// Invariants: every file the daemon creates in its state dir is opened
// with O_NOFOLLOW and O_CLOEXEC and created 0600 (temp files also O_EXCL),
// every directory 0700; a rename is only durable after SyncDir of its
// directory, so the recipes always end with one; a failed fsync is final —
// the file it was for is discarded, never renamed into place and never
// synced again and trusted (PostgreSQL's "fsyncgate").
//
// The interface exists so tests can inject faults without root: see
// package fstest for a fault-injecting layer and one that simulates power
// loss by dropping or tearing whatever was not yet fsync'd.
package fsutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// File is an open file as the stores use it.
type File interface {
	io.Reader
	io.ReaderAt
	io.Writer
	io.Seeker
	Name() string
	Sync() error
	Truncate(size int64) error
	Size() (int64, error)
	Close() error
}

// FS is the file system as the stores use it. Paths are full paths.
type FS interface {
	// OpenFile is os.OpenFile that never follows a symlink in the last
	// path element; it may add O_CLOEXEC.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	Rename(oldpath, newpath string) error
	Link(oldpath, newpath string) error
	Remove(name string) error
	// MkdirAll creates name and its parents with mode 0700.
	MkdirAll(name string) error
	// ReadDir lists the names in dir, sorted.
	ReadDir(dir string) ([]string, error)
	// SyncDir makes the directory's entries (creates, renames, removes) durable.
	SyncDir(dir string) error
}

// OS is the real file system.
type OS struct{}

type osFile struct{ *os.File }

// Datasync is fdatasync(2): the data and what is needed to read it back
// (the size), without the timestamps.
func (f osFile) Datasync() error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if serr = unix.Fdatasync(int(fd)); serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}

// Datasync syncs f's data with fdatasync(2) where f supports it, else fsync.
func Datasync(f File) error {
	if d, ok := f.(interface{ Datasync() error }); ok {
		return d.Datasync()
	}
	return f.Sync()
}

func (f osFile) Size() (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func (OS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = fmt.Errorf("fsutil: %s: not a regular file", name)
		}
		return nil, err
	}
	return osFile{f}, nil
}

func (OS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }
func (OS) Link(oldpath, newpath string) error   { return os.Link(oldpath, newpath) }
func (OS) Remove(name string) error             { return os.Remove(name) }

func (OS) MkdirAll(name string) error {
	if err := os.MkdirAll(name, 0o700); err != nil {
		return err
	}
	st, err := os.Lstat(name)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("fsutil: %s: not a directory", name)
	}
	return nil
}

func (OS) ReadDir(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, nil
}

func (OS) SyncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return &os.PathError{Op: "fsync", Path: dir, Err: err}
	}
	return nil
}

// TempSuffix marks temp files; CleanTemp removes files carrying it.
const TempSuffix = ".tmp"

// CreateTemp creates a new file dir/prefix.<random>.tmp with O_EXCL, so an
// attacker's symlink or a leftover is never written through.
func CreateTemp(fsys FS, dir, prefix string) (File, error) {
	for range 10 {
		var b [6]byte
		rand.Read(b[:])
		name := filepath.Join(dir, prefix+"."+hex.EncodeToString(b[:])+TempSuffix)
		f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
	return nil, fmt.Errorf("fsutil: no free temp name in %s", dir)
}

// CleanTemp removes the temp files left in dir by writers that died
// before renaming them; prefix limits it to one writer's files.
func CleanTemp(fsys FS, dir, prefix string) error {
	names, err := fsys.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, n := range names {
		if strings.HasPrefix(n, prefix+".") && strings.HasSuffix(n, TempSuffix) {
			if err := fsys.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// WriteTemp writes data to a new temp file in dir and fsyncs it. On any
// error the temp file is closed and removed: after a failed fsync its
// contents are unknown, so it must never be renamed into place.
func WriteTemp(fsys FS, dir, prefix string, data []byte) (name string, err error) {
	f, err := CreateTemp(fsys, dir, prefix)
	if err != nil {
		return "", err
	}
	name = f.Name()
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fsys.Remove(name)
		return "", err
	}
	return name, nil
}

// WriteFile replaces path with data atomically and durably: temp file in
// the same directory → write → fsync → close → rename → fsync(dir). A
// reader sees the old contents or the new, never a mix, and once it
// returns nil the new contents survive power loss.
func WriteFile(fsys FS, path string, data []byte) error {
	dir, base := filepath.Split(path)
	dir = filepath.Clean(dir)
	tmp, err := WriteTemp(fsys, dir, base, data)
	if err != nil {
		return err
	}
	if err := fsys.Rename(tmp, path); err != nil {
		fsys.Remove(tmp)
		return err
	}
	return fsys.SyncDir(dir)
}

// ReadFile reads a whole file without following a symlink.
func ReadFile(fsys FS, path string) ([]byte, error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// SortedNames returns names with the given suffix, sorted.
func SortedNames(names []string, suffix string) []string {
	var out []string
	for _, n := range names {
		if strings.HasSuffix(n, suffix) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
