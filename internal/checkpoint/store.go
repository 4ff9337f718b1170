package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/vigil-dev/vigil/internal/fsutil"
)

// File names in Store.Dir.
const (
	FileName       = "checkpoint.json"
	BackupName     = "checkpoint.backup.json"
	tempPrefix     = "checkpoint"
	backupTempName = BackupName + fsutil.TempSuffix
)

var (
	// ErrNotFound: neither file exists — a fresh state dir, not a loss.
	ErrNotFound = errors.New("checkpoint: no checkpoint")
	// ErrTotalLoss: files exist but none is valid; start from the config.
	ErrTotalLoss = errors.New("checkpoint: no valid checkpoint")
	// ErrCorrupt: the trailer is missing or malformed, or the length or
	// checksum does not match.
	ErrCorrupt = errors.New("checkpoint: corrupt")
	// ErrInvalid: the checksum matches but the envelope is not a valid
	// checkpoint of a version this vigil reads.
	ErrInvalid = errors.New("checkpoint: invalid")
	// ErrFutureVersion: written by a newer vigil with a newer schema.
	ErrFutureVersion = errors.New("checkpoint: schema version from the future")
	// ErrTooOld: written longer than Store.MaxAge ago.
	ErrTooOld = errors.New("checkpoint: too old")
	// ErrFromFuture: written_at is more than Store.Skew ahead of the clock.
	ErrFromFuture = errors.New("checkpoint: written in the future")
)

// Store reads and writes the checkpoint files in Dir. Its zero value,
// with Dir set, is ready to use. Writes are serialized; Read and Verify
// may run beside a Write and see the old or the new checkpoint.
type Store struct {
	// FS is where the files live; nil means fsutil.OS{}.
	FS fsutil.FS
	// Dir is the state directory; required. Write creates it if missing.
	Dir string
	// MaxAge rejects checkpoints written longer ago than this; 0 means
	// 24h, negative means no limit.
	MaxAge time.Duration
	// Skew is how far in the future written_at may be (clock steps);
	// 0 means 5m, negative means no limit.
	Skew time.Duration
	// WarnSize is the size above which Write sets Info.Warning; 0 means
	// 50 MiB, negative means never.
	WarnSize int64
	// Now is the clock for written_at and the age checks; nil means time.Now.
	Now func() time.Time

	mu      sync.Mutex
	gen     uint64 // highest generation written or found on disk
	genRead bool
}

// Info describes a checkpoint that was written.
type Info struct {
	Generation uint64
	Size       int64  // bytes in the file
	Warning    string // set when Size exceeds WarnSize; the write still happened
}

// Loaded is the checkpoint Read chose.
type Loaded struct {
	State      State
	Generation uint64
	WrittenAt  time.Time
	// Path is the file it came from.
	Path string
	// FellBack is true when Path is not the current file.
	FellBack bool
	// Problems say why each other file that exists was rejected.
	Problems []error
	// Skipped are the entries of Path left out as invalid.
	Skipped []EntryError
}

// EntryError is one service entry skipped as invalid.
type EntryError struct {
	Path  string `json:"path,omitempty"`
	List  string `json:"list,omitempty"` // "sessions"; empty for services
	Index int    `json:"index"`          // in state.services or state.sessions
	Name  string `json:"name,omitempty"` // a service's name, a session's id
	Err   error  `json:"-"`
}

func (e EntryError) Error() string {
	list := e.List
	if list == "" {
		list = "services"
	}
	where := fmt.Sprintf("%s[%d]", list, e.Index)
	if e.Name != "" {
		where += fmt.Sprintf(" (%q)", e.Name)
	}
	if e.Path != "" {
		where = e.Path + ": " + where
	}
	return "checkpoint: " + where + ": entry skipped: " + e.Err.Error()
}

func (e EntryError) Unwrap() error { return e.Err }

func (s *Store) fsys() fsutil.FS {
	if s.FS == nil {
		return fsutil.OS{}
	}
	return s.FS
}

