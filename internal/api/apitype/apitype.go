// Package apitype holds the wire structs of vigil's control API, shared by the
// server, its client and the CLI so that every JSON field name exists once.
// Field names follow DESIGN.md §4 exactly; they are a public contract.
package apitype

import (
	"fmt"
	"github.com/vigil-dev/vigil/internal/registry"
	"time"
)

// Status is the answer of GET /v1/status and the body of `vigil status --json`.
type Status struct {
	Daemon   Daemon    `json:"daemon"`
	Services []Service `json:"services"` // in config order
}

// Daemon describes the running daemon.
type Daemon struct {
	PID           int             `json:"pid"`
	Version       string          `json:"version"`
	StartedAt     time.Time       `json:"started_at"`
	SafeMode      bool            `json:"safe_mode"`
	RecoveryStage string          `json:"recovery_stage"`
	Config        string          `json:"config"`
	StateDir      string          `json:"state_dir"`
	Notify        *Notify         `json:"notify,omitempty"`
	Journal       *Journal        `json:"journal,omitempty"`
	Checkpoint    *CheckpointInfo `json:"checkpoint,omitempty"`
}

// Notify counts what reached the sd_notify socket and what was dropped.
type Notify struct {
	Socket   string            `json:"socket"`
	Received uint64            `json:"received"`
	Accepted uint64            `json:"accepted"`
	Dropped  map[string]uint64 `json:"dropped"` // by reason: truncated, no_credentials, rate_limited, oversize, empty, invalid, unknown_sender, not_main
}

// Service is the projection of one service that every interface shows.
type Service struct {
	Name            string     `json:"name"`
	State           string     `json:"state"` // starting running stopping stopped exited backoff failed
	Ready           bool       `json:"ready"`
	PID             int        `json:"pid"` // 0 when no instance runs
	StartedAt       *time.Time `json:"started_at,omitempty"`
	Restarts        int        `json:"restarts"` // automatic restarts only
	LastExit        *Exit      `json:"last_exit"`
	Recovery        string     `json:"recovery"` // healthy planned_restart observed_failure recovery_started recovered recovery_failed manual_action_required
	Breaker         string     `json:"breaker"`  // closed open half_open
	CrashesInWindow int        `json:"crashes_in_window"`
	NextRestartAt   *time.Time `json:"next_restart_at"`
	HeartbeatAgeMS  *int64     `json:"heartbeat_age_ms"`
	Status          string     `json:"status"` // last STATUS= text
	Leases          []string   `json:"leases"` // LEASE= ids the instance holds
	Reason          string     `json:"reason,omitempty"`
}

// Exit is how an instance ended.
type Exit struct {
	Class      string    `json:"class"` // clean stopped exit_code signal heartbeat_timeout unresponsive start_timeout spawn_failed lost
	Code       *int      `json:"code,omitempty"`
	Signal     string    `json:"signal,omitempty"` // "SIGSEGV"
	CoreDumped bool      `json:"core_dumped"`
	At         time.Time `json:"at"`
	Error      string    `json:"error,omitempty"` // spawn_failed: why
}

// Journal is the state of the daemon's journal.
type Journal struct {
	Dir      string   `json:"dir"`
	Appended uint64   `json:"appended"` // records made durable since the daemon started
	Failed   uint64   `json:"failed"`   // records whose write failed
	Behind   uint64   `json:"behind"`   // records refused because the disk fell behind
	LastErr  string   `json:"last_error,omitempty"`
	Repairs  []string `json:"repairs"` // damage found and repaired at start
}

// CheckpointInfo describes the last checkpoint written (the answer of
// POST /v1/checkpoint, and daemon.checkpoint in status).
type CheckpointInfo struct {
	Path       string    `json:"path"`
	Generation uint64    `json:"generation"`
	WrittenAt  time.Time `json:"written_at,omitzero"`
	Size       int64     `json:"size"`
	DurationMS float64   `json:"duration_ms"`
	IntervalMS int64     `json:"interval_ms"` // the scheduler's current interval
	Warning    string    `json:"warning,omitempty"`
	LastErr    string    `json:"last_error,omitempty"`
}

// Crash is one crash as the journal records it, the body of
// `vigil crashes --json` and the payload of a crash.detected event.
type Crash struct {
	Seq       uint64    `json:"seq,omitempty"` // journal sequence number, once journaled
	Service   string    `json:"service"`
	PID       int       `json:"pid"`
	StartTime uint64    `json:"start_time,omitempty"` // with pid, the instance's identity
	Exit      Exit      `json:"exit"`                 // class, code, signal, core flag; at = when it ended
	StartedAt time.Time `json:"started_at"`
	UptimeMS  int64     `json:"uptime_ms"`
	Restarts  int       `json:"restarts"` // automatic restarts before this crash
	Output    []string  `json:"output"`   // the service's last lines of output
	Leases    []string  `json:"leases"`   // LEASE= ids the instance held
	Action    string    `json:"action"`   // what vigil did: "restart in 1s", "manual_action_required", "left down: …"
	// Hooks are the hooks due for this crash ("on_crash", "on_failed"), each
	// run at least once; a hook.finished event records each run.
	Hooks []string `json:"hooks,omitempty"`
}

