package checkpoint

import (
	"encoding/json"
	"time"

	"github.com/vigil-dev/vigil/internal/policy"
	"github.com/vigil-dev/vigil/internal/registry"
)

// Version is the schema version this build writes and the newest it reads.
const Version = 1

// State is everything recovery needs after the daemon's own death.
type State struct {
	// SafeMode is true while the daemon runs only essential services.
	SafeMode bool      `json:"safe_mode"`
	Services []Service `json:"services"`
	// Sessions are the registered external sessions.
	Sessions []registry.Session `json:"sessions,omitempty"`
}

// Service is one service's checkpointed state.
type Service struct {
	// Name is required and unique within a State.
	Name string `json:"name"`
	// Desired is "running" or "stopped": what the operator wants.
	Desired string `json:"desired"`
	// State is the service's last state as the supervisor saw it.
	State    string `json:"state"`
	Restarts int    `json:"restarts"`
	// Tracker is the breaker and backoff state.
	Tracker       policy.Tracker `json:"tracker"`
	NextRestartAt time.Time      `json:"next_restart_at,omitzero"`
	// Instance is the live instance, if one runs.
	Instance *Instance `json:"instance,omitempty"`
	// Blob is the service's own state, set through the API; any JSON value.
	Blob json.RawMessage `json:"blob,omitempty"`
}

// Desired values.
const (
	DesiredRunning = "running"
	DesiredStopped = "stopped"
)

// Instance names a live process tree for adoption: pid plus start time is
// its identity, pgid and cgroup where its strays are.
type Instance struct {
	PID       int       `json:"pid"`
	StartTime uint64    `json:"start_time"` // /proc/PID/stat field 22
	PGID      int       `json:"pgid"`
	MainPID   int       `json:"main_pid,omitempty"` // when MAINPID= named another process
	StartedAt time.Time `json:"started_at"`
	Ready     bool      `json:"ready"`
	Leases    []string  `json:"leases,omitempty"`
	Cgroup    string    `json:"cgroup,omitempty"` // its cgroup directory, where it has one
	Token     string    `json:"token,omitempty"`  // its VIGIL_INSTANCE value: finds its strays without a cgroup
	Boot      string    `json:"boot,omitempty"`   // the boot it was started in: pid and start time mean nothing in another
}