func (s *Store) now() time.Time {
	if s.Now == nil {
		return time.Now()
	}
	return s.Now()
}

func orDefault[T int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Write makes st the current checkpoint, following the write protocol in
// the package comment, and returns only after it is durable. On error the
// temp files it made are gone and the previous checkpoint is still there.
func (s *Store) Write(st *State) (Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fsys, dir := s.fsys(), s.Dir
	cur, bak := filepath.Join(dir, FileName), filepath.Join(dir, BackupName)
	if !s.genRead {
		if err := fsys.MkdirAll(dir); err != nil {
			return Info{}, fmt.Errorf("checkpoint: %s: %w", dir, err)
		}
		for _, p := range []string{cur, bak} {
			data, err := fsutil.ReadFile(fsys, p)
			switch {
			case err == nil:
				if d, err := decode(data); err == nil {
					s.gen = max(s.gen, d.Generation)
				}
			case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ELOOP):
				// Read never chooses what it cannot open either.
			default:
				// Guessing low could hide a newer generation behind ours.
				return Info{}, fmt.Errorf("checkpoint: %s: %w", p, err)
			}
		}
		s.genRead = true
	}
	s.gen++ // spent even if the write fails: a generation names one state
	data, err := encode(s.gen, s.now(), st)
	if err != nil {
		return Info{}, fmt.Errorf("checkpoint: %s: encoding: %w", cur, err)
	}
	info := Info{Generation: s.gen, Size: int64(len(data))}
	if warn := orDefault(s.WarnSize, 50<<20); warn > 0 && info.Size > warn {
		info.Warning = fmt.Sprintf("checkpoint is %d bytes, more than the %d of warn_size", info.Size, warn)
	}

	if err := fsutil.CleanTemp(fsys, dir, tempPrefix); err != nil {
		return Info{}, fmt.Errorf("checkpoint: %s: removing stale temp files: %w", dir, err)
	}
	tmp, err := fsutil.WriteTemp(fsys, dir, tempPrefix, data)
	if err != nil {
		return Info{}, fmt.Errorf("checkpoint: %s: %w", cur, err)
	}
	// Link, then rename: checkpoint.json is never absent, and the backup
	// name changes atomically from one valid generation to the next.
	btmp := filepath.Join(dir, backupTempName)
	switch err := fsys.Link(cur, btmp); {
	case errors.Is(err, fs.ErrNotExist): // the first checkpoint
	case err != nil:
		fsys.Remove(tmp)
		return Info{}, fmt.Errorf("checkpoint: %s: keeping the backup: %w", cur, err)
	default:
		if err := fsys.Rename(btmp, bak); err != nil {
			fsys.Remove(btmp)
			fsys.Remove(tmp)
			return Info{}, fmt.Errorf("checkpoint: %s: keeping the backup: %w", bak, err)
		}
	}
	if err := fsys.Rename(tmp, cur); err != nil {
		fsys.Remove(tmp)
		return Info{}, fmt.Errorf("checkpoint: %s: %w", cur, err)
	}
	if err := fsys.SyncDir(dir); err != nil {
		return Info{}, fmt.Errorf("checkpoint: %s: %w", dir, err)
	}
	return info, nil
}

// candidate is one file as Read sees it.
type candidate struct {
	path    string
	present bool
	size    int64
	d       *decoded // nil unless it decoded, even if then rejected
	err     error    // why it was rejected; nil if valid
}

func (s *Store) load(name string, now time.Time) candidate {
	c := candidate{path: filepath.Join(s.Dir, name)}
	data, err := fsutil.ReadFile(s.fsys(), c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return c
	}
	c.present, c.size = true, int64(len(data))
	if err != nil {
		c.err = fmt.Errorf("checkpoint: %s: %w", c.path, err)
		return c
	}
	if c.d, err = decode(data); err != nil {
		c.err = fmt.Errorf("checkpoint: %s: %w", c.path, err)
		return c
	}
	for i := range c.d.Skipped {
		c.d.Skipped[i].Path = c.path
	}
	at := c.d.WrittenAt
	if maxAge := orDefault(s.MaxAge, 24*time.Hour); maxAge > 0 && now.Sub(at) > maxAge {
		c.err = fmt.Errorf("checkpoint: %s: written %s, more than %s ago: %w", c.path, at.Format(time.RFC3339), maxAge, ErrTooOld)
	} else if skew := orDefault(s.Skew, 5*time.Minute); skew > 0 && at.Sub(now) > skew {
		c.err = fmt.Errorf("checkpoint: %s: written %s, more than %s ahead of the clock: %w", c.path, at.Format(time.RFC3339), skew, ErrFromFuture)
	}
	return c
}

