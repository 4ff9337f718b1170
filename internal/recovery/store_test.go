package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func sampleState() State {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	return State{
		Stage: Restoring, Attempt: 2, LastError: "boom",
		StartedAt: t0, UpdatedAt: t0.Add(time.Second),
		Data: json.RawMessage(`{"instances":[{"pid":42}]}`),
		History: []Transition{
			{From: Crashed, To: Detecting, At: t0, Attempt: 1},
			{From: Restoring, To: Restoring, At: t0.Add(time.Second), Attempt: 2, Error: "boom"},
		},
	}
}

func stateJSON(t *testing.T, st State) string {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestStoreRoundTripModeAndClear(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state") // Save creates it
	s := &Store{Dir: dir}
	if _, ok, err := s.Load(); ok || err != nil {
		t.Fatalf("Load of nothing = %v, %v; want not ok, nil", ok, err)
	}
	want := sampleState()
	if err := s.Save(want); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Load()
	if !ok || err != nil || stateJSON(t, got) != stateJSON(t, want) {
		t.Fatalf("Load = %+v, %v, %v; want %+v", got, ok, err, want)
	}
	fi, err := os.Lstat(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != 0o600 {
		t.Errorf("mode = %v, want -rw-------", fi.Mode())
	}
	if names, _ := os.ReadDir(dir); len(names) != 1 {
		t.Errorf("dir holds %v, want only %s", names, FileName)
	}
	// Leftover temp files of a writer that died are removed by Save.
	os.WriteFile(filepath.Join(dir, FileName+".abcdef012345.tmp"), []byte("x"), 0o600)
	if err := s.Save(want); err != nil {
		t.Fatal(err)
	}
	if names, _ := os.ReadDir(dir); len(names) != 1 {
		t.Errorf("dir holds %v after Save, want only %s", names, FileName)
	}
	for range 2 { // the second Clear finds nothing, which is fine
		if err := s.Clear(); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := s.Load(); ok || err != nil {
			t.Fatalf("Load after Clear = %v, %v", ok, err)
		}
	}
	if err := (&Store{}).Save(want); err == nil {
		t.Error("Save with no Dir succeeded")
	}
	if err := s.Save(State{Stage: Live}); err == nil {
		t.Error("Save of a live state succeeded; live is never persisted")
	}
}

func TestStoreDoesNotFollowSymlinks(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target.json")
	orig := stateJSON(t, sampleState())
	os.WriteFile(target, []byte(orig), 0o600)
	os.Symlink(target, filepath.Join(dir, FileName))
	s := &Store{Dir: dir}
	if _, ok, err := s.Load(); ok || err == nil || errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load through a symlink = %v, %v; want an error", ok, err)
	}
	if err := s.Save(State{Stage: Crashed}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != orig {
		t.Error("Save wrote through the symlink")
	}
	if st, ok, err := s.Load(); !ok || err != nil || st.Stage != Crashed {
		t.Errorf("Load after Save = %+v, %v, %v", st, ok, err)
	}
}

func TestLoadDamaged(t *testing.T) {
	cases := map[string]string{
		"empty":          "",
		"not json":       "hello",
		"torn":           `{"stage":"restoring","attempt":`,
		"array":          `[]`,
		"wrong type":     `{"stage":"restoring","attempt":"two"}`,
		"unknown stage":  `{"stage":"exploding","attempt":1}`,
		"no stage":       `{"attempt":1}`,
		"live":           `{"stage":"live"}`,
		"attempt 0":      `{"stage":"restoring","attempt":0}`,
		"negative":       `{"stage":"restoring_failed","attempt":-1}`,
		"trailing data":  `{"stage":"crashed"} {"stage":"crashed"}`,
		"trailing bytes": `{"stage":"crashed"}x`,
		"bad data":       `{"stage":"crashed","data":{"a":}}`,
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			os.WriteFile(path, []byte(content), 0o600)
			_, ok, err := (&Store{Dir: dir}).Load()
			if ok || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Load = %v, %v; want ErrCorrupt naming %s", ok, err, path)
			}
			// Run refuses to start over it and leaves it for a person to look at.
			m := &Machine{Store: &Store{Dir: dir}}
			if _, err := m.Status(); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Status = %v, want ErrCorrupt", err)
			}
			if _, err := m.Run(t.Context()); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Run = %v, want ErrCorrupt", err)
			}
			if b, _ := os.ReadFile(path); string(b) != content {
				t.Error("Run changed the damaged file")
			}
		})
	}
}

// Every truncation of a valid file is either rejected as damaged or, if
// only white space was cut, read back whole.
func TestLoadEveryTruncation(t *testing.T) {
	dir := t.TempDir()
	s := &Store{Dir: dir}
	want := sampleState()
	if err := s.Save(want); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)
	full, _ := os.ReadFile(path)
	for n := range len(full) {
		os.WriteFile(path, full[:n], 0o600)
		st, ok, err := s.Load()
		switch {
		case err != nil && errors.Is(err, ErrCorrupt) && !ok:
		case err == nil && ok && strings.TrimSpace(string(full[n:])) == "" && stateJSON(t, st) == stateJSON(t, want):
		default:
			t.Fatalf("truncated to %d of %d bytes: Load = %+v, %v, %v", n, len(full), st, ok, err)
		}
	}
}

func TestHistoryIsCapped(t *testing.T) {
	m, _ := newMachine(t)
	m.MaxAttempts = 100
	fails := 0
	m.Steps = map[Stage]Step{Detecting: func(_ context.Context, st *State) error {
		if fails < 70 {
			fails++
			return errors.New("again")
		}
		return nil
	}}
	m.BeforeStage = func(st State) {
		if len(st.History) > maxHistory {
			t.Errorf("history of %d transitions", len(st.History))
		}
	}
	st, err := m.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.History) != maxHistory {
		t.Fatalf("history of %d transitions, want %d", len(st.History), maxHistory)
	}
	if last := st.History[maxHistory-1]; last.From != Reconciling || last.To != Live {
		t.Errorf("newest transition is %v, want reconciling → live", last)
	}
	if !slices.IsSortedFunc(st.History, func(a, b Transition) int { return a.At.Compare(b.At) }) {
		t.Error("history is not oldest first")
	}
}

// TestSetAside: a damaged file is moved to .broken, after which Load finds
// nothing and a new recovery can be saved.
func TestSetAside(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := &Store{Dir: dir}
	if err := os.WriteFile(s.Path(), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Load(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("load of a damaged file: %v", err)
	}
	if err := s.SetAside(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(s.Path() + ".broken"); err != nil || string(b) != "{not json" {
		t.Fatalf("set-aside copy: %q, %v", b, err)
	}
	if _, ok, err := s.Load(); ok || err != nil {
		t.Fatalf("after SetAside: ok %v, %v", ok, err)
	}
	if err := s.SetAside(); err != nil {
		t.Fatalf("SetAside with no file: %v", err)
	}
}
