package recovery

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Stage is a state of the recovery machine.
type Stage string

// The stages, in order; each working stage has a failure state.
const (
	Crashed            Stage = "crashed"
	Detecting          Stage = "detecting"
	Inventorying       Stage = "inventorying"
	Restoring          Stage = "restoring"
	Reconciling        Stage = "reconciling"
	Live               Stage = "live"
	DetectingFailed    Stage = "detecting_failed"
	InventoryingFailed Stage = "inventorying_failed"
	RestoringFailed    Stage = "restoring_failed"
	ReconcilingFailed  Stage = "reconciling_failed"
)

// ErrInvalidTransition is wrapped by every error for a transition that is
// not in the table.
var ErrInvalidTransition = errors.New("recovery: invalid transition")

// successors is the transition table: the legal successors of each stage.
var successors = map[Stage][]Stage{
	Crashed:            {Detecting},
	Detecting:          {Inventorying, Detecting, DetectingFailed},
	Inventorying:       {Restoring, Inventorying, InventoryingFailed},
	Restoring:          {Reconciling, Restoring, RestoringFailed},
	Reconciling:        {Live, Reconciling, ReconcilingFailed},
	Live:               nil,
	DetectingFailed:    {Detecting},
	InventoryingFailed: {Inventorying},
	RestoringFailed:    {Restoring},
	ReconcilingFailed:  {Reconciling},
}

// Stages returns every stage: the main path in order, then the failure states.
func Stages() []Stage {
	return []Stage{Crashed, Detecting, Inventorying, Restoring, Reconciling, Live,
		DetectingFailed, InventoryingFailed, RestoringFailed, ReconcilingFailed}
}

// Successors returns the stages s may go to; nil for live and unknown stages.
func (s Stage) Successors() []Stage { return slices.Clone(successors[s]) }

// Valid reports whether s is a known stage.
func (s Stage) Valid() bool { _, ok := successors[s]; return ok }

// Working reports whether s is a stage that runs a Step.
func (s Stage) Working() bool {
	return s == Detecting || s == Inventorying || s == Restoring || s == Reconciling
}

// Failed reports whether s is a failure state (X_failed).
func (s Stage) Failed() bool { return s.Valid() && strings.HasSuffix(string(s), "_failed") }

// failure returns X_failed for a working stage X.
func (s Stage) failure() Stage { return s + "_failed" }

// retried returns X for a failure state X_failed.
func (s Stage) retried() Stage { return Stage(strings.TrimSuffix(string(s), "_failed")) }

// next returns the stage after a working stage succeeds.
func (s Stage) next() Stage { return successors[s][0] }

// CheckTransition returns nil if from → to is legal, else an error
// wrapping ErrInvalidTransition.
func CheckTransition(from, to Stage) error {
	if slices.Contains(successors[from], to) {
		return nil
	}
	return fmt.Errorf("%w %q → %q", ErrInvalidTransition, from, to)
}