func (s *Store) loadBoth() (cands [2]candidate, best int, err error) {
	now := s.now()
	cands = [2]candidate{s.load(FileName, now), s.load(BackupName, now)}
	best = -1
	for i, c := range cands {
		if c.err == nil && c.d != nil && (best < 0 || c.d.Generation > cands[best].d.Generation) {
			best = i
		}
	}
	switch {
	case !cands[0].present && !cands[1].present:
		return cands, -1, fmt.Errorf("%w in %s", ErrNotFound, s.Dir)
	case best < 0:
		err := fmt.Errorf("%w in %s", ErrTotalLoss, s.Dir)
		for _, c := range cands {
			if c.present {
				err = fmt.Errorf("%w; %w", err, c.err)
			}
		}
		return cands, -1, err
	}
	return cands, best, nil
}

// Read returns the valid checkpoint with the highest generation: the
// current file, or the backup if the current one is damaged, missing or
// rejected. It fails with ErrNotFound if neither file exists and with an
// error wrapping ErrTotalLoss and each file's problem if none is valid.
func (s *Store) Read() (*Loaded, error) {
	cands, best, err := s.loadBoth()
	if err != nil {
		return nil, err
	}
	c := cands[best]
	l := &Loaded{State: c.d.State, Generation: c.d.Generation, WrittenAt: c.d.WrittenAt,
		Path: c.path, FellBack: best != 0, Skipped: c.d.Skipped}
	for i, o := range cands {
		switch {
		case i == best:
		case o.err != nil:
			l.Problems = append(l.Problems, o.err)
		case !o.present && i == 0:
			l.Problems = append(l.Problems, fmt.Errorf("checkpoint: %s: %w", o.path, fs.ErrNotExist))
		}
	}
	return l, nil
}

// Report is what `vigil checkpoint verify` shows.
type Report struct {
	Dir string `json:"dir"`
	// Chosen is the file Read would return; empty if none is valid.
	Chosen string       `json:"chosen,omitempty"`
	Files  []FileReport `json:"files"` // current, then backup
}

// FileReport describes one checkpoint file.
type FileReport struct {
	Path       string    `json:"path"`
	Present    bool      `json:"present"`
	Valid      bool      `json:"valid"`
	Size       int64     `json:"size"`
	Generation uint64    `json:"generation,omitempty"`
	WrittenAt  time.Time `json:"written_at,omitzero"`
	Services   int       `json:"services"` // valid entries
	Problem    string    `json:"problem,omitempty"`
	Skipped    []string  `json:"skipped,omitempty"`
}

// Verify checks both files without changing anything. The error is Read's:
// nil when a valid checkpoint exists.
func (s *Store) Verify() (Report, error) {
	cands, best, err := s.loadBoth()
	r := Report{Dir: s.Dir}
	if best >= 0 {
		r.Chosen = cands[best].path
	}
	for _, c := range cands {
		f := FileReport{Path: c.path, Present: c.present, Valid: c.present && c.err == nil, Size: c.size}
		if c.err != nil {
			f.Problem = c.err.Error()
		}
		if c.d != nil {
			f.Generation, f.WrittenAt, f.Services = c.d.Generation, c.d.WrittenAt, len(c.d.State.Services)
			for _, e := range c.d.Skipped {
				f.Skipped = append(f.Skipped, e.Error())
			}
		}
		r.Files = append(r.Files, f)
	}
	return r, err
}
