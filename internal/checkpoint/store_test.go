package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/fsutil"
	"github.com/vigil-dev/vigil/internal/fsutil/fstest"
	"github.com/vigil-dev/vigil/internal/policy"
	"github.com/vigil-dev/vigil/internal/registry"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const dir = "/state"

func newStore(fsys fsutil.FS, dir string) *Store {
	return &Store{FS: fsys, Dir: dir, Now: func() time.Time { return t0 }}
}

func memStore(t testing.TB) (*Store, *fstest.Crash) {
	t.Helper()
	c := &fstest.Crash{}
	if err := c.MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	return newStore(c, dir), c
}

// testState builds a state of n services; seed varies the contents.
func testState(n, seed int) *State {
	st := &State{SafeMode: seed%5 == 0}
	for i := range n {
		svc := Service{
			Name:     fmt.Sprintf("svc-%03d", i),
			Desired:  DesiredRunning,
			State:    "running",
			Restarts: (seed + i) % 7,
			Tracker: policy.Tracker{Attempt: i % 3, Breaker: policy.BreakerClosed,
				Crashes: []time.Time{t0.Add(-time.Duration(i+1) * time.Minute), t0.Add(-time.Duration(seed) * time.Second)}},
		}
		if i%4 == 3 {
			svc.Desired, svc.State, svc.Tracker.Breaker = DesiredStopped, "failed", policy.BreakerOpen
			svc.Tracker.OpenedAt = t0.Add(-time.Hour)
		} else {
			svc.Instance = &Instance{PID: 1000 + i, PGID: 1000 + i, StartTime: uint64(424242 + seed),
				StartedAt: t0.Add(-time.Duration(seed) * time.Minute), Ready: i%2 == 0,
				Leases: []string{"port:" + fmt.Sprint(8000+i), "lock:db"}}
		}
		if i%3 == 0 {
			svc.Blob = json.RawMessage(fmt.Sprintf(`{"seed":%d,"pad":%q}`, seed, strings.Repeat("x", (seed*37+i)%200)))
		}
		st.Services = append(st.Services, svc)
	}
	for i := range n / 2 {
		st.Sessions = append(st.Sessions, registry.Session{ID: fmt.Sprintf("%016x", seed*1000+i), Name: fmt.Sprint("agent-", i),
			Type: "agent", PID: 2000 + i, StartTime: uint64(515151 + seed), Boot: "b00t",
			Groups:    []registry.Group{{PGID: 2000 + i, LeaderStart: uint64(515151 + seed)}},
			Heartbeat: 5 * time.Second, StaleAfter: 30 * time.Second, RegisteredAt: t0.Add(-time.Hour), LastSeen: t0,
			Stale: i%2 == 1})
	}
	return st
}

