package policy

import (
	"slices"
	"syscall"
)

// Class is how an instance ended; the values appear verbatim as
// last_exit.class in every interface.
type Class string

const (
	// ClassClean: exit 0, a code in success_exit, or SIGTERM, SIGINT, SIGHUP or
	// SIGPIPE that vigil did not send.
	ClassClean Class = "clean"
	// ClassStopped: the instance ended while vigil was stopping it (an
	// operator stop or a planned restart), however it ended.
	ClassStopped Class = "stopped"
	// ClassExitCode: an exit code that is neither 0 nor in success_exit.
	ClassExitCode Class = "exit_code"
	// ClassSignal: death by any other signal (SIGKILL, SIGSEGV, SIGABRT, ...).
	ClassSignal Class = "signal"
	// ClassHeartbeatTimeout: no heartbeat for 2 × watchdog and the process is gone.
	ClassHeartbeatTimeout Class = "heartbeat_timeout"
	// ClassUnresponsive: no heartbeat for 2 × watchdog while the process is alive.
	ClassUnresponsive Class = "unresponsive"
	// ClassStartTimeout: readiness was not reached within start_timeout.
	ClassStartTimeout Class = "start_timeout"
	// ClassSpawnFailed: the program could not be started at all.
	ClassSpawnFailed Class = "spawn_failed"
	// ClassLost: an adopted instance ended and its status cannot be known, or
	// a wait status showed neither an exit nor a signal death.
	ClassLost Class = "lost"
)

// IsCrash reports whether c is a failure: every class except clean and
// stopped, including ones this package does not know.
func (c Class) IsCrash() bool {
	return c != ClassClean && c != ClassStopped
}

// Exit is a classified end of an instance.
type Exit struct {
	Class Class
	// Exited is true when the process called exit; Code is then its exit code.
	Exited bool
	Code   int
	// Signal is the signal that killed the process, 0 when it exited.
	Signal     syscall.Signal
	CoreDumped bool
}

// Classify applies DESIGN §3 to a wait status. stopRequested is true when
// vigil had asked the instance to stop; whatever it died of is then the
// answer to that request and the class is ClassStopped. Exit code 0 is always
// clean, whatever successExit lists.
func Classify(ws syscall.WaitStatus, stopRequested bool, successExit []int) Exit {
	switch {
	case ws.Exited():
		e := Exit{Exited: true, Code: ws.ExitStatus()}
		switch {
		case stopRequested:
			e.Class = ClassStopped
		case e.Code == 0 || slices.Contains(successExit, e.Code):
			e.Class = ClassClean
		default:
			e.Class = ClassExitCode
		}
		return e
	case ws.Signaled():
		e := Exit{Signal: ws.Signal(), CoreDumped: ws.CoreDump()}
		switch {
		case stopRequested:
			e.Class = ClassStopped
		case isPoliteSignal(e.Signal):
			e.Class = ClassClean
		default:
			e.Class = ClassSignal
		}
		return e
	case stopRequested:
		return Exit{Class: ClassStopped}
	default:
		// A stop/continue status is no end at all; passing one here is the
		// caller's mistake, and the honest answer is that the end is unknown.
		return Exit{Class: ClassLost}
	}
}

// isPoliteSignal reports whether sig asks a process to finish rather than
// reporting a fault: systemd counts these as a clean end.
func isPoliteSignal(sig syscall.Signal) bool {
	switch sig {
	case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE:
		return true
	}
	return false
}
