package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/checkpoint"
	"github.com/vigil-dev/vigil/internal/daemon"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/fsutil"
	"github.com/vigil-dev/vigil/internal/fsutil/fstest"
	"github.com/vigil-dev/vigil/internal/journal"
	"github.com/vigil-dev/vigil/internal/proc"
)

// journalEvents reads the project's journal, newest first, as events.
func (p *project) journalEvents(q journal.Query) []event.Event {
	p.t.Helper()
	recs, probs, err := (&journal.Reader{Dir: filepath.Join(p.dir, ".vigil", "journal")}).Newest(q)
	if err != nil || len(probs) > 0 {
		p.t.Fatalf("reading the journal: %v, problems %v", err, probs)
	}
	out := make([]event.Event, 0, len(recs))
	for _, r := range recs {
		var e event.Event
		if r.Type != journal.TypeShutdown {
			if err := json.Unmarshal(r.Payload, &e); err != nil {
				p.t.Fatalf("journal record %d: %v", r.Seq, err)
			}
		}
		out = append(out, e)
	}
	return out
}

func (p *project) store() *checkpoint.Store {
	return &checkpoint.Store{Dir: filepath.Join(p.dir, ".vigil")}
}

func (p *project) checkpointNow() apitype.CheckpointInfo {
	p.t.Helper()
	info, err := p.c.Checkpoint(context.Background())
	if err != nil {
		p.t.Fatalf("checkpoint now: %v", err)
	}
	return info
}

const journalProject = `
[services.flaky]
command = "echo starting; echo about to fail >&2; sleep 0.2; exit 3"
[services.flaky.backoff]
initial = "20ms"
[services.steady]
command = ["sleep", "1000"]
`

func TestCrashesAreJournaledAndStateIsCheckpointed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := startProjectIn(t, dir, journalProject, nil)
	p.waitFor("flaky", 20*time.Second, "restarted twice", func(s apitype.Service) bool { return s.Restarts >= 2 })

	// Every crash is on disk before its restart: two restarts, two records.
	crashes := p.journalEvents(journal.Query{Types: []journal.Type{journal.TypeCrash}})
	if len(crashes) < 2 {
		t.Fatalf("%d crash records after two restarts", len(crashes))
	}
	for _, e := range crashes {
		c := e.Crash
		if c == nil || c.Service != "flaky" || c.Exit.Class != "exit_code" || *c.Exit.Code != 3 || c.PID == 0 ||
			c.StartTime == 0 || c.UptimeMS < 150 || !strings.HasPrefix(c.Action, "restart in ") ||
			!slices(c.Output, "about to fail") {
			b, _ := json.Marshal(c)
			t.Fatalf("crash record %s", b)
		}
	}
	if crashes[0].Crash.Restarts <= crashes[1].Crash.Restarts || !crashes[0].Time.After(crashes[1].Time) {
		t.Fatalf("crash records not newest first: %+v, %+v", crashes[0].Crash, crashes[1].Crash)
	}

	// The checkpoint holds the live instance, by pid and start time, and
	// the state the service stored.
	steady := p.waitFor("steady", 10*time.Second, "running", running)
	if err := p.c.SetState(context.Background(), "steady", []byte(`{"cursor":7}`)); err != nil {
		t.Fatal(err)
	}
	info := p.checkpointNow()
	l, err := p.store().Read()
	if err != nil || l.Generation != info.Generation || l.FellBack {
		t.Fatalf("read back: %+v, %v (wrote generation %d)", l, err, info.Generation)
	}
	id, err := proc.ReadIdentity(steady.PID)
	if err != nil {
		t.Fatal(err)
	}
	sv := l.State.Services[1]
	if sv.Name != "steady" || sv.Desired != checkpoint.DesiredRunning || sv.Instance == nil ||
		sv.Instance.PID != steady.PID || sv.Instance.StartTime != id.StartTime || sv.Instance.PGID != steady.PID ||
		string(sv.Blob) != `{"cursor":7}` {
		t.Fatalf("steady in the checkpoint: %+v %+v", sv, sv.Instance)
	}
	if fl := l.State.Services[0]; fl.Name != "flaky" || fl.Restarts < 2 || len(fl.Tracker.Crashes) < 2 {
		t.Fatalf("flaky in the checkpoint: %+v", fl)
	}
	for _, path := range []string{filepath.Join(dir, ".vigil", "checkpoint.json"), filepath.Join(dir, ".vigil", "journal")} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]os.FileMode{false: 0o600, true: 0o700}[fi.IsDir()]; fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}

	// A graceful stop writes a final checkpoint, then the clean-shutdown
	// record, so the next daemon knows no recovery is needed.
	p.stop()
	recs, _, err := (&journal.Reader{Dir: filepath.Join(dir, ".vigil", "journal")}).Newest(journal.Query{Limit: 1})
	if err != nil || len(recs) != 1 || recs[0].Type != journal.TypeShutdown {
		t.Fatalf("newest journal record after a graceful stop: %+v, %v", recs, err)
	}
	final, err := p.store().Read()
	if err != nil || final.Generation <= info.Generation {
		t.Fatalf("no final checkpoint: %+v, %v", final, err)
	}

	// The next daemon sees the clean stop and gives the service its state back.
	p2 := startProjectIn(t, dir, journalProject, nil)
	var started []event.Event
	for deadline := time.Now().Add(10 * time.Second); len(started) < 2 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		// The start is journaled without waiting: it may land a moment after ready.
		started = p2.journalEvents(journal.Query{Types: []journal.Type{journal.TypeEvent},
			Match: func(r journal.Record) bool { return bytes.Contains(r.Payload, []byte(event.DaemonStarted)) }})
	}
	if len(started) != 2 || started[0].Message != "previous run ended cleanly" || started[1].Message != "first run in this state dir" {
		t.Fatalf("daemon.started events: %+v", started)
	}
	p2.checkpointNow()
	l, err = p2.store().Read()
	if err != nil || string(l.State.Services[1].Blob) != `{"cursor":7}` {
		t.Fatalf("state after a restart of the daemon: %+v, %v", l, err)
	}
}

