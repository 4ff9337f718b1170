package daemon

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/vigil-dev/vigil/internal/guardian"
)

// HistoryFile is the guardian's record of the daemon's own crashes, in
// the state dir.
const HistoryFile = "daemon-crashes.json"

// safeModeAtStart says why this daemon must start in safe mode, or "":
// the guardian counted safe_mode.crashes crashes of the daemon within
// safe_mode.window, or the daemon that crashed was in safe mode.
func (d *daemon) safeModeAtStart() string {
	cfg := d.cfg.Load()
	if n := cfg.SafeMode.Crashes; n > 0 {
		h, err := guardian.LoadHistory(filepath.Join(cfg.StateDir, HistoryFile))
		if err != nil {
			d.log.Warn("daemon crash history unreadable", "err", err)
		}
		if c := h.CrashesSince(time.Now().Add(-cfg.SafeMode.Window)); c >= n {
			return fmt.Sprintf("%d daemon crashes within %s (safe_mode.crashes = %d)", c, cfg.SafeMode.Window, n)
		}
	}
	if prev := d.mem.previous; prev != nil && !d.mem.cleanBefore && prev.State.SafeMode {
		return "the daemon that crashed was in safe mode"
	}
	return ""
}
