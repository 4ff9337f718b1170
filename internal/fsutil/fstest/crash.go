package fstest

import (
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/vigil-dev/vigil/internal/fsutil"
)

// Crash is an in-memory file system that remembers what has been made
// durable. A file's contents are durable as of its last Sync; a
// directory's entries as of its last SyncDir. Crash returns what a power
// loss could leave behind: for every file, each write since its last Sync
// dropped, torn (a prefix of it kept) or kept, in any combination; for
// every directory, its unsynced changes applied up to a random point, in
// order (a journaling file system commits metadata in order; a rename is
// one change). Directories themselves are durable once created.
//
// Its zero value is an empty file system ready to use.
type Crash struct {
	// SkipDirSync makes SyncDir do nothing: the bug a power-loss test must
	// be able to see.
	SkipDirSync bool
	// AfterOp, if set, is called after every operation that changes
	// something, without any lock held, so a test can take a Crash state
	// at each point of a workload.
	AfterOp func()

	mu   sync.Mutex
	dirs map[string]*memDir
}

type inode struct {
	data    []byte
	synced  []byte
	pending []memWrite
}

type memWrite struct {
	off      int64
	data     []byte
	truncate bool // a truncate to size
	size     int64
}

type memDir struct {
	entries map[string]*inode
	durable map[string]*inode
	pending [][]change // each element is applied atomically
}

type change struct {
	name string
	ino  *inode // nil: removed
}

func (c *Crash) after() {
	if c.AfterOp != nil {
		c.AfterOp()
	}
}

func (c *Crash) dir(name string) (*memDir, error) {
	if c.dirs == nil {
		c.dirs = make(map[string]*memDir)
	}
	d, ok := c.dirs[filepath.Clean(name)]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return d, nil
}

func (c *Crash) split(path string) (*memDir, string, error) {
	path = filepath.Clean(path)
	d, err := c.dir(filepath.Dir(path))
	return d, filepath.Base(path), err
}

func (d *memDir) apply(cs ...change) {
	for _, ch := range cs {
		if ch.ino == nil {
			delete(d.entries, ch.name)
		} else {
			d.entries[ch.name] = ch.ino
		}
	}
	d.pending = append(d.pending, cs)
}

func (c *Crash) MkdirAll(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dirs == nil {
		c.dirs = make(map[string]*memDir)
	}
	for p := filepath.Clean(name); ; p = filepath.Dir(p) {
		if _, ok := c.dirs[p]; !ok {
			c.dirs[p] = &memDir{entries: map[string]*inode{}, durable: map[string]*inode{}}
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

func (c *Crash) OpenFile(name string, flag int, perm fs.FileMode) (fsutil.File, error) {
	c.mu.Lock()
	d, base, err := c.split(name)
	if err != nil {
		c.mu.Unlock()
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	ino, ok := d.entries[base]
	changed := false
	switch {
	case ok && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		c.mu.Unlock()
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrExist}
	case !ok && flag&os.O_CREATE == 0:
		c.mu.Unlock()
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	case !ok:
		ino = &inode{}
		d.apply(change{base, ino})
		changed = true
	}
	if flag&os.O_TRUNC != 0 && len(ino.data) > 0 {
		ino.data = ino.data[:0]
		ino.pending = append(ino.pending, memWrite{truncate: true})
		changed = true
	}
	c.mu.Unlock()
	if changed {
		c.after()
	}
	return &memFile{fs: c, ino: ino, name: name, flag: flag}, nil
}

func (c *Crash) Rename(oldpath, newpath string) error {
	c.mu.Lock()
	od, ob, err := c.split(oldpath)
	if err != nil {
		c.mu.Unlock()
		return &fs.PathError{Op: "rename", Path: oldpath, Err: err}
	}
	nd, nb, err := c.split(newpath)
	if err != nil {
		c.mu.Unlock()
		return &fs.PathError{Op: "rename", Path: newpath, Err: err}
	}
	ino, ok := od.entries[ob]
	if !ok {
		c.mu.Unlock()
		return &fs.PathError{Op: "rename", Path: oldpath, Err: fs.ErrNotExist}
	}
	if od == nd {
		od.apply(change{ob, nil}, change{nb, ino})
	} else {
		nd.apply(change{nb, ino})
		od.apply(change{ob, nil})
	}
	c.mu.Unlock()
	c.after()
	return nil
}

func (c *Crash) Link(oldpath, newpath string) error {
	c.mu.Lock()
	od, ob, err := c.split(oldpath)
	if err != nil {
		c.mu.Unlock()
		return &fs.PathError{Op: "link", Path: oldpath, Err: err}
	}
	nd, nb, err := c.split(newpath)
	if err != nil {
		c.mu.Unlock()
		return &fs.PathError{Op: "link", Path: newpath, Err: err}
	}
	ino, ok := od.entries[ob]
	if !ok {
		c.mu.Unlock()
		return &fs.PathError{Op: "link", Path: oldpath, Err: fs.ErrNotExist}
	}
	if _, ok := nd.entries[nb]; ok {
		c.mu.Unlock()
		return &fs.PathError{Op: "link", Path: newpath, Err: fs.ErrExist}
	}
	nd.apply(change{nb, ino})
	c.mu.Unlock()
	c.after()
	return nil
}

func (c *Crash) Remove(name string) error {
	c.mu.Lock()
	d, base, err := c.split(name)
	if err == nil {
		if _, ok := d.entries[base]; !ok {
			err = fs.ErrNotExist
		}
	}
	if err != nil {
		c.mu.Unlock()
		return &fs.PathError{Op: "remove", Path: name, Err: err}
	}
	d.apply(change{base, nil})
	c.mu.Unlock()
	c.after()
	return nil
}

func (c *Crash) ReadDir(dir string) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, err := c.dir(dir)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: err}
	}
	return slices.Sorted(maps.Keys(d.entries)), nil
}

