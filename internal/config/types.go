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
