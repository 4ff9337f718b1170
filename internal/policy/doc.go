// Package policy decides what happens after a service's instance ends: how
// the end is classified (DESIGN §3), whether and when the service is started
// again, and when a crash loop must stop for a person to look (DESIGN §4).
//
// It is pure: it imports only the standard library, never reads the clock
// (every function that needs time takes `now` or an uptime), does no I/O,
// starts no goroutines and holds no locks. Randomness for jitter comes in as
// a number u in [0,1) from the caller. The supervisor's event loop owns one
// Tracker per service and carries out the Decision that OnExit returns; this
// package never spawns, signals or schedules anything itself.
//
// # Exit classes
//
// Classify turns a wait status into a Class following systemd's rules: exit 0
// or a code in success_exit, and death by SIGTERM, SIGINT, SIGHUP or SIGPIPE
// that vigil did not send, are clean; anything that ends while vigil is
// stopping the instance is stopped; another exit code is exit_code; another
// signal is signal. The caller classifies what a wait status cannot show
// (heartbeat_timeout, unresponsive, start_timeout, spawn_failed, lost).
// Everything except clean and stopped is a crash.
//
// # Restarts and backoff
//
// restart = "never" never restarts, "on-failure" restarts after a crash,
// "always" after every end vigil did not ask for; a stopped instance is
// never restarted by policy (planned restarts are the supervisor's own
// business and are never counted as crashes). Every automatic restart,
// including an "always" restart after a clean exit, waits for the backoff
// delay, so a program that ends at once - or cannot be spawned at all - never
// becomes a hot loop. The delay before the n-th consecutive restart (n from 0)
// is Initial × Multiplier^n, capped at Max, then shortened by up to Jitter of
// itself. The count resets when an instance has stayed up for ResetAfter.
//
// # Crash-loop breaker
//
// Crashes are remembered with their times; when CrashLoop.Crashes of them fall
// within CrashLoop.Window the breaker opens and the service needs
// manual action (`vigil reset NAME`). With a Cooldown the breaker half-opens
// after that long for one trial start: a crash of the trial opens it again at
// once; a trial that stays up for ResetAfter, or ends without crashing,
// closes it. Clean and stopped ends never count toward the breaker, and with
// restart = "never" nothing is restarted, so nothing trips it either.
//
// # Defaults (set by package config, documented here because they are policy)
//
//   - Backoff 100ms × 2 up to 30s: a rare crash is restarted almost at once,
//     while a service that keeps failing slows to one attempt every 30s
//     (after about ten restarts) instead of burning CPU and flooding logs.
//   - Jitter 0.2: services that crashed together (say, after a database blip)
//     do not all restart in the same instant. Jitter only shortens a delay,
//     never lengthens it, so Max is a true upper bound and every delay stays
//     within 20% below its schedule.
//   - ResetAfter 60s: after a minute of uptime an instance counts as healthy,
//     so its next crash starts again from 100ms rather than from where the
//     last storm left off.
//   - Breaker 5 crashes in 60s, no cooldown: a service that dies at once trips
//     within about two seconds (the first four delays add up to 1.5s), one
//     that crashes now and then keeps being restarted, and a service crashing
//     five times a minute will not fix itself, so it waits for a person with
//     a clear manual_action_required instead of retrying forever and hiding
//     the problem. Unattended machines can set a cooldown.
package policy