func stateJSON(t testing.TB, st *State) string {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustWrite(t testing.TB, s *Store, st *State) Info {
	t.Helper()
	info, err := s.Write(st)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	return info
}

func mustRead(t testing.TB, s *Store, wantGen uint64, want *State) *Loaded {
	t.Helper()
	l, err := s.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if l.Generation != wantGen {
		t.Fatalf("Read: generation %d, want %d", l.Generation, wantGen)
	}
	if got, w := stateJSON(t, &l.State), stateJSON(t, want); got != w {
		t.Fatalf("Read: state\n%s\nwant\n%s", got, w)
	}
	return l
}

func readRaw(t testing.TB, fsys fsutil.FS, path string) []byte {
	t.Helper()
	b, err := fsutil.ReadFile(fsys, path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeRaw(t testing.TB, fsys fsutil.FS, path string, data []byte) {
	t.Helper()
	f, err := fsys.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// frame builds a checkpoint file around an envelope as an independent
// writer following the package comment would.
func frame(envelope string) []byte {
	line := envelope + "\n"
	sum := crc32.Checksum([]byte(line), crc32.MakeTable(crc32.Castagnoli))
	return fmt.Appendf([]byte(line), "crc32c=%08x length=%d\n", sum, len(line))
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	d := t.TempDir()
	s := newStore(nil, d)
	st := testState(6, 1)
	info := mustWrite(t, s, st)
	if info.Generation != 1 || info.Warning != "" {
		t.Fatalf("info = %+v", info)
	}
	fi, err := os.Stat(filepath.Join(d, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != info.Size || fi.Mode().Perm() != 0o600 {
		t.Errorf("file size %d mode %v; info.Size %d", fi.Size(), fi.Mode(), info.Size)
	}
	l := mustRead(t, s, 1, st)
	if l.Path != filepath.Join(d, FileName) || l.FellBack || len(l.Problems) != 0 || len(l.Skipped) != 0 || !l.WrittenAt.Equal(t0) {
		t.Errorf("loaded = %+v", l)
	}
	// The layout is what the package comment promises.
	raw := string(readRaw(t, fsutil.OS{}, l.Path))
	want := `{"format":"vigil-checkpoint","version":1,"generation":1,"written_at":"2026-03-01T12:00:00Z","state":{"safe_mode":false,"services":[`
	if !strings.HasPrefix(raw, want) || strings.Count(raw, "\n") != 2 {
		t.Errorf("file starts %.150q", raw)
	}
	if line := raw[:strings.IndexByte(raw, '\n')+1]; string(frame(line[:len(line)-1])) != raw {
		t.Errorf("trailer differs from an independent encoding:\n%s", raw[len(line):])
	}
}

func TestGenerationsAndBackup(t *testing.T) {
	t.Parallel()
	d := t.TempDir()
	s := newStore(nil, d)
	var states []*State
	for g := 1; g <= 4; g++ {
		st := testState(g+2, g)
		states = append(states, st)
		if info := mustWrite(t, s, st); info.Generation != uint64(g) {
			t.Fatalf("write %d: generation %d", g, info.Generation)
		}
		mustRead(t, s, uint64(g), st)
		if g > 1 {
			b, err := decode(readRaw(t, fsutil.OS{}, filepath.Join(d, BackupName)))
			if err != nil {
				t.Fatal(err)
			}
			if b.Generation != uint64(g-1) || stateJSON(t, &b.State) != stateJSON(t, states[g-2]) {
				t.Fatalf("backup after write %d holds generation %d", g, b.Generation)
			}
		}
	}
	// A new Store (a restarted daemon) continues from the disk.
	s2 := newStore(nil, d)
	if info := mustWrite(t, s2, testState(1, 9)); info.Generation != 5 {
		t.Fatalf("new store wrote generation %d, want 5", info.Generation)
	}
	names, _ := fsutil.OS{}.ReadDir(d)
	if !slices.Equal(names, []string{BackupName, FileName}) {
		t.Errorf("dir holds %v", names)
	}
}

func TestWarnSize(t *testing.T) {
	t.Parallel()
	s, _ := memStore(t)
	s.WarnSize = 100
	info := mustWrite(t, s, testState(3, 1))
	if info.Warning == "" {
		t.Errorf("no warning for %d bytes over WarnSize 100", info.Size)
	}
	mustRead(t, s, 1, testState(3, 1))
}

// TestDamage flips every byte two ways and truncates at every offset of
// a small checkpoint.json: Read must fall back to the backup, never
// return the damaged data, and a later Write must work.
func TestDamage(t *testing.T) {
	t.Parallel()
	s, c := memStore(t)
	prev, cur := testState(1, 1), testState(2, 2)
	mustWrite(t, s, prev)
	mustWrite(t, s, cur)
	good := readRaw(t, c, filepath.Join(dir, FileName))
	type damage struct {
		name string
		data []byte
	}
	var cases []damage
	for i := range good {
		for _, m := range []byte{0xff, 0x01} {
			b := slices.Clone(good)
			b[i] ^= m
			cases = append(cases, damage{fmt.Sprintf("flip %#x at %d", m, i), b})
		}
	}
	for n := range len(good) {
		cases = append(cases, damage{fmt.Sprintf("truncate to %d", n), good[:n]})
	}
	for _, tc := range cases {
		s, c := memStore(t)
		mustWrite(t, s, prev)
		mustWrite(t, s, cur)
		writeRaw(t, c, filepath.Join(dir, FileName), tc.data)
		l, err := s.Read()
		if err != nil {
			t.Fatalf("%s: Read: %v", tc.name, err)
		}
		if l.Generation != 1 || !l.FellBack || stateJSON(t, &l.State) != stateJSON(t, prev) {
			t.Fatalf("%s: read generation %d (fell back %v)", tc.name, l.Generation, l.FellBack)
		}
		if len(l.Problems) != 1 || !errors.Is(l.Problems[0], ErrCorrupt) {
			t.Fatalf("%s: problems %v, want one ErrCorrupt", tc.name, l.Problems)
		}
		next := testState(3, 3)
		info := mustWrite(t, newStore(c, dir), next)
		mustRead(t, s, info.Generation, next)
	}
}

func TestEntryValidation(t *testing.T) {
	t.Parallel()
	good := `{"name":"a","desired":"running","state":"running","restarts":1,"tracker":{"attempt":0,"breaker":"closed"},"instance":{"pid":10,"start_time":5,"pgid":10,"started_at":"2026-03-01T11:00:00Z","ready":true}}`
	good2 := `{"name":"b","desired":"stopped","state":"stopped","restarts":0,"tracker":{"attempt":0,"breaker":""},"blob":[1,2]}`
	bad := map[string]string{
		"bad json":      `{"name":"x","desired":"running","restarts":"many"}`,
		"not an object": `42`,
		"empty name":    `{"name":"","desired":"running"}`,
		"duplicate":     `{"name":"a","desired":"running"}`,
		"desired":       `{"name":"x","desired":"maybe"}`,
		"restarts":      `{"name":"x","desired":"running","restarts":-1}`,
		"breaker":       `{"name":"x","desired":"running","tracker":{"breaker":"ajar"}}`,
		"attempt":       `{"name":"x","desired":"running","tracker":{"attempt":-2}}`,
		"pid":           `{"name":"x","desired":"running","instance":{"pid":0,"pgid":3,"start_time":1}}`,
		"pgid":          `{"name":"x","desired":"running","instance":{"pid":3,"pgid":-1,"start_time":1}}`,
		"start time":    `{"name":"x","desired":"running","instance":{"pid":3,"pgid":3,"start_time":0}}`,
	}
	for name, entry := range bad {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, c := memStore(t)
			env := `{"format":"vigil-checkpoint","version":1,"generation":3,"written_at":"2026-03-01T12:00:00Z","state":{"safe_mode":true,"services":[` +
				good + "," + entry + "," + good2 + `]}}`
			writeRaw(t, c, filepath.Join(dir, FileName), frame(env))
			l, err := s.Read()
			if err != nil {
				t.Fatal(err)
			}
			if !l.State.SafeMode || len(l.State.Services) != 2 || l.State.Services[0].Name != "a" || l.State.Services[1].Name != "b" {
				t.Fatalf("state = %+v", l.State)
			}
			if len(l.Skipped) != 1 || l.Skipped[0].Index != 1 {
				t.Fatalf("skipped = %v", l.Skipped)
			}
			e := l.Skipped[0]
			if !strings.HasPrefix(e.Error(), "checkpoint: "+filepath.Join(dir, FileName)+": services[1]") {
				t.Errorf("error = %q", e)
			}
			t.Log(e)
		})
	}
	t.Run("blob", func(t *testing.T) {
		svc := Service{Name: "x", Desired: DesiredRunning, Blob: json.RawMessage(`{"a":`)}
		if err := svc.Validate(); err == nil {
			t.Error("a service with an invalid blob validates")
		}
	})
}

// TestSessionEntryValidation: a bad session entry is skipped and named;
// the services and the other sessions are kept.
func TestSessionEntryValidation(t *testing.T) {
	t.Parallel()
	good := `{"id":"aa","name":"a","pid":10,"start_time":5,"groups":[{"pgid":10,"leader_start":5}],"heartbeat":5000000000,"stale_after":30000000000,"registered_at":"2026-03-01T11:00:00Z","last_seen":"2026-03-01T11:00:00Z"}`
	good2 := `{"id":"bb","name":"b","pid":11,"start_time":6,"groups":[],"heartbeat":0,"stale_after":0,"registered_at":"2026-03-01T11:00:00Z","last_seen":"2026-03-01T11:00:00Z"}`
	bad := map[string]string{
		"bad json":   `{"id":"x","pid":"ten"}`,
		"no id":      `{"id":"","pid":10,"start_time":5}`,
		"duplicate":  `{"id":"aa","pid":10,"start_time":5}`,
		"pid":        `{"id":"x","pid":0,"start_time":5}`,
		"start time": `{"id":"x","pid":3,"start_time":0}`,
		"group":      `{"id":"x","pid":3,"start_time":1,"groups":[{"pgid":1}]}`,
		"heartbeat":  `{"id":"x","pid":3,"start_time":1,"heartbeat":-1}`,
	}
	for name, entry := range bad {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, c := memStore(t)
			env := `{"format":"vigil-checkpoint","version":1,"generation":3,"written_at":"2026-03-01T12:00:00Z","state":{"safe_mode":false,"services":[],"sessions":[` +
				good + "," + entry + "," + good2 + `]}}`
			writeRaw(t, c, filepath.Join(dir, FileName), frame(env))
			l, err := s.Read()
			if err != nil {
				t.Fatal(err)
			}
			if len(l.State.Sessions) != 2 || l.State.Sessions[0].ID != "aa" || l.State.Sessions[1].ID != "bb" {
				t.Fatalf("sessions = %+v", l.State.Sessions)
			}
			if len(l.Skipped) != 1 || !strings.HasPrefix(l.Skipped[0].Error(), "checkpoint: "+filepath.Join(dir, FileName)+": sessions[1]") {
				t.Fatalf("skipped = %v", l.Skipped)
			}
		})
	}
}

// envelope renders a version/generation/time variant for the tests of
// the envelope's checks.
func envelopeWith(version int, gen uint64, at time.Time) []byte {
	return frame(fmt.Sprintf(`{"format":"vigil-checkpoint","version":%d,"generation":%d,"written_at":%q,"state":{"safe_mode":false,"services":[]}}`,
		version, gen, at.Format(time.RFC3339Nano)))
}

func TestEnvelopeChecks(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		data []byte
		want error
		msg  string
	}{
		{"future version", envelopeWith(2, 5, t0), ErrFutureVersion, "schema version 2 is newer than this vigil (1)"},
		{"version 0", envelopeWith(0, 5, t0), ErrInvalid, "schema version 0 is invalid"},
		{"generation 0", envelopeWith(1, 0, t0), ErrInvalid, "generation is 0"},
		{"too old", envelopeWith(1, 5, t0.Add(-25*time.Hour)), ErrTooOld, "more than 24h0m0s ago"},
		{"from the future", envelopeWith(1, 5, t0.Add(6*time.Minute)), ErrFromFuture, "ahead of the clock"},
		{"format", frame(`{"format":"other","version":1,"generation":1,"written_at":"2026-03-01T12:00:00Z","state":{}}`), ErrInvalid, `format is "other"`},
		{"no written_at", frame(`{"format":"vigil-checkpoint","version":1,"generation":1,"state":{}}`), ErrInvalid, "written_at is missing"},
		{"no state", frame(`{"format":"vigil-checkpoint","version":1,"generation":1,"written_at":"2026-03-01T12:00:00Z"}`), ErrInvalid, "state is missing"},
		{"not json", frame(`{"format":`), ErrInvalid, "envelope"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Alone: a total loss naming the problem.
			s, c := memStore(t)
			path := filepath.Join(dir, FileName)
			writeRaw(t, c, path, tc.data)
			_, err := s.Read()
			if !errors.Is(err, ErrTotalLoss) || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), path+": ") || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Read: %v; want ErrTotalLoss and %v with %q", err, tc.want, tc.msg)
			}
			// Beside a valid backup: a fall back, with the problem reported.
			writeRaw(t, c, filepath.Join(dir, BackupName), envelopeWith(1, 4, t0))
			l, err := s.Read()
			if err != nil {
				t.Fatal(err)
			}
			if l.Generation != 4 || !l.FellBack || len(l.Problems) != 1 || !errors.Is(l.Problems[0], tc.want) {
				t.Fatalf("loaded %+v", l)
			}
			t.Log(l.Problems[0])
		})
	}
	t.Run("future version message", func(t *testing.T) {
		t.Parallel()
		s, c := memStore(t)
		path := filepath.Join(dir, BackupName)
		writeRaw(t, c, path, envelopeWith(2, 5, t0))
		_, err := s.Read()
		want := "checkpoint: " + path + ": schema version 2 is newer than this vigil (1)"
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	})
	t.Run("age limits", func(t *testing.T) {
		t.Parallel()
		s, c := memStore(t)
		writeRaw(t, c, filepath.Join(dir, FileName), envelopeWith(1, 5, t0.Add(-48*time.Hour)))
		if _, err := s.Read(); !errors.Is(err, ErrTooOld) {
			t.Fatalf("Read: %v", err)
		}
		s.MaxAge = 72 * time.Hour
		if _, err := s.Read(); err != nil {
			t.Fatalf("MaxAge 72h: %v", err)
		}
		s.MaxAge = -1
		if _, err := s.Read(); err != nil {
			t.Fatalf("MaxAge -1: %v", err)
		}
	})
}

