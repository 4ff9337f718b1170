package guardian

// The crash-history file records the daemon's own crashes, newest last:
//
//	{"crashes":[{"at":"2025-01-02T03:04:05.123456789Z","pid":123,"code":-1,
//	             "signal":"SIGKILL","reason":"unresponsive"}]}
//
// "at" is when the guardian reaped the daemon (RFC 3339 with nanoseconds),
// "code" its exit code (-1 when a signal ended it), "signal" the signal's name
// (absent when it exited), "reason" one of the Reason constants. Only the
// newest MaxCrashes are kept. The file is mode 0600 and always replaced
// atomically and durably: a temp file in the same directory, created with
// O_EXCL|O_NOFOLLOW, written, fsync'd, closed, renamed over the file, then the
// directory is fsync'd. Unknown fields are ignored by readers.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Reasons a daemon crash is recorded with.
const (
	ReasonExited       = "exited"       // exited by itself: non-zero code, or 0 without "bye"
	ReasonSignal       = "signal"       // a signal ended it
	ReasonUnresponsive = "unresponsive" // no heartbeat for HeartbeatTimeout; the guardian killed it
)

// MaxCrashes is how many crashes the history keeps (the newest).
const MaxCrashes = 100

// ErrDamagedHistory is wrapped by LoadHistory when the file is not valid.
var ErrDamagedHistory = errors.New("guardian: damaged crash history")

// Crash is one daemon crash.
type Crash struct {
	At     time.Time `json:"at"`
	PID    int       `json:"pid"`
	Code   int       `json:"code"`
	Signal string    `json:"signal,omitempty"`
	Reason string    `json:"reason"`
}

// History is the daemon's crash history, oldest first.
type History struct {
	Crashes []Crash `json:"crashes"`
}

// LoadHistory reads the crash-history file at path. A missing file is an
// empty history; a file that cannot be read or parsed returns an empty
// history and an error (wrapping ErrDamagedHistory when it does not parse).
func LoadHistory(path string) (History, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return History{}, nil
	}
	if err != nil {
		return History{}, fmt.Errorf("guardian: read crash history: %w", err)
	}
	var h History
	if err := json.Unmarshal(b, &h); err != nil {
		return History{}, fmt.Errorf("%w %s: %v", ErrDamagedHistory, path, err)
	}
	return h, nil
}

// CrashesSince counts the crashes at or after t.
func (h History) CrashesSince(t time.Time) int {
	n := 0
	for _, c := range h.Crashes {
		if !c.At.Before(t) {
			n++
		}
	}
	return n
}

// add returns h with c appended, keeping the newest MaxCrashes. It never
// shares the backing array with h.
func (h History) add(c Crash) History {
	all := append(append(make([]Crash, 0, len(h.Crashes)+1), h.Crashes...), c)
	return History{Crashes: all[max(0, len(all)-MaxCrashes):]}
}

var tempSeq atomic.Uint64

// writeHistory replaces the file at path with h, atomically and durably.
func writeHistory(path string, h History) (err error) {
	if h.Crashes == nil {
		h.Crashes = []Crash{}
	}
	b, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("guardian: encode crash history: %w", err)
	}
	dir := filepath.Dir(path)
	tmp := filepath.Join(dir, "."+filepath.Base(path)+".tmp-"+strconv.Itoa(os.Getpid())+"-"+strconv.FormatUint(tempSeq.Add(1), 10))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("guardian: write crash history: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("guardian: write crash history %s: %w", path, err)
		}
	}()
	if _, err = f.Write(b); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// record appends the crash of d, which ended with ws, to the history and
// writes the file.
func (g *guardian) record(d *daemon, ws syscall.WaitStatus) {
	c := Crash{At: time.Now(), PID: d.pid, Code: ws.ExitStatus(), Reason: ReasonExited}
	if ws.Signaled() {
		c.Signal, c.Reason = unix.SignalName(ws.Signal()), ReasonSignal
	}
	if d.killed {
		c.Reason = ReasonUnresponsive
	}
	g.hist = g.hist.add(c)
	if g.o.HistoryPath == "" {
		return
	}
	if err := writeHistory(g.o.HistoryPath, g.hist); err != nil {
		g.o.Logf("%v", err)
	}
}

// startHistory loads the crash history Run starts from, replacing a damaged file.
func startHistory(o Options) History {
	if o.HistoryPath == "" {
		return History{}
	}
	h, err := LoadHistory(o.HistoryPath)
	if err != nil {
		o.Logf("%v; replacing it", err)
		if err := writeHistory(o.HistoryPath, h); err != nil {
			o.Logf("%v", err)
		}
	}
	return h
}