func slices(lines []string, want string) bool {
	for _, l := range lines {
		if strings.Contains(l, want) {
			return true
		}
	}
	return false
}

// lockedBuffer is the foreground output, written by the daemon and read
// by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitOutput waits until out contains want.
func waitOutput(t *testing.T, out *lockedBuffer, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output has no %q within %v:\n%s", want, timeout, out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStorageFaultsLeaveCheckpointAndSupervisionIntact fills the disk (or
// breaks it) under a running daemon: checkpoint and journal writes fail,
// the previous checkpoint stays valid, the failures are events, and a
// killed service is still restarted. Once the disk heals, both work again.
func TestStorageFaultsLeaveCheckpointAndSupervisionIntact(t *testing.T) {
	t.Parallel()
	for _, fault := range []error{fstest.ENOSPC, fstest.EIO} {
		t.Run(fault.Error(), func(t *testing.T) {
			t.Parallel()
			faulty := &fstest.Faulty{FS: fsutil.OS{}}
			out := &lockedBuffer{}
			p := startProjectIn(t, t.TempDir(), `
[services.web]
command = ["sleep", "1000"]
`, func(o *daemon.Options) { o.FS, o.Output = faulty, out })
			web := p.waitFor("web", 10*time.Second, "running", running)
			good := p.checkpointNow()

			faulty.FailNth(fstest.OpWrite, 1, fault, true)
			faulty.FailNth(fstest.OpSync, 1, fault, true)
			if _, err := p.c.Checkpoint(context.Background()); err == nil || !strings.Contains(err.Error(), fault.Error()) {
				t.Fatalf("checkpoint on a failing disk: %v", err)
			}
			waitOutput(t, out, "checkpoint failed: ", 10*time.Second)
			if l, err := p.store().Read(); err != nil || l.Generation != good.Generation || l.FellBack {
				t.Fatalf("previous checkpoint after a failed write: %+v, %v", l, err)
			}

			// Supervision goes on: the crash cannot be journaled, the restart happens.
			if err := syscall.Kill(web.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			again := p.waitFor("web", 10*time.Second, "restarted", func(s apitype.Service) bool { return running(s) && s.PID != web.PID })
			waitOutput(t, out, "journal write failed: ", 10*time.Second)
			st := p.status().Daemon
			if st.Journal.Failed == 0 || st.Journal.LastErr == "" || st.Checkpoint.LastErr == "" {
				t.Fatalf("status hides the failures: journal %+v, checkpoint %+v", st.Journal, st.Checkpoint)
			}

			// Healed: checkpoints and crash records are written again.
			faulty.Heal()
			if info := p.checkpointNow(); info.Generation <= good.Generation || info.LastErr != "" {
				t.Fatalf("checkpoint after healing: %+v", info)
			}
			if err := syscall.Kill(again.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			p.waitFor("web", 10*time.Second, "restarted", func(s apitype.Service) bool { return running(s) && s.PID != again.PID })
			crashes := p.journalEvents(journal.Query{Types: []journal.Type{journal.TypeCrash}})
			if len(crashes) == 0 || crashes[0].Crash.PID != again.PID {
				t.Fatalf("crash after healing not journaled: %+v", crashes)
			}
			if errors.Is(fault, fstest.ENOSPC) && !strings.Contains(out.String(), "no space left") {
				t.Errorf("output does not name the full disk:\n%s", out.String())
			}
		})
	}
}
