// Package recovery runs the daemon's own recovery after an unclean stop as
// a persisted, resumable state machine:
//
//	crashed → detecting → inventorying → restoring → reconciling → live
//
// Each working stage X (detecting, inventorying, restoring, reconciling)
// may also go to itself (a retry after a failed attempt) and to X_failed
// (after Machine.MaxAttempts failed attempts), and X_failed goes back to X
// only by an operator's Machine.Retry. Stage.Successors lists the legal
// successors; any other transition is ErrInvalidTransition.
//
// # Contract
//
// Machine.Run starts a recovery, or resumes the one a killed daemon left
// behind. Before every attempt of a working stage the State is written to
// disk; the stage's Step then runs under Machine.StageTimeout. A persisted
// working stage found by Run is an attempt that was interrupted: it counts
// as failed and the stage is run again with the next attempt number, so a
// daemon that dies in the same stage forever still ends in X_failed; the
// same holds when Run's ctx is cancelled (the daemon is stopping): Run
// returns at once and the next Run counts the attempt. Reaching live
// removes the file. A persisted X_failed is left for the operator.
//
// # File
//
// Store.Dir/recovery.json (FileName) exists exactly while a recovery is in
// progress or has failed. It holds one JSON object (RFC 8259) on one line
// ending in "\n", written with fsutil.WriteFile (temp file, fsync, rename,
// fsync of the directory), created 0600, and is never read or written
// through a symlink. Its members:
//
//	stage       string   "crashed", a working stage, or "<working stage>_failed"
//	attempt     number   1-based attempt of a working stage; for X_failed the
//	                     attempts made; 0 for crashed
//	last_error  string   the error that caused the latest transition; omitted if none
//	started_at  string   RFC 3339 time this recovery began
//	updated_at  string   RFC 3339 time of the latest transition
//	data        any JSON the steps' output (the daemon's inventory), compacted; omitted if none
//	history     array    transitions, oldest first, at most 50: objects with
//	                     from, to (stages), at (RFC 3339), attempt (of "to"), error
//
// Unknown members are ignored. A file that is not exactly one such object,
// names an unknown stage or "live" (never written: reaching live removes
// the file), or has a working stage with attempt < 1, is ErrCorrupt: Load
// never guesses, and Run does not overwrite it.
//
// # Invariants
//
// The file is written before each attempt's Step runs and before each
// transition is reported through Machine.OnTransition, so what observers
// saw is always on disk; Data changed by a Step is only kept if the Step
// succeeds, and is on disk before the next stage starts; every persisted
// transition is legal; Attempt never exceeds MaxAttempts (unless that was
// lowered between runs).
//
// # Not here
//
// It knows nothing about processes, checkpoints or the journal: the daemon
// supplies the Steps (which must be idempotent, since an interrupted
// attempt is run again) and journals and publishes the transitions it is
// handed. It never retries a failed stage on its own: that is the operator's
// decision.
package recovery
