package supervisor

import "fmt"

// State is where a service is in its life; the strings appear verbatim in
// `status --json`.
type State string

const (
	Stopped  State = "stopped"  // not running, and not wanted to run
	Starting State = "starting" // wanted; waiting for dependencies, or spawned and not yet ready
	Running  State = "running"  // an instance is up (and ready)
	Stopping State = "stopping" // the stop signal was sent; waiting for the exit
	Exited   State = "exited"   // ended and the restart policy says not to start it again
	Backoff  State = "backoff"  // ended; an automatic restart is scheduled
	Failed   State = "failed"   // the crash-loop breaker is open: manual action required
)

// successors lists every legal transition. Anything else is a bug in the
// supervisor, reported as an error rather than silently applied.
var successors = map[State][]State{
	Stopped:  {Starting, Failed}, // Failed: restored from a checkpoint with its breaker open
	Starting: {Running, Stopping, Backoff, Exited, Failed, Stopped},
	Running:  {Stopping, Backoff, Exited, Failed, Starting},
	Stopping: {Stopped, Starting, Backoff, Exited, Failed},
	Exited:   {Starting, Stopped},
	Backoff:  {Starting, Stopped},
	Failed:   {Starting, Stopped},
}

// CanMove reports whether from → to is a legal transition.
func CanMove(from, to State) bool {
	for _, s := range successors[from] {
		if s == to {
			return true
		}
	}
	return false
}

// TransitionError is a transition the state machine does not allow.
type TransitionError struct {
	Service  string
	From, To State
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("supervisor: %s: invalid transition %q → %q", e.Service, e.From, e.To)
}

// active reports whether an instance may exist in this state.
func (s State) active() bool { return s == Starting || s == Running || s == Stopping }

// Recovery is the service's recovery story, shown as `recovery` in status.
type Recovery string

const (
	Healthy              Recovery = "healthy"
	PlannedRestart       Recovery = "planned_restart"
	ObservedFailure      Recovery = "observed_failure"
	RecoveryStarted      Recovery = "recovery_started"
	Recovered            Recovery = "recovered"
	RecoveryFailed       Recovery = "recovery_failed"
	ManualActionRequired Recovery = "manual_action_required"
)
