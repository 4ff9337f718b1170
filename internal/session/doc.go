// Package session is the process side of a session: it runs one command
// (CMD) on behalf of an owner — the process that started us: an agent, an
// editor, a shell script — so that CMD never outlives that owner. It is what
// `vigil run` does, and it works with no daemon running.
//
// The contract of Run:
//
//   - CMD runs in a process group of its own (its pid is the group id), with
//     the guard's stdin, stdout and stderr and environment, plus
//     VIGIL_SESSION_NAME.
//   - When the owner dies, CMD's whole group is stopped: SIGTERM (and
//     SIGCONT, so a stopped member can act on it), then SIGKILL once
//     Config.Grace has passed. Cancelling Run's context does the same.
//   - When CMD exits, whatever it left running in its group is stopped the
//     same way, as stopping a service stops its strays: a session is CMD and
//     everything it started, and ends as a whole. Run returns only once the
//     group has no live process (or, should one survive SIGKILL, shortly
//     after).
//   - SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to the guard
//     are forwarded to CMD's group for as long as Run runs; none of them ends
//     the guard itself.
//   - Run reports CMD's exit code, or 128 + the number of the signal that
//     killed it, as shells do.
//   - Interactive use: when stdin is a terminal whose foreground process
//     group is the guard's, CMD's group gets the terminal (so it can read it,
//     and Ctrl-C reaches it directly); when CMD is stopped (Ctrl-Z) the guard
//     takes the terminal back and stops itself, so the owner's shell sees the
//     job stop, and on SIGCONT hands the terminal back and continues CMD. The
//     terminal is given back to the guard's group when CMD ends.
//
// How the owner's death is seen. The owner is the guard's parent as it was
// when this package was initialized (OwnerPID), which for `vigil run` is the
// start of the process. Run opens a pidfd on it and waits for the pidfd to
// become readable in the Go runtime's poller: a pidfd of a process becomes
// readable when the whole process has exited, unlike the parent-death
// signal, which fires when the forking thread exits (Go's Pdeathsig, and
// prctl(PR_SET_PDEATHSIG) in general, are thread-bound, and a multithreaded
// owner may well end the thread that started us). Two races are closed:
//
//   - The owner died before the pidfd was opened: its pid may then be
//     unused (pidfd_open fails: ESRCH) or even reused by an unrelated
//     process. So after opening the pidfd, Run checks that getppid() still
//     returns the owner: were the owner dead, we would have been reparented
//     (to pid 1 or a subreaper). The order matters: a parent cannot be
//     reaped, and its pid reused, before its children are reparented, so a
//     getppid() equal to the owner after the open proves the pidfd names
//     the owner. If the owner is already gone, CMD is not started at all
//     (ErrOwnerGone).
//   - The owner died after the check: the pidfd fires and the group is
//     stopped, whether or not CMD has started by then.
//
// What remains uncovered: an owner that died before this package was even
// initialized cannot be told from a real parent (we were reparented before
// we could look). And if the guard itself is SIGKILLed, it can stop nothing.
// For that case CMD gets a parent-death SIGKILL, set up from a thread locked
// for exactly as long as CMD runs, so it fires only when the guard itself
// dies; that ends CMD but not what CMD started. Those leftovers are found by
// the registry's garbage collection when a daemon runs (a registered
// session whose guard is gone is stale, and its process group is killed);
// with no daemon, nothing can. A process that leaves CMD's process group
// (setsid, a daemonizing double fork with setpgid) is not followed either.
//
// A daemon can know about the session: Config.Registrar, when set, is told
// when CMD has started (Register), every Config.Heartbeat while it runs
// (Heartbeat) and how it ended (End). The guard never depends on it: a
// registrar that fails or hangs is logged and otherwise ignored, and with no
// registrar the guard works alone. This package does not implement one.
//
// Run needs Linux 5.10 or later (pidfd_open with PIDFD_NONBLOCK). It does
// not make the guard a child subreaper, since it must be usable inside a
// process that waits for children of its own; it waits only for CMD.
package session