func TestBothBadAndNone(t *testing.T) {
	t.Parallel()
	s, c := memStore(t)
	if _, err := s.Read(); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrTotalLoss) {
		t.Fatalf("empty dir: %v", err)
	}
	if _, err := newStore(c, "/nowhere").Read(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing dir: %v", err)
	}
	r, err := s.Verify()
	if !errors.Is(err, ErrNotFound) || len(r.Files) != 2 || r.Files[0].Present || r.Chosen != "" {
		t.Fatalf("Verify: %+v, %v", r, err)
	}
	writeRaw(t, c, filepath.Join(dir, FileName), []byte("garbage\n"))
	writeRaw(t, c, filepath.Join(dir, BackupName), envelopeWith(2, 1, t0))
	_, err = s.Read()
	if !errors.Is(err, ErrTotalLoss) || !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrFutureVersion) {
		t.Fatalf("both bad: %v", err)
	}
	t.Log(err)
	r, err = s.Verify()
	if !errors.Is(err, ErrTotalLoss) || r.Chosen != "" || r.Files[0].Valid || r.Files[1].Valid ||
		!r.Files[0].Present || r.Files[0].Problem == "" || r.Files[1].Problem == "" {
		t.Fatalf("Verify: %+v", r)
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	s, c := memStore(t)
	mustWrite(t, s, testState(2, 1))
	st := testState(3, 2)
	st.Services[1].Desired = "sideways" // written as is; the reader skips it
	info := mustWrite(t, s, st)
	r, err := s.Verify()
	if err != nil {
		t.Fatal(err)
	}
	cur, bak := r.Files[0], r.Files[1]
	if r.Chosen != filepath.Join(dir, FileName) || !cur.Valid || cur.Generation != 2 || cur.Size != info.Size ||
		cur.Services != 2 || len(cur.Skipped) != 1 || !cur.WrittenAt.Equal(t0) {
		t.Errorf("current: %+v", cur)
	}
	if !bak.Valid || bak.Generation != 1 || bak.Services != 2 {
		t.Errorf("backup: %+v", bak)
	}
	if _, err := json.Marshal(r); err != nil {
		t.Error(err)
	}
	writeRaw(t, c, filepath.Join(dir, FileName), []byte("x"))
	if r, err = s.Verify(); err != nil || r.Chosen != filepath.Join(dir, BackupName) || r.Files[0].Valid || !strings.Contains(r.Files[0].Problem, "corrupt") {
		t.Errorf("damaged current: %+v, %v", r, err)
	}
}