func (c *Crash) SyncDir(dir string) error {
	c.mu.Lock()
	d, err := c.dir(dir)
	if err != nil {
		c.mu.Unlock()
		return &fs.PathError{Op: "fsync", Path: dir, Err: err}
	}
	if !c.SkipDirSync {
		d.durable = maps.Clone(d.entries)
		d.pending = nil
	}
	c.mu.Unlock()
	c.after()
	return nil
}

// Crash returns the file system as a power loss at this moment could
// leave it, choosing among the possible outcomes with r. The result has
// everything durable: crashing it again changes nothing.
func (c *Crash) Crash(r *rand.Rand) *Crash {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &Crash{dirs: make(map[string]*memDir, len(c.dirs))}
	copied := make(map[*inode]*inode)
	for name, d := range c.dirs {
		entries := maps.Clone(d.durable)
		k := r.IntN(len(d.pending) + 1)
		for _, cs := range d.pending[:k] {
			for _, ch := range cs {
				if ch.ino == nil {
					delete(entries, ch.name)
				} else {
					entries[ch.name] = ch.ino
				}
			}
		}
		nd := &memDir{entries: make(map[string]*inode, len(entries))}
		for n, ino := range entries {
			cp, ok := copied[ino]
			if !ok {
				data := survivor(ino, r)
				cp = &inode{data: data, synced: slices.Clone(data)}
				copied[ino] = cp
			}
			nd.entries[n] = cp
		}
		nd.durable = maps.Clone(nd.entries)
		out.dirs[name] = nd
	}
	return out
}

// survivor is what of ino's contents a power loss leaves: the synced
// contents with each later write dropped, torn or kept.
func survivor(ino *inode, r *rand.Rand) []byte {
	data := slices.Clone(ino.synced)
	for _, w := range ino.pending {
		if w.truncate {
			if r.IntN(2) == 0 {
				data = resize(data, w.size)
			}
			continue
		}
		var keep []byte
		switch r.IntN(3) {
		case 0: // dropped
			continue
		case 1: // kept
			keep = w.data
		case 2: // torn
			keep = w.data[:r.IntN(len(w.data)+1)]
		}
		if end := w.off + int64(len(keep)); end > int64(len(data)) {
			data = resize(data, end)
		}
		copy(data[w.off:], keep)
	}
	return data
}

func resize(b []byte, n int64) []byte {
	if n <= int64(len(b)) {
		return b[:n]
	}
	return append(b, make([]byte, n-int64(len(b)))...)
}

type memFile struct {
	fs     *Crash
	ino    *inode
	name   string
	flag   int
	off    int64
	closed bool
}

func (f *memFile) Name() string { return f.name }

func (f *memFile) check(write bool) error {
	if f.closed {
		return fs.ErrClosed
	}
	if write && f.flag&(os.O_WRONLY|os.O_RDWR) == 0 {
		return syscall.EBADF
	}
	return nil
}

func (f *memFile) Read(p []byte) (int, error) {
	n, err := f.ReadAt(p, f.off)
	f.off += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check(false); err != nil {
		return 0, err
	}
	if off >= int64(len(f.ino.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.ino.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) Write(p []byte) (int, error) {
	f.fs.mu.Lock()
	if err := f.check(true); err != nil {
		f.fs.mu.Unlock()
		return 0, err
	}
	if f.flag&os.O_APPEND != 0 {
		f.off = int64(len(f.ino.data))
	}
	if end := f.off + int64(len(p)); end > int64(len(f.ino.data)) {
		f.ino.data = resize(f.ino.data, end)
	}
	copy(f.ino.data[f.off:], p)
	f.ino.pending = append(f.ino.pending, memWrite{off: f.off, data: slices.Clone(p)})
	f.off += int64(len(p))
	f.fs.mu.Unlock()
	f.fs.after()
	return len(p), nil
}

func (f *memFile) Seek(offset int64, whence int) (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += f.off
	case io.SeekEnd:
		offset += int64(len(f.ino.data))
	}
	if offset < 0 {
		return 0, syscall.EINVAL
	}
	f.off = offset
	return offset, nil
}

func (f *memFile) Sync() error {
	f.fs.mu.Lock()
	if err := f.check(false); err != nil {
		f.fs.mu.Unlock()
		return err
	}
	f.ino.synced = slices.Clone(f.ino.data)
	f.ino.pending = nil
	f.fs.mu.Unlock()
	f.fs.after()
	return nil
}

func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	if err := f.check(true); err != nil {
		f.fs.mu.Unlock()
		return err
	}
	f.ino.data = resize(f.ino.data, size)
	f.ino.pending = append(f.ino.pending, memWrite{truncate: true, size: size})
	f.fs.mu.Unlock()
	f.fs.after()
	return nil
}

func (f *memFile) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	return int64(len(f.ino.data)), nil
}

func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return fs.ErrClosed
	}
	f.closed = true
	return nil
}