// Recovery is the daemon's own recovery after an unclean stop: the body of
// GET /v1/recovery and POST /v1/recovery/retry.
type Recovery struct {
	Stage     string               `json:"stage"` // "live" when none runs
	Attempt   int                  `json:"attempt,omitempty"`
	LastError string               `json:"last_error,omitempty"`
	StartedAt time.Time            `json:"started_at,omitzero"`
	History   []RecoveryTransition `json:"history"`
}

// RecoveryTransition is one step of a recovery.
type RecoveryTransition struct {
	From    string    `json:"from"`
	To      string    `json:"to"`
	At      time.Time `json:"at"`
	Attempt int       `json:"attempt"`
	Error   string    `json:"error,omitempty"`
}

// Session is a registered external session (GET /v1/sessions).
type Session = registry.Session

// SessionRequest registers a session: POST /v1/sessions. The owner is PID
// (its start time read from /proc when StartTime is 0); Groups are the
// process groups it owns; zero durations take the config's defaults.
type SessionRequest struct {
	Name       string        `json:"name"`
	Type       string        `json:"type,omitempty"`
	PID        int           `json:"pid"`
	StartTime  uint64        `json:"start_time,omitempty"`
	Groups     []int         `json:"groups,omitempty"`
	Heartbeat  time.Duration `json:"heartbeat,omitempty"`
	StaleAfter time.Duration `json:"stale_after,omitempty"`
}

// Cleanup is what one cleanup of the sessions did: POST /v1/gc.
type Cleanup struct {
	Removed []CleanedSession `json:"removed"` // dead (or stale, with stale_action = "kill")
	Stale   []Session        `json:"stale"`   // reported
	Killed  int              `json:"killed"`  // processes signalled
	// Locks are the lock files of `vigil lock` removed because no one
	// held them (the dead holder's lock was already free).
	Locks  []string `json:"locks_removed"`
	TookMS float64  `json:"took_ms"`
}

// CleanedSession is one removed session and what was killed of it.
type CleanedSession struct {
	Session Session `json:"session"`
	Verdict string  `json:"verdict"` // "dead" or "stale"
	Killed  []int   `json:"killed"`  // pids sent SIGTERM (SIGKILL after the grace)
}

// ReloadResult says what a reload changed.
type ReloadResult struct {
	Added     []string `json:"added"`
	Removed   []string `json:"removed"`
	Changed   []string `json:"changed"`
	Unchanged []string `json:"unchanged"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Code    ErrorCode `json:"code"`
	Message string    `json:"message"`
}

// ErrorCode is the class of an API error; it maps to an HTTP status.
type ErrorCode string

const (
	CodeNotFound           ErrorCode = "not_found"           // 404
	CodeAlreadyExists      ErrorCode = "already_exists"      // 409
	CodeFailedPrecondition ErrorCode = "failed_precondition" // 409
	CodeInvalidArgument    ErrorCode = "invalid_argument"    // 400
	CodeUnavailable        ErrorCode = "unavailable"         // 503
	CodePermissionDenied   ErrorCode = "permission_denied"   // 403
	CodeInternal           ErrorCode = "internal"            // 500
)

// Error implements error so that the server, the supervisor and the client
// share one typed error: errors.Is(err, apitype.ErrNotFound) works on both
// sides of the socket, and nobody matches on message text.
func (e *Error) Error() string { return e.Message }

// Is matches any *Error with the same code when target carries no message,
// so the sentinels below work with errors.Is.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Code == e.Code
}

// Sentinels for errors.Is; they carry a code and no message.
var (
	ErrNotFound           = &Error{Code: CodeNotFound}
	ErrAlreadyExists      = &Error{Code: CodeAlreadyExists}
	ErrFailedPrecondition = &Error{Code: CodeFailedPrecondition}
	ErrInvalidArgument    = &Error{Code: CodeInvalidArgument}
	ErrUnavailable        = &Error{Code: CodeUnavailable}
	ErrPermissionDenied   = &Error{Code: CodePermissionDenied}
)

// Errorf returns an *Error of the given class.
func Errorf(code ErrorCode, format string, args ...any) error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Summary describes how an instance ended, for people: "exit_code 3",
// "signal SIGSEGV (core dumped)", "clean (SIGTERM)", "spawn_failed: …".
func (e *Exit) Summary() string {
	switch {
	case e == nil:
		return "-"
	case e.Error != "":
		return e.Class + ": " + e.Error
	case e.Class == "clean" && e.Signal != "":
		return "clean (" + e.Signal + ")"
	case e.Class == "clean" || e.Class == "stopped":
		return e.Class
	case e.Code != nil:
		return fmt.Sprintf("%s %d", e.Class, *e.Code)
	case e.Signal != "":
		if e.CoreDumped {
			return e.Class + " " + e.Signal + " (core dumped)"
		}
		return e.Class + " " + e.Signal
	}
	return e.Class
}