func TestSymlinksNotFollowed(t *testing.T) {
	t.Parallel()
	d, outside := t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{FileName, BackupName, backupTempName, "checkpoint.0123456789ab.tmp"} {
		if err := os.Symlink(victim, filepath.Join(d, name)); err != nil {
			t.Fatal(err)
		}
	}
	s := newStore(nil, d)
	if _, err := s.Read(); !errors.Is(err, ErrTotalLoss) {
		t.Fatalf("Read through symlinks: %v", err)
	}
	for g := uint64(1); g <= 2; g++ {
		st := testState(int(g), int(g))
		mustWrite(t, s, st)
		mustRead(t, s, g, st)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("the file outside was changed: %q", b)
	}
	for _, name := range []string{FileName, BackupName} {
		if fi, err := os.Lstat(filepath.Join(d, name)); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v, %v", name, fi.Mode(), err)
		}
	}
}

func TestStaleTempsCleaned(t *testing.T) {
	t.Parallel()
	s, c := memStore(t)
	mustWrite(t, s, testState(1, 1))
	for _, name := range []string{"checkpoint.0123456789ab.tmp", backupTempName, "other.tmp"} {
		writeRaw(t, c, filepath.Join(dir, name), []byte("left by a dead writer"))
	}
	mustWrite(t, s, testState(2, 2))
	names, _ := c.ReadDir(dir)
	if !slices.Equal(names, []string{BackupName, FileName, "other.tmp"}) {
		t.Errorf("dir holds %v", names)
	}
}

