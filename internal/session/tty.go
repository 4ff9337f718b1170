package session

import (
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// terminal returns stdin's descriptor when the session is interactive:
// stdin is a terminal whose foreground process group is the guard's. It
// returns -1 otherwise.
func terminal(stdin *os.File) int {
	fd := int(stdin.Fd())
	pg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
	if err != nil || pg != unix.Getpgrp() {
		return -1
	}
	return fd
}

// setForeground makes pgrp the terminal's foreground process group. A
// process outside the foreground group may do so only with SIGTTOU blocked
// or ignored; it is blocked on this thread alone, for this call alone, so
// no child ever inherits it.
func setForeground(tty, pgrp int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var set, old unix.Sigset_t
	n := uint(syscall.SIGTTOU) - 1
	bits := uint(8 * unsafe.Sizeof(set.Val[0]))
	set.Val[n/bits] |= 1 << (n % bits)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &set, &old); err != nil {
		return err
	}
	defer unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	return unix.IoctlSetPointerInt(tty, unix.TIOCSPGRP, pgrp)
}

// giveBackTerminal returns the terminal to the guard's group once CMD has
// ended, if CMD's group still holds it.
func (g *guard) giveBackTerminal() {
	if g.tty < 0 {
		return
	}
	if pg, err := unix.IoctlGetInt(g.tty, unix.TIOCGPGRP); err == nil && pg == g.child.pid {
		if err := setForeground(g.tty, unix.Getpgrp()); err != nil {
			g.cfg.Log.Warn("session: take back the terminal", "err", err)
		}
	}
}

// jobStop handles CMD being stopped (Ctrl-Z) in an interactive session:
// the guard takes the terminal back and stops itself, so the owner's shell
// sees its job stop as it would had CMD been its own child. Once continued
// (fg or bg), it gives the terminal back to CMD if the guard was put in the
// foreground, and continues CMD.
func (g *guard) jobStop() {
	self := unix.Getpgrp()
	_ = setForeground(g.tty, self)
	stopSelf()
	if pg, err := unix.IoctlGetInt(g.tty, unix.TIOCGPGRP); err == nil && pg == self {
		_ = setForeground(g.tty, g.child.pid)
	}
	g.signalGroup(syscall.SIGCONT)
}

// stopSelf stops the guard with SIGTSTP and returns once it is continued.
// The signal goes to the calling thread, which enters the stop before the
// call returns. (The kernel drops it in an orphaned process group, where
// nobody could continue us; then it returns at once.)
func stopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = unix.Tgkill(unix.Getpid(), unix.Gettid(), syscall.SIGTSTP)
}
