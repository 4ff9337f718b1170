// Package fstest provides file systems for testing the stores' durability
// without root: Faulty fails chosen operations (ENOSPC, EIO, once or from
// then on), and Crash keeps files in memory, tracks what has been fsync'd,
// and produces the states a power loss could leave — unsynced writes
// dropped, torn or kept, unsynced directory changes partly applied — in the
// spirit of SQLite's crash VFS and Pebble's crash-clone file system.
package fstest

import (
	"io/fs"
	"sync"
	"syscall"

	"github.com/vigil-dev/vigil/internal/fsutil"
)

// Op names a file system operation that Faulty can fail.
type Op string

const (
	OpOpen     Op = "open"
	OpWrite    Op = "write"
	OpSync     Op = "sync"
	OpTruncate Op = "truncate"
	OpRename   Op = "rename"
	OpLink     Op = "link"
	OpRemove   Op = "remove"
	OpSyncDir  Op = "syncdir"
)

// Common errors to inject.
var (
	ENOSPC = syscall.ENOSPC
	EIO    = syscall.EIO
)

// Faulty wraps an FS and fails operations as its rules say. A failed
// write first writes half of its bytes, as a full disk does.
type Faulty struct {
	FS fsutil.FS

	mu    sync.Mutex
	count map[Op]int
	rules []rule
}

type rule struct {
	op         Op
	nth        int // 1-based count of op at which failing starts
	err        error
	persistent bool
	used       bool
}

// FailNth makes the nth operation op (counting from 1, from now) fail
// with err; persistent makes every later one fail too.
func (f *Faulty) FailNth(op Op, nth int, err error, persistent bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.count == nil {
		f.count = make(map[Op]int)
	}
	f.rules = append(f.rules, rule{op: op, nth: f.count[op] + nth, err: err, persistent: persistent})
}

// Heal removes every rule.
func (f *Faulty) Heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
}

// Count is how many times op has been attempted.
func (f *Faulty) Count(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count[op]
}

func (f *Faulty) fault(op Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.count == nil {
		f.count = make(map[Op]int)
	}
	f.count[op]++
	n := f.count[op]
	for i := range f.rules {
		r := &f.rules[i]
		if r.op != op || n < r.nth {
			continue
		}
		if r.persistent || (n == r.nth && !r.used) {
			r.used = true
			return r.err
		}
	}
	return nil
}

func pathErr(op Op, name string, err error) error {
	return &fs.PathError{Op: string(op), Path: name, Err: err}
}

func (f *Faulty) OpenFile(name string, flag int, perm fs.FileMode) (fsutil.File, error) {
	if err := f.fault(OpOpen); err != nil {
		return nil, pathErr(OpOpen, name, err)
	}
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultyFile{File: file, fs: f}, nil
}

func (f *Faulty) Rename(oldpath, newpath string) error {
	if err := f.fault(OpRename); err != nil {
		return pathErr(OpRename, oldpath, err)
	}
	return f.FS.Rename(oldpath, newpath)
}

func (f *Faulty) Link(oldpath, newpath string) error {
	if err := f.fault(OpLink); err != nil {
		return pathErr(OpLink, oldpath, err)
	}
	return f.FS.Link(oldpath, newpath)
}

func (f *Faulty) Remove(name string) error {
	if err := f.fault(OpRemove); err != nil {
		return pathErr(OpRemove, name, err)
	}
	return f.FS.Remove(name)
}

func (f *Faulty) MkdirAll(name string) error           { return f.FS.MkdirAll(name) }
func (f *Faulty) ReadDir(dir string) ([]string, error) { return f.FS.ReadDir(dir) }

func (f *Faulty) SyncDir(dir string) error {
	if err := f.fault(OpSyncDir); err != nil {
		return pathErr(OpSyncDir, dir, err)
	}
	return f.FS.SyncDir(dir)
}

type faultyFile struct {
	fsutil.File
	fs *Faulty
}

func (f *faultyFile) Write(p []byte) (int, error) {
	if err := f.fs.fault(OpWrite); err != nil {
		n, _ := f.File.Write(p[:len(p)/2])
		return n, pathErr(OpWrite, f.Name(), err)
	}
	return f.File.Write(p)
}

func (f *faultyFile) Sync() error {
	if err := f.fs.fault(OpSync); err != nil {
		return pathErr(OpSync, f.Name(), err)
	}
	return f.File.Sync()
}

func (f *faultyFile) Truncate(size int64) error {
	if err := f.fs.fault(OpTruncate); err != nil {
		return pathErr(OpTruncate, f.Name(), err)
	}
	return f.File.Truncate(size)
}
