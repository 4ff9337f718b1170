// Package config turns a project's vigil.toml or Procfile into a validated
// Config: every default applied, every path absolute, services in file order.
//
// Invariants of a Config returned by Load:
//   - it has at least one service; names are unique and match
//     [A-Za-z0-9][A-Za-z0-9_.-]{0,63};
//   - every depends_on names another existing service, and the dependency
//     graph has no cycle;
//   - every duration is non-negative, Backoff.Max >= Backoff.Initial,
//     Backoff.Multiplier >= 1, 0 <= Backoff.Jitter <= 1, and
//     CrashLoop.Window > 0 whenever CrashLoop.Crashes > 0;
//   - Config.Path, Config.Dir, Config.StateDir and every Service.Dir are absolute;
//   - Ready.Kind is one of the ReadyKind constants and names its target
//     (URL for http, a HOST:PORT Address for tcp, a Command whose program
//     name is not empty for exec); Ready.Period, Ready.Timeout and
//     StartTimeout are more than 0; Watchdog is 0 (off) or at least 10ms;
//     NotifyAccess is "main" or "group";
//   - Liveness is nil or names exactly one http, tcp or exec target as
//     Ready does, with Period and Timeout more than 0 and
//     FailureThreshold at least 1.
//
// Decoding is strict: an unknown key, a value of the wrong type or an invalid
// value is an error, never ignored. Load collects every problem it can find
// and returns them as Errors, each pointing at FILE:LINE:COL (columns count
// bytes, as Go's compiler does), so `vigil check` can show them all at once.
// TOML syntax errors stop decoding, so only the first one is reported.
//
// The package only reads the one file. It deliberately does not look up
// users or groups, check that a cwd or a program exists, or start anything:
// those facts belong to the moment a service starts, on the machine where it
// starts, and failing there is reported as spawn_failed.
package config