// recorder notes every file created and every rename attempted.
type recorder struct {
	fsutil.FS
	mu      sync.Mutex
	created []string
	renamed []string // sources
}

func (r *recorder) OpenFile(name string, flag int, perm fs.FileMode) (fsutil.File, error) {
	if flag&os.O_CREATE != 0 {
		r.mu.Lock()
		r.created = append(r.created, name)
		r.mu.Unlock()
	}
	return r.FS.OpenFile(name, flag, perm)
}

func (r *recorder) Rename(oldpath, newpath string) error {
	r.mu.Lock()
	r.renamed = append(r.renamed, oldpath)
	r.mu.Unlock()
	return r.FS.Rename(oldpath, newpath)
}

func TestFaults(t *testing.T) {
	t.Parallel()
	cases := []struct {
		op  fstest.Op
		nth int
		err error
	}{
		{fstest.OpWrite, 1, fstest.ENOSPC},
		{fstest.OpSync, 1, fstest.EIO},
		{fstest.OpLink, 1, fstest.EIO},
		{fstest.OpRename, 1, fstest.EIO}, // the backup's
		{fstest.OpRename, 2, fstest.EIO}, // the new file's
		{fstest.OpSyncDir, 1, fstest.EIO},
	}
	for _, tc := range cases {
		for _, persistent := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s#%d/%v/persistent=%v", tc.op, tc.nth, tc.err, persistent), func(t *testing.T) {
				t.Parallel()
				mem := &fstest.Crash{}
				mem.MkdirAll(dir)
				faulty := &fstest.Faulty{FS: mem}
				rec := &recorder{FS: faulty}
				s := newStore(rec, dir)
				prev := testState(3, 1)
				mustWrite(t, s, testState(2, 0))
				mustWrite(t, s, prev)

				faulty.FailNth(tc.op, tc.nth, tc.err, persistent)
				createdBefore := len(rec.created)
				byGen := map[uint64]*State{2: prev, 3: testState(4, 2), 4: testState(4, 3)}
				_, err := s.Write(byGen[3])
				if !errors.Is(err, tc.err) || !strings.HasPrefix(err.Error(), "checkpoint: "+dir) {
					t.Fatalf("Write: %v, want %v with the path", err, tc.err)
				}
				t.Log(err)
				failedTemp := rec.created[createdBefore]
				check := func() {
					t.Helper()
					names, _ := mem.ReadDir(dir)
					for _, n := range names {
						if strings.HasSuffix(n, fsutil.TempSuffix) {
							t.Fatalf("temp file %s left behind", n)
						}
					}
					reader := newStore(mem, dir)
					if tc.op == fstest.OpSyncDir {
						// The renames happened; only their durability is
						// unknown: what is read is the previous generation
						// or one of the failed writes, intact.
						l, err := reader.Read()
						if err != nil {
							t.Fatal(err)
						}
						if l.Generation < 2 || stateJSON(t, &l.State) != stateJSON(t, byGen[l.Generation]) {
							t.Fatalf("read generation %d after a failed SyncDir", l.Generation)
						}
						return
					}
					mustRead(t, reader, 2, prev)
				}
				check()
				if persistent {
					if _, err := s.Write(byGen[4]); !errors.Is(err, tc.err) {
						t.Fatalf("second Write: %v", err)
					}
					check()
				}
				faulty.Heal()
				next := testState(5, 4)
				info := mustWrite(t, s, next)
				mustRead(t, newStore(mem, dir), info.Generation, next)
				if info.Generation <= 2 {
					t.Errorf("generation %d after 2", info.Generation)
				}
				if tc.op == fstest.OpWrite || tc.op == fstest.OpSync {
					// fsyncgate: the temp file whose write or fsync failed is
					// never renamed into place; later writes use fresh ones.
					if slices.Contains(rec.renamed, failedTemp) {
						t.Errorf("the failed temp file %s was renamed", failedTemp)
					}
					if slices.Index(rec.created, failedTemp) != createdBefore || slices.Contains(rec.created[createdBefore+1:], failedTemp) {
						t.Errorf("temp name %s reused", failedTemp)
					}
				}
			})
		}
	}
}
