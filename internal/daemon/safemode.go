package daemon

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/vigil-dev/vigil/internal/fsutil"
	"github.com/vigil-dev/vigil/internal/guardian"
)

// HistoryFile is the guardian's record of the daemon's own crashes, in
// the state dir.
const HistoryFile = "daemon-crashes.json"

// safeModeExitFile records when an operator last left safe mode: crashes
// before it have been dealt with and no longer count.
const safeModeExitFile = "safe-mode-exit"

// safeModeAtStart says why this daemon must start in safe mode, or "":
// the guardian counted safe_mode.crashes crashes of the daemon within
// safe_mode.window, or the daemon that crashed was in safe mode.
func (d *daemon) safeModeAtStart() string {
	cfg := d.cfg.Load()
	since := time.Now().Add(-cfg.SafeMode.Window)
	exited := d.safeModeExitedAt()
	if n := cfg.SafeMode.Crashes; n > 0 {
		h, err := guardian.LoadHistory(filepath.Join(cfg.StateDir, HistoryFile))
		if err != nil {
			d.log.Warn("daemon crash history unreadable", "err", err)
		}
		if c := h.CrashesSince(later(since, exited)); c >= n {
			return fmt.Sprintf("%d daemon crashes within %s", c, cfg.SafeMode.Window)
		}
	}
	if prev := d.mem.previous; prev != nil && !d.mem.cleanBefore && prev.State.SafeMode && prev.WrittenAt.After(exited) {
		return "the daemon that crashed was in safe mode"
	}
	return ""
}

// safeModeExitedAt is when an operator last left safe mode; zero if never.
func (d *daemon) safeModeExitedAt() time.Time {
	b, err := fsutil.ReadFile(d.mem.fsys, filepath.Join(d.cfg.Load().StateDir, safeModeExitFile))
	if err != nil {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
	if err != nil {
		return time.Time{}
	}
	return t
}

// noteSafeModeExit records an operator's exit from safe mode, durably, so
// that the crashes that caused it do not put the next daemon back in.
func (d *daemon) noteSafeModeExit(at time.Time) error {
	return fsutil.WriteFile(d.mem.fsys, filepath.Join(d.cfg.Load().StateDir, safeModeExitFile),
		[]byte(at.UTC().Format(time.RFC3339Nano)+"\n"))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
