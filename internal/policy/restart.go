package policy

// Restart is the restart mode; its values are config.Restart's.
type Restart string

const (
	RestartAlways    Restart = "always"
	RestartOnFailure Restart = "on-failure"
	RestartNever     Restart = "never"
)

// ShouldRestart reports whether an instance that ended with class c is
// started again under mode r. A stopped instance never is: vigil asked for
// that end. Any unknown mode, including "", behaves as "never", so a broken
// policy fails towards doing nothing rather than towards a restart storm.
func ShouldRestart(r Restart, c Class) bool {
	if c == ClassStopped {
		return false
	}
	switch r {
	case RestartAlways:
		return true
	case RestartOnFailure:
		return c.IsCrash()
	}
	return false
}
