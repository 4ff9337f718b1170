package policy

import (
	"syscall"
	"testing"
)

func exited(code int) syscall.WaitStatus             { return syscall.WaitStatus(code << 8) }
func signaled(sig syscall.Signal) syscall.WaitStatus { return syscall.WaitStatus(sig) }
func cored(sig syscall.Signal) syscall.WaitStatus    { return syscall.WaitStatus(sig) | 0x80 }

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		ws          syscall.WaitStatus
		stopping    bool
		successExit []int
		want        Exit
	}{
		{"exit 0", exited(0), false, []int{0}, Exit{Class: ClassClean, Exited: true}},
		{"exit 0 without success_exit", exited(0), false, nil, Exit{Class: ClassClean, Exited: true}},
		{"exit 0 when success_exit lists only 3", exited(0), false, []int{3}, Exit{Class: ClassClean, Exited: true}},
		{"exit 3", exited(3), false, []int{0}, Exit{Class: ClassExitCode, Exited: true, Code: 3}},
		{"exit 3 in success_exit", exited(3), false, []int{0, 3}, Exit{Class: ClassClean, Exited: true, Code: 3}},
		{"exit 4 not in success_exit", exited(4), false, []int{0, 3}, Exit{Class: ClassExitCode, Exited: true, Code: 4}},
		{"exit 255", exited(255), false, []int{0}, Exit{Class: ClassExitCode, Exited: true, Code: 255}},
		{"exit 143 after an outside SIGTERM", exited(143), false, []int{0}, Exit{Class: ClassExitCode, Exited: true, Code: 143}},
		{"exit 0 while stopping", exited(0), true, []int{0}, Exit{Class: ClassStopped, Exited: true}},
		{"exit 3 while stopping", exited(3), true, []int{0}, Exit{Class: ClassStopped, Exited: true, Code: 3}},
		{"SIGSEGV with core", cored(syscall.SIGSEGV), false, nil, Exit{Class: ClassSignal, Signal: syscall.SIGSEGV, CoreDumped: true}},
		{"SIGSEGV without core", signaled(syscall.SIGSEGV), false, nil, Exit{Class: ClassSignal, Signal: syscall.SIGSEGV}},
		{"SIGKILL", signaled(syscall.SIGKILL), false, nil, Exit{Class: ClassSignal, Signal: syscall.SIGKILL}},
		{"SIGABRT with core", cored(syscall.SIGABRT), false, nil, Exit{Class: ClassSignal, Signal: syscall.SIGABRT, CoreDumped: true}},
		{"SIGBUS", signaled(syscall.SIGBUS), false, nil, Exit{Class: ClassSignal, Signal: syscall.SIGBUS}},
		{"SIGILL", signaled(syscall.SIGILL), false, nil, Exit{Class: ClassSignal, Signal: syscall.SIGILL}},
		{"SIGFPE", signaled(syscall.SIGFPE), false, nil, Exit{Class: ClassSignal, Signal: syscall.SIGFPE}},
		{"SIGUSR1", signaled(syscall.SIGUSR1), false, nil, Exit{Class: ClassSignal, Signal: syscall.SIGUSR1}},
		{"SIGTERM from outside", signaled(syscall.SIGTERM), false, nil, Exit{Class: ClassClean, Signal: syscall.SIGTERM}},
		{"SIGINT from outside", signaled(syscall.SIGINT), false, nil, Exit{Class: ClassClean, Signal: syscall.SIGINT}},
		{"SIGHUP from outside", signaled(syscall.SIGHUP), false, nil, Exit{Class: ClassClean, Signal: syscall.SIGHUP}},
		{"SIGPIPE", signaled(syscall.SIGPIPE), false, nil, Exit{Class: ClassClean, Signal: syscall.SIGPIPE}},
		{"SIGTERM while stopping", signaled(syscall.SIGTERM), true, nil, Exit{Class: ClassStopped, Signal: syscall.SIGTERM}},
		{"SIGKILL while stopping", signaled(syscall.SIGKILL), true, nil, Exit{Class: ClassStopped, Signal: syscall.SIGKILL}},
		{"SIGSEGV with core while stopping", cored(syscall.SIGSEGV), true, nil, Exit{Class: ClassStopped, Signal: syscall.SIGSEGV, CoreDumped: true}},
		// Not an end at all: a stop (WUNTRACED) or continue status.
		{"stopped by SIGSTOP", syscall.WaitStatus(0x7f | int(syscall.SIGSTOP)<<8), false, nil, Exit{Class: ClassLost}},
		{"continued", syscall.WaitStatus(0xffff), false, nil, Exit{Class: ClassLost}},
		{"continued while stopping", syscall.WaitStatus(0xffff), true, nil, Exit{Class: ClassStopped}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Classify(tt.ws, tt.stopping, tt.successExit); got != tt.want {
				t.Errorf("Classify(%#x, stopping=%v, %v) = %+v, want %+v", uint32(tt.ws), tt.stopping, tt.successExit, got, tt.want)
			}
		})
	}
}

var allClasses = []Class{ClassClean, ClassStopped, ClassExitCode, ClassSignal, ClassHeartbeatTimeout,
	ClassUnresponsive, ClassStartTimeout, ClassSpawnFailed, ClassLost}

func TestIsCrash(t *testing.T) {
	t.Parallel()
	for _, c := range allClasses {
		want := c != ClassClean && c != ClassStopped
		if got := c.IsCrash(); got != want {
			t.Errorf("%q.IsCrash() = %v, want %v", c, got, want)
		}
	}
	if !Class("something_new").IsCrash() {
		t.Error("an unknown class must count as a crash")
	}
}

func TestShouldRestart(t *testing.T) {
	t.Parallel()
	modes := []Restart{RestartAlways, RestartOnFailure, RestartNever, "", "sometimes"}
	// want[class] lists the answer for each mode, in the order of modes.
	want := map[Class][5]bool{
		ClassClean:            {true, false, false, false, false},
		ClassStopped:          {false, false, false, false, false},
		ClassExitCode:         {true, true, false, false, false},
		ClassSignal:           {true, true, false, false, false},
		ClassHeartbeatTimeout: {true, true, false, false, false},
		ClassUnresponsive:     {true, true, false, false, false},
		ClassStartTimeout:     {true, true, false, false, false},
		ClassSpawnFailed:      {true, true, false, false, false},
		ClassLost:             {true, true, false, false, false},
	}
	if len(want) != len(allClasses) {
		t.Fatalf("matrix has %d classes, want all %d", len(want), len(allClasses))
	}
	for _, c := range allClasses {
		for i, r := range modes {
			if got := ShouldRestart(r, c); got != want[c][i] {
				t.Errorf("ShouldRestart(%q, %q) = %v, want %v", r, c, got, want[c][i])
			}
		}
	}
}
