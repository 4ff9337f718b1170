package config

import (
	"syscall"
	"time"
)

// Config is a loaded, validated project configuration with every default applied.
type Config struct {
	// Path is the file it was loaded from (vigil.toml or Procfile), absolute.
	Path string
	// Dir is the directory of Path; relative cwd values resolve against it.
	Dir string
	// StateDir is where the lock, sockets and logs live. Default: <Dir>/.vigil.
	StateDir string
	// Logs holds the rotation limits for every service's log file.
	Logs LogLimits
	// Journal and Checkpoint configure vigil's durable memory.
	Journal    Journal
	Checkpoint Checkpoint
	// SafeMode: when the daemon's own crashes make it run essential
	// services only.
	SafeMode SafeMode
	// Sessions: the external sessions' heartbeats and cleanup.
	Sessions Sessions
	// Services in the order they appear in the file.
	Services []Service
}

// LogLimits bounds the disk a service's output can use: at most
// (MaxFiles+1) × MaxSize bytes per service.
type LogLimits struct {
	MaxSize  int64 // bytes; default 10 MiB
	MaxFiles int   // rotated files kept; default 3
}

// Restart is when a service is started again after its instance ended.
type Restart string

const (
	RestartAlways    Restart = "always"
	RestartOnFailure Restart = "on-failure"
	RestartNever     Restart = "never"
)

// Service is one program definition.
type Service struct {
	Name string
	// Command is argv: Command[0] is looked up in PATH when it has no slash.
	// With Shell it is ["/bin/sh", "-c", <the string>].
	Command []string
	Shell   bool
	// Dir is the working directory, absolute. Default: the config's Dir.
	Dir string
	// Env are KEY=VALUE overrides applied on top of the daemon's environment,
	// in file order.
	Env []string
	// User and Group name or number; empty means the daemon's own.
	User, Group string

	Restart     Restart
	SuccessExit []int          // exit codes counted as clean; default [0]
	StopSignal  syscall.Signal // default SIGTERM
	StopTimeout time.Duration  // default 10s
	DependsOn   []string
	Essential   bool
	Autostart   bool // default true

	Backoff   Backoff
	CrashLoop CrashLoop

	// Ready says when an instance counts as ready: dependents wait for it.
	Ready Readiness
	// StartTimeout bounds the time from spawn to ready; a miss is the
	// start_timeout exit class. Default 90s (systemd's TimeoutStartSec).
	StartTimeout time.Duration
	// Watchdog is the heartbeat interval expected over sd_notify
	// (WATCHDOG=1); 0 turns it off. Two missed intervals are a crash.
	Watchdog time.Duration
	// NotifyAccess says whose sd_notify datagrams count for this service.
	NotifyAccess NotifyAccess // default "group"
	// Liveness is an optional periodic health probe; nil means none.
	Liveness *Probe

	// OnCrash runs after every crash, OnFailed when the crash-loop breaker
	// opens; argv as Command (a string runs with /bin/sh -c), nil for none.
	// Each gets the crash record as JSON on stdin.
	OnCrash, OnFailed []string
	// HookTimeout bounds a hook's run; default 30s.
	HookTimeout time.Duration
}

// NotifyAccess is systemd's NotifyAccess=: which senders may speak for a service.
type NotifyAccess string

const (
	NotifyMain  NotifyAccess = "main"  // only the main process
	NotifyGroup NotifyAccess = "group" // any process in the instance's process tree
)

// ReadyKind is how readiness is decided.
type ReadyKind string

const (
	ReadyStarted ReadyKind = "started" // as soon as the process is spawned (default)
	ReadyNotify  ReadyKind = "notify"  // when it sends READY=1
	ReadyHTTP    ReadyKind = "http"    // when a GET of URL answers 2xx/3xx
	ReadyTCP     ReadyKind = "tcp"     // when Address accepts a connection
	ReadyExec    ReadyKind = "exec"    // when Command exits 0
)

// Readiness is the `ready` option. For http, tcp and exec the check is
// repeated every Period (default 100ms), each try bounded by Timeout
// (default 1s), until it passes or StartTimeout runs out.
type Readiness struct {
	Kind    ReadyKind
	URL     string   // http
	Address string   // tcp: host:port
	Command []string // exec: argv, run directly, never through a shell
	Period  time.Duration
	Timeout time.Duration
}

// Probe is a liveness probe, as Kubernetes defines one: after
// InitialDelay, every Period a check bounded by Timeout runs;
// FailureThreshold consecutive failures make the instance unresponsive.
type Probe struct {
	Kind             ReadyKind // http, tcp or exec
	URL              string
	Address          string
	Command          []string
	Period           time.Duration // default 10s
	Timeout          time.Duration // default 1s
	FailureThreshold int           // default 3
	InitialDelay     time.Duration // default 0
}

// Backoff is the delay before an automatic restart.
type Backoff struct {
	Initial    time.Duration // default 100ms; 0 allowed
	Max        time.Duration // default 30s
	Multiplier float64       // default 2
	Jitter     float64       // fraction of the delay, 0..1; default 0.2
	ResetAfter time.Duration // default 60s of uptime resets the backoff
}

// CrashLoop is the circuit breaker: Crashes crashes within Window trip it.
type CrashLoop struct {
	Crashes  int           // default 5; 0 disables the breaker
	Window   time.Duration // default 60s
	Cooldown time.Duration // default 0: stays failed until `vigil reset`
}
