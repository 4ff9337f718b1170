package guardian

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestLoadHistory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h, err := LoadHistory(filepath.Join(dir, "missing.json"))
	if err != nil || len(h.Crashes) != 0 {
		t.Errorf("missing file: %+v, %v; want empty, nil", h, err)
	}
	for _, bad := range []string{"", "{", `{"crashes":[{"at":"yesterday"}]}`, `{"crashes":{}}`, `{} trailing`} {
		p := filepath.Join(dir, "bad.json")
		os.WriteFile(p, []byte(bad), 0o600)
		if h, err := LoadHistory(p); !errors.Is(err, ErrDamagedHistory) || len(h.Crashes) != 0 {
			t.Errorf("LoadHistory(%q) = %+v, %v; want empty, ErrDamagedHistory", bad, h, err)
		}
	}
}

func TestHistoryRoundTripAndBound(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "crashes.json")
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	var h History
	for i := range MaxCrashes + 5 {
		h = h.add(Crash{At: t0.Add(time.Duration(i) * time.Second), PID: 1000 + i, Code: -1, Signal: "SIGSEGV", Reason: ReasonSignal})
	}
	if len(h.Crashes) != MaxCrashes || h.Crashes[0].PID != 1005 {
		t.Fatalf("history keeps %d crashes from pid %d, want the newest %d", len(h.Crashes), h.Crashes[0].PID, MaxCrashes)
	}
	if err := writeHistory(path, h); err != nil {
		t.Fatal(err)
	}
	got, err := LoadHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Crashes) != MaxCrashes || !got.Crashes[99].At.Equal(h.Crashes[99].At) || got.Crashes[99] != h.Crashes[99] {
		t.Errorf("round trip lost data: %+v", got.Crashes[99])
	}
	last := h.Crashes[MaxCrashes-1].At
	for _, tc := range []struct {
		since time.Time
		want  int
	}{{t0, MaxCrashes}, {last, 1}, {last.Add(-2 * time.Second), 3}, {last.Add(time.Nanosecond), 0}} {
		if n := got.CrashesSince(tc.since); n != tc.want {
			t.Errorf("CrashesSince(%v) = %d, want %d", tc.since, n, tc.want)
		}
	}
	checkMode0600(t, path)
}

// The history path is replaced, never followed: a symlink planted there is
// swapped for a regular file and its target is left alone.
func TestWriteHistoryDoesNotFollowSymlinks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("precious"), 0o600)
	path := filepath.Join(dir, "crashes.json")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if err := writeHistory(path, History{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "precious" {
		t.Errorf("symlink target overwritten: %q", b)
	}
	checkMode0600(t, path)
	if b, _ := os.ReadFile(path); string(b) != `{"crashes":[]}` {
		t.Errorf("empty history written as %q", b)
	}
}
