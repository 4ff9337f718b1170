package recovery

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"time"

	"github.com/vigil-dev/vigil/internal/fsutil"
)

// FileName is the recovery file in Store.Dir.
const FileName = "recovery.json"

// maxHistory is how many transitions State.History keeps.
const maxHistory = 50

// ErrCorrupt is wrapped by Load's error for a file that exists but is not
// a valid recovery state.
var ErrCorrupt = errors.New("recovery: damaged recovery file")

// State is what is persisted before each attempt of a stage starts. Its
// zero value is not a valid state (Stage ""); a new recovery starts at
// Crashed.
type State struct {
	// Stage is the current stage.
	Stage Stage `json:"stage"`
	// Attempt is the 1-based attempt of a working Stage; for X_failed the
	// number of attempts made; 0 for Crashed and Live.
	Attempt int `json:"attempt"`
	// LastError is the error that caused the latest transition (a failed or
	// interrupted attempt); "" after a forward transition or a Retry.
	LastError string `json:"last_error,omitempty"`
	// StartedAt is when this recovery began.
	StartedAt time.Time `json:"started_at"`
	// UpdatedAt is when the latest transition happened; StartedAt at first.
	UpdatedAt time.Time `json:"updated_at"`
	// Data is the working stages' output carried to later stages (the
	// daemon's inventory), opaque to this package, so a daemon killed
	// mid-recovery resumes with it. A Step may replace it with valid JSON;
	// it is persisted after the Step succeeds. nil: none yet.
	Data json.RawMessage `json:"data,omitempty"`
	// History is the transitions of this recovery, newest last, at most
	// 50 kept. nil: none yet.
	History []Transition `json:"history"`
}

// Transition is one change of stage.
type Transition struct {
	From Stage     `json:"from"`
	To   Stage     `json:"to"`
	At   time.Time `json:"at"`
	// Attempt is the attempt of To that the transition starts (State.Attempt after it).
	Attempt int `json:"attempt"`
	// Error is the failed attempt's error for X → X and X → X_failed; "" otherwise.
	Error string `json:"error,omitempty"`
}

func (t Transition) String() string {
	s := fmt.Sprintf("%s → %s #%d", t.From, t.To, t.Attempt)
	if t.Error != "" {
		s += ": " + t.Error
	}
	return s
}

func (s State) clone() State {
	s.Data = bytes.Clone(s.Data)
	s.History = slices.Clone(s.History)
	return s
}

// Store keeps a State in Dir/recovery.json. Its zero value with Dir set is
// ready to use; it does no locking of its own (one Machine owns it).
type Store struct {
	// FS is where the file lives; nil means fsutil.OS{}.
	FS fsutil.FS
	// Dir is the state directory; required. Save creates it if missing.
	Dir string
}

func (s *Store) fsys() fsutil.FS {
	if s.FS == nil {
		return fsutil.OS{}
	}
	return s.FS
}

// Path is the recovery file's path.
func (s *Store) Path() string { return filepath.Join(s.Dir, FileName) }

var errNoDir = errors.New("recovery: Store.Dir is empty")

// Load reads the persisted state. ok is false, with a nil error, when
// there is no file: no recovery is in progress. A damaged file is an error
// wrapping ErrCorrupt and naming the path.
func (s *Store) Load() (st State, ok bool, err error) {
	if s.Dir == "" {
		return State{}, false, errNoDir
	}
	data, err := fsutil.ReadFile(s.fsys(), s.Path())
	if errors.Is(err, fs.ErrNotExist) {
		return State{}, false, nil
	}
	if err != nil {
		return State{}, false, fmt.Errorf("recovery: load: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&st); err != nil {
		return State{}, false, fmt.Errorf("%w: %s: %v", ErrCorrupt, s.Path(), err)
	}
	if dec.Decode(new(json.RawMessage)) != io.EOF {
		return State{}, false, fmt.Errorf("%w: %s: data after the JSON object", ErrCorrupt, s.Path())
	}
	if err := st.validate(); err != nil {
		return State{}, false, fmt.Errorf("%w: %s: %v", ErrCorrupt, s.Path(), err)
	}
	return st, true, nil
}

// validate checks what Load and Save require of a persisted state.
func (st State) validate() error {
	switch {
	case !st.Stage.Valid() || st.Stage == Live:
		return fmt.Errorf("stage %q cannot be persisted", st.Stage)
	case st.Attempt < 0 || st.Stage.Working() && st.Attempt < 1:
		return fmt.Errorf("attempt %d at stage %q", st.Attempt, st.Stage)
	}
	return nil
}

// Save replaces the file with st atomically and durably.
func (s *Store) Save(st State) error {
	if s.Dir == "" {
		return errNoDir
	}
	if err := st.validate(); err != nil {
		return fmt.Errorf("recovery: save: %w", err)
	}
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("recovery: save: %w", err)
	}
	fsys := s.fsys()
	if err := fsys.MkdirAll(s.Dir); err != nil {
		return fmt.Errorf("recovery: save: %w", err)
	}
	if err := fsutil.CleanTemp(fsys, s.Dir, FileName); err != nil {
		return fmt.Errorf("recovery: save: %w", err)
	}
	if err := fsutil.WriteFile(fsys, s.Path(), append(data, '\n')); err != nil {
		return fmt.Errorf("recovery: save %s: %w", s.Path(), err)
	}
	return nil
}

// Clear removes the file durably (recovery is done). No file is not an error.
func (s *Store) Clear() error {
	if s.Dir == "" {
		return errNoDir
	}
	fsys := s.fsys()
	if err := fsys.Remove(s.Path()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("recovery: clear: %w", err)
	}
	// Sync even when the file was already gone: an earlier Clear may have
	// removed it and then failed to sync.
	if err := fsys.SyncDir(s.Dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("recovery: clear: %w", err)
	}
	return nil
}

// SetAside moves a damaged file out of the way, to Path()+".broken" (an
// older one there is replaced), so that a recovery can start afresh while
// what was found stays for a person to read. No file is not an error.
func (s *Store) SetAside() error {
	if s.Dir == "" {
		return errNoDir
	}
	fsys := s.fsys()
	if err := fsys.Rename(s.Path(), s.Path()+".broken"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("recovery: set aside: %w", err)
	}
	if err := fsys.SyncDir(s.Dir); err != nil {
		return fmt.Errorf("recovery: set aside: %w", err)
	}
	return nil
}
