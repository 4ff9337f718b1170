package config

import (
	"slices"
	"strings"
	"time"
)

// Journal configures the crash journal (<state>/journal).
type Journal struct {
	SegmentSize      int64         // bytes; default 8 MiB
	MaxSize          int64         // bytes of all segments; default 256 MiB
	MaxAge           time.Duration // default 720h (30 days)
	CrashOutputLines int           // lines of output kept in a crash record; default 20
	CrashOutputBytes int           // at most this many bytes of them; default 8 KiB
}

// Checkpoint configures the checkpoint scheduler and reader.
type Checkpoint struct {
	Interval time.Duration // default 60s
	Activity int           // events that bring the next checkpoint forward; default 50
	MaxAge   time.Duration // an older checkpoint is not trusted; default 24h
	WarnSize int64         // a larger checkpoint raises a warning; default 50 MiB
}

// SafeMode says when the daemon falls back to running essential services
// only: after Crashes crashes of the daemon itself within Window, as the
// guardian counts them. Crashes = 0 never enters it on its own.
type SafeMode struct {
	Crashes int           // default 3
	Window  time.Duration // default 60s
}

// Sessions configures the registry of external sessions (`vigil run`,
// `vigil session register`) and its cleanup.
type Sessions struct {
	Heartbeat     time.Duration // a session's default heartbeat interval; default 5s
	StaleAfter    time.Duration // no heartbeat for this long is stale; default 30s
	StaleAction   string        // "report" (default) or "kill"
	CleanupPeriod time.Duration // how often dead and stale sessions are swept; default 60s
	KillGrace     time.Duration // SIGTERM to SIGKILL; default 5s
}

// Stale actions.
const (
	StaleReport = "report"
	StaleKill   = "kill"
)

var (
	defaultSessions = Sessions{Heartbeat: 5 * time.Second, StaleAfter: 30 * time.Second, StaleAction: StaleReport,
		CleanupPeriod: 60 * time.Second, KillGrace: 5 * time.Second}
	sessionsKeys      = []string{"heartbeat", "stale_after", "stale_action", "cleanup_period", "kill_grace"}
	defaultSafeMode   = SafeMode{Crashes: 3, Window: 60 * time.Second}
	safeModeKeys      = []string{"crashes", "window"}
	defaultJournal    = Journal{SegmentSize: 8 << 20, MaxSize: 256 << 20, MaxAge: 720 * time.Hour, CrashOutputLines: 20, CrashOutputBytes: 8 << 10}
	defaultCheckpoint = Checkpoint{Interval: 60 * time.Second, Activity: 50, MaxAge: 24 * time.Hour, WarnSize: 50 << 20}
	journalKeys       = []string{"segment_size", "max_size", "max_age", "crash_output_lines", "crash_output_bytes"}
	checkpointKeys    = []string{"interval", "activity", "max_age", "warn_size"}
)

// maxCrashOutput caps crash_output_bytes: a crash record stays small.
const maxCrashOutput = 64 << 10

func (d *decoder) journal(v *value, path string) Journal {
	j := defaultJournal
	d.eachField(v, path, journalKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "segment_size":
			if n, ok := d.size(f, fp); ok {
				if n < 64<<10 {
					d.add(f.pos, "%s: must be at least 64KiB", fp)
				} else {
					j.SegmentSize = n
				}
			}
		case "max_size":
			if n, ok := d.size(f, fp); ok {
				j.MaxSize = n
			}
		case "max_age":
			if t, ok := d.positive(f, fp); ok {
				j.MaxAge = t
			}
		case "crash_output_lines":
			if n, ok := d.nonNegativeInt(f, fp); ok {
				j.CrashOutputLines = n
			}
		case "crash_output_bytes":
			if n, ok := d.size(f, fp); ok {
				if n > maxCrashOutput {
					d.add(f.pos, "%s: at most 64KiB", fp)
				} else {
					j.CrashOutputBytes = int(n)
				}
			}
		default:
			return false
		}
		return true
	})
	return j
}

func (d *decoder) checkpoint(v *value, path string) Checkpoint {
	c := defaultCheckpoint
	d.eachField(v, path, checkpointKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "interval":
			if t, ok := d.positive(f, fp); ok {
				c.Interval = t
			}
		case "activity":
			if n, ok := d.nonNegativeInt(f, fp); ok {
				c.Activity = n
			}
		case "max_age":
			if t, ok := d.positive(f, fp); ok {
				c.MaxAge = t
			}
		case "warn_size":
			if n, ok := d.size(f, fp); ok {
				c.WarnSize = n
			}
		default:
			return false
		}
		return true
	})
	return c
}

func (d *decoder) safeMode(v *value, path string) SafeMode {
	m := defaultSafeMode
	d.eachField(v, path, safeModeKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "crashes":
			if n, ok := d.nonNegativeInt(f, fp); ok {
				m.Crashes = n
			}
		case "window":
			if t, ok := d.positive(f, fp); ok {
				m.Window = t
			}
		default:
			return false
		}
		return true
	})
	return m
}

func (d *decoder) sessions(v *value, path string) Sessions {
	c := defaultSessions
	d.eachField(v, path, sessionsKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "heartbeat", "stale_after", "cleanup_period", "kill_grace":
			t, ok := d.positive(f, fp)
			if !ok {
				return true
			}
			switch key {
			case "heartbeat":
				c.Heartbeat = t
			case "stale_after":
				c.StaleAfter = t
			case "cleanup_period":
				c.CleanupPeriod = t
			case "kill_grace":
				c.KillGrace = t
			}
		case "stale_action":
			if a, ok := d.enum(f, fp, []string{StaleReport, StaleKill}); ok {
				c.StaleAction = a
			}
		default:
			return false
		}
		return true
	})
	return c
}

// enum accepts a string among values.
func (d *decoder) enum(f *value, path string, values []string) (string, bool) {
	want := `"` + strings.Join(values, `" or "`) + `"`
	if f.kind != kindString {
		d.wrongType(f, path, "a string ("+want+")")
		return "", false
	}
	if !slices.Contains(values, f.text) {
		d.add(f.pos, `%s: invalid value %q; want %s%s`, path, f.text, want, suggestion(f.text, values))
		return "", false
	}
	return f.text, true
}
