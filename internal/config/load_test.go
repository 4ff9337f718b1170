package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// write puts content in a new temporary directory as name and returns its path.
func write(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// problemsOf returns err's problems as "LINE:COL: message", checking that
// each names path.
func problemsOf(t *testing.T, err error, path string) []string {
	t.Helper()
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("error %v (%T) is not config.Errors", err, err)
	}
	var got []string
	for _, e := range errs {
		if e.File != path {
			t.Errorf("error names file %q, want %q", e.File, path)
		}
		got = append(got, fmt.Sprintf("%d:%d: %s", e.Line, e.Col, e.Msg))
	}
	return got
}

const web = "[services.web]\ncommand = \"serve\"\n"

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, toml string
		want       []string
	}{
		{"unknown service key", "[services.web]\ncomand = [\"serve\"]\n",
			[]string{`2:1: unknown key "comand" in [services.web]; did you mean "command"?`}},
		{"unknown key without a close match", web + "frobnicate = true\n",
			[]string{`3:1: unknown key "frobnicate" in [services.web]`}},
		{"unknown top-level key", "log = {}\n" + web,
			[]string{`1:1: unknown key "log" at the top level; did you mean "logs"?`}},
		{"unknown key in a sub-table header", web + "[services.web.bakoff]\ninitial = \"1s\"\n",
			[]string{`3:15: unknown key "bakoff" in [services.web]; did you mean "backoff"?`}},
		{"unknown key in an inline table", web + "backoff = { inital = \"1s\" }\n",
			[]string{`3:13: unknown key "inital" in [services.web.backoff]; did you mean "initial"?`}},
		{"unknown key in logs", "[logs]\nmax_sizes = 1\n" + web,
			[]string{`2:1: unknown key "max_sizes" in [logs]; did you mean "max_size"?`}},
		{"integer duration", web + "stop_timeout = 5\n",
			[]string{`3:16: services.web.stop_timeout: expected a duration string such as "10s", got integer 5`}},
		{"integer restart", web + "restart = 3\n",
			[]string{`3:11: services.web.restart: expected a string ("always", "on-failure" or "never"), got integer 3`}},
		{"string for a boolean", web + "autostart = \"yes\"\n",
			[]string{`3:13: services.web.autostart: expected true or false, got string "yes"`}},
		{"table for a service", "[services]\nweb = \"serve\"\n",
			[]string{`2:7: services.web: expected a table, got string "serve"`}},
		{"array of tables for a service", "[[services.web]]\ncommand = \"serve\"\n",
			[]string{`1:12: services.web: expected a table, got an array`}},
		{"unknown readiness", web + "ready = \"notfy\"\n",
			[]string{`3:9: services.web.ready: unknown readiness "notfy": use "started", "notify", "http://HOST:PORT/PATH", "tcp://HOST:PORT" or ["exec", …]; did you mean "notify"?`}},
		{"readiness URL without a host", web + "ready = \"http:///health\"\n",
			[]string{`3:9: services.web.ready: URL "http:///health" has no host`}},
		{"readiness address without a port", web + "ready = \"tcp://localhost\"\n",
			[]string{`3:9: services.web.ready: address "localhost" must be HOST:PORT`}},
		{"readiness array not exec", web + "ready = [\"run\", \"x\"]\n",
			[]string{`3:9: services.web.ready: an array must be ["exec", "program", "arg"…]`}},
		{"readiness of the wrong type", web + "ready = 1\n",
			[]string{`3:9: services.web.ready: expected "started", "notify", "http://…", "tcp://…" or ["exec", …], got integer 1`}},
		{"watchdog too short", web + "watchdog = \"1ms\"\n",
			[]string{`3:12: services.web.watchdog: must be 0 (off) or at least 10ms, got "1ms"`}},
		{"zero start timeout", web + "start_timeout = \"0s\"\n",
			[]string{`3:17: services.web.start_timeout: must be more than 0`}},
		{"bad notify_access", web + "notify_access = \"all\"\n",
			[]string{`3:17: services.web.notify_access: must be "main" or "group", got "all"`}},
		{"liveness with two kinds", web + "[services.web.liveness]\nhttp = \"http://a:1/\"\ntcp = \"a:1\"\n",
			[]string{`3:15: services.web.liveness: give exactly one of http, tcp or exec (got 2)`}},
		{"liveness with none", web + "liveness = { period = \"1s\" }\n",
			[]string{`3:1: services.web.liveness: give exactly one of http, tcp or exec (got 0)`}},
		{"liveness threshold zero", web + "liveness = { tcp = \"a:1\", failure_threshold = 0 }\n",
			[]string{`3:47: services.web.liveness.failure_threshold: must be at least 1`}},
		{"liveness unknown key", web + "liveness = { tcp = \"a:1\", perid = \"1s\" }\n",
			[]string{`3:27: unknown key "perid" in [services.web.liveness]; did you mean "period"?`}},
		{"readiness with another scheme", web + "ready = \"ftp://x/\"\n",
			[]string{`3:9: services.web.ready: unknown readiness "ftp://x/": use "started", "notify", "http://HOST:PORT/PATH", "tcp://HOST:PORT" or ["exec", …]`}},
		{"readiness far from any word", web + "ready = \"whenever\"\n",
			[]string{`3:9: services.web.ready: unknown readiness "whenever": use "started", "notify", "http://HOST:PORT/PATH", "tcp://HOST:PORT" or ["exec", …]`}},
		{"readiness misspelt started", web + "ready = \"startd\"\n",
			[]string{`3:9: services.web.ready: unknown readiness "startd": use "started", "notify", "http://HOST:PORT/PATH", "tcp://HOST:PORT" or ["exec", …]; did you mean "started"?`}},
		{"readiness URL with a bad port", web + "ready = \"http://db:x/\"\n",
			[]string{`3:9: services.web.ready: invalid URL "http://db:x/": invalid port ":x" after host`}},
		{"readiness URL with port 0", web + "ready = \"https://db:0/\"\n",
			[]string{`3:9: services.web.ready: URL "https://db:0/" has port 0, outside 1..65535`}},
		{"readiness URL with a space in the host", web + "ready = \"http://d b/\"\n",
			[]string{`3:9: services.web.ready: invalid URL "http://d b/": invalid character " " in host name`}},
		{"readiness address without a host", web + "ready = \"tcp://:5432\"\n",
			[]string{`3:9: services.web.ready: address ":5432" has no host`}},
		{"readiness address with a named port", web + "ready = \"tcp://db:postgres\"\n",
			[]string{`3:9: services.web.ready: address "db:postgres" has port "postgres"; want a number 1..65535`}},
		{"readiness address with a path", web + "ready = \"tcp://db:5432/x\"\n",
			[]string{`3:9: services.web.ready: address "db:5432/x" has port "5432/x"; want a number 1..65535`}},
		{"readiness empty array", web + "ready = []\n",
			[]string{`3:9: services.web.ready: an array must be ["exec", "program", "arg"…]`}},
		{"readiness exec without a program", web + "ready = [\"exec\"]\n",
			[]string{`3:9: services.web.ready: an array must be ["exec", "program", "arg"…]`}},
		{"readiness exec with an empty program", web + "ready = [\"exec\", \"\", \"-q\"]\n",
			[]string{`3:18: services.web.ready[1]: the program name must not be empty`}},
		{"readiness exec with a number", web + "ready = [\"exec\", 5]\n",
			[]string{`3:18: services.web.ready[1]: expected a string, got integer 5`}},
		{"readiness exec is case-sensitive", web + "ready = [\"EXEC\", \"x\"]\n",
			[]string{`3:9: services.web.ready: an array must be ["exec", "program", "arg"…]`}},
		{"ready_check zero period", web + "ready_check = { period = \"0s\" }\n",
			[]string{`3:26: services.web.ready_check.period: must be more than 0`}},
		{"ready_check zero timeout", web + "[services.web.ready_check]\ntimeout = \"0ms\"\n",
			[]string{`4:11: services.web.ready_check.timeout: must be more than 0`}},
		{"ready_check negative timeout", web + "ready_check.timeout = \"-1s\"\n",
			[]string{`3:23: services.web.ready_check.timeout: duration must not be negative, got "-1s"`}},
		{"ready_check unknown key", web + "ready_check = { interval = \"1s\" }\n",
			[]string{`3:17: unknown key "interval" in [services.web.ready_check]`}},
		{"ready_check not a table", web + "ready_check = \"1s\"\n",
			[]string{`3:15: services.web.ready_check: expected a table, got string "1s"`}},
		{"negative start timeout", web + "start_timeout = \"-5s\"\n",
			[]string{`3:17: services.web.start_timeout: duration must not be negative, got "-5s"`}},
		{"watchdog just under the minimum", web + "watchdog = \"9.999ms\"\n",
			[]string{`3:12: services.web.watchdog: must be 0 (off) or at least 10ms, got "9.999ms"`}},
		{"watchdog as a number", web + "watchdog = 2\n",
			[]string{`3:12: services.web.watchdog: expected a duration string such as "10s", got integer 2`}},
		{"misspelt notify_access", web + "notify_access = \"grup\"\n",
			[]string{`3:17: services.web.notify_access: must be "main" or "group", got "grup"; did you mean "group"?`}},
		{"notify_access of the wrong type", web + "notify_access = true\n",
			[]string{`3:17: services.web.notify_access: expected "main" or "group", got boolean true`}},
		{"liveness with three kinds", web + "liveness = { http = \"http://a/\", tcp = \"a:1\", exec = [\"x\"] }\n",
			[]string{`3:1: services.web.liveness: give exactly one of http, tcp or exec (got 3)`}},
		{"liveness not a table", web + "liveness = \"http://a/\"\n",
			[]string{`3:12: services.web.liveness: expected a table, got string "http://a/"`}},
		{"liveness URL with another scheme", web + "liveness = { http = \"ftp://a/\" }\n",
			[]string{`3:21: services.web.liveness.http: URL "ftp://a/" must start with http:// or https://`}},
		{"liveness URL without a host", web + "liveness = { http = \"http://:8080/healthz\" }\n",
			[]string{`3:21: services.web.liveness.http: URL "http://:8080/healthz" has no host`}},
		{"liveness URL with a bad port", web + "liveness = { http = \"http://a:99999/\" }\n",
			[]string{`3:21: services.web.liveness.http: URL "http://a:99999/" has port 99999, outside 1..65535`}},
		{"liveness empty URL", web + "liveness = { http = \"\" }\n",
			[]string{`3:21: services.web.liveness.http: must not be empty`}},
		{"liveness address without a port", web + "liveness = { tcp = \"127.0.0.1\" }\n",
			[]string{`3:20: services.web.liveness.tcp: address "127.0.0.1" must be HOST:PORT`}},
		{"liveness address with tcp://", web + "liveness = { tcp = \"tcp://db:5432\" }\n",
			[]string{`3:20: services.web.liveness.tcp: write the address without "tcp://": "db:5432"`}},
		{"liveness empty exec", web + "liveness = { exec = [] }\n",
			[]string{`3:21: services.web.liveness.exec: must name a program`}},
		{"liveness exec with an empty program", web + "liveness = { exec = [\"\"] }\n",
			[]string{`3:22: services.web.liveness.exec[0]: the program name must not be empty`}},
		{"liveness exec as a string", web + "liveness = { exec = \"pg_isready\" }\n",
			[]string{`3:21: services.web.liveness.exec: expected an array of strings, got string "pg_isready"`}},
		{"liveness zero period", web + "[services.web.liveness]\ntcp = \"a:1\"\nperiod = \"0s\"\n",
			[]string{`5:10: services.web.liveness.period: must be more than 0`}},
		{"liveness zero timeout", web + "[services.web.liveness]\ntcp = \"a:1\"\ntimeout = \"0s\"\n",
			[]string{`5:11: services.web.liveness.timeout: must be more than 0`}},
		{"liveness negative threshold", web + "liveness = { tcp = \"a:1\", failure_threshold = -1 }\n",
			[]string{`3:47: services.web.liveness.failure_threshold: must not be negative, got -1`}},
		{"liveness negative initial delay", web + "liveness = { tcp = \"a:1\", initial_delay = \"-1s\" }\n",
			[]string{`3:43: services.web.liveness.initial_delay: duration must not be negative, got "-1s"`}},
		{"every readiness problem at once", web + "ready = \"notfy\"\nstart_timeout = \"0s\"\nwatchdog = \"1ms\"\n[services.web.liveness]\nperiod = \"0s\"\n",
			[]string{
				`3:9: services.web.ready: unknown readiness "notfy": use "started", "notify", "http://HOST:PORT/PATH", "tcp://HOST:PORT" or ["exec", …]; did you mean "notify"?`,
				`4:17: services.web.start_timeout: must be more than 0`,
				`5:12: services.web.watchdog: must be 0 (off) or at least 10ms, got "1ms"`,
				`6:15: services.web.liveness: give exactly one of http, tcp or exec (got 0)`,
				`7:10: services.web.liveness.period: must be more than 0`,
			}},
		{"bad duration", web + "stop_timeout = \"5 seconds\"\n",
			[]string{`3:16: services.web.stop_timeout: invalid duration "5 seconds"; write a number with a unit, such as "500ms", "10s" or "1m30s"`}},
		{"negative duration", web + "[services.web.backoff]\ninitial = \"-1s\"\n",
			[]string{`4:11: services.web.backoff.initial: duration must not be negative, got "-1s"`}},
		{"bad size unit", "[logs]\nmax_size = \"10 megs\"\n" + web,
			[]string{`2:12: logs.max_size: invalid size "10 megs": unknown unit "megs"; want B, KB, MB, GB, TB, KiB, MiB, GiB or TiB`}},
		{"size without a number", "logs.max_size = \"MiB\"\n" + web,
			[]string{`1:17: logs.max_size: invalid size "MiB": want a whole number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), such as "10MiB"`}},
		{"size too large", "logs.max_size = \"99999999999TiB\"\n" + web,
			[]string{`1:17: logs.max_size: invalid size "99999999999TiB": too large`}},
		{"journal limits", "journal.crash_output_bytes = \"1MiB\"\njournal.segment_size = 100\njournal.max_age = \"0s\"\njornal.x = 1\n" + web,
			[]string{`1:30: journal.crash_output_bytes: at most 64KiB`, `2:24: journal.segment_size: must be at least 64KiB`,
				`3:19: journal.max_age: must be more than 0`, `4:1: unknown key "jornal" at the top level; did you mean "journal"?`}},
		{"hook errors", "[services.web]\ncommand = \"serve\"\non_crash = []\non_failed = 3\nhook_timeout = \"0s\"\n",
			[]string{`3:12: services.web.on_crash: must not be empty`,
				`4:13: services.web.on_failed: expected a string (run by /bin/sh -c) or an array of strings (run directly), got integer 3`,
				`5:16: services.web.hook_timeout: must be more than 0`}},
		{"session keys", "sessions = { stale_action = \"kil\", heartbeat = \"0s\" }\n" + web,
			[]string{`1:29: sessions.stale_action: invalid value "kil"; want "report" or "kill"; did you mean "kill"?`,
				`1:48: sessions.heartbeat: must be more than 0`}},
		{"safe mode keys", "safe_mode = { crashes = -1, window = \"0s\", crashs = 2 }\n" + web,
			[]string{`1:25: safe_mode.crashes: must not be negative, got -1`, `1:38: safe_mode.window: must be more than 0`,
				`1:44: unknown key "crashs" in [safe_mode]; did you mean "crashes"?`}},
		{"checkpoint keys", "[checkpoint]\ninterval = 5\nactivty = 3\n" + web,
			[]string{`2:12: checkpoint.interval: expected a duration string such as "10s", got integer 5`, `3:1: unknown key "activty" in [checkpoint]; did you mean "activity"?`}},
		{"zero size", "logs.max_size = 0\n" + web,
			[]string{`1:17: logs.max_size: must be more than 0 bytes, got 0`}},
		{"negative max_files", "logs.max_files = -1\n" + web,
			[]string{`1:18: logs.max_files: must not be negative, got -1`}},
		{"unknown signal", web + "stop_signal = \"SIGFOO\"\n",
			[]string{`3:15: services.web.stop_signal: unknown signal "SIGFOO"`}},
		{"misspelt signal", web + "stop_signal = \"SIGTREM\"\n",
			[]string{`3:15: services.web.stop_signal: unknown signal "SIGTREM"; did you mean "SIGTERM"?`}},
		{"signal number out of range", web + "stop_signal = 65\n",
			[]string{`3:15: services.web.stop_signal: signal number 65 is outside 1..64`}},
		{"bad restart", web + "restart = \"on_failure\"\n",
			[]string{`3:11: services.web.restart: invalid value "on_failure"; want "always", "on-failure" or "never"; did you mean "on-failure"?`}},
		{"restart far from any value", web + "restart = \"sometimes\"\n",
			[]string{`3:11: services.web.restart: invalid value "sometimes"; want "always", "on-failure" or "never"`}},
		{"missing dependency", web + "depends_on = [\"dbb\"]\n[services.db]\ncommand = \"db\"\n",
			[]string{`3:15: services.web.depends_on: unknown service "dbb"; did you mean "db"?`}},
		{"missing dependency without a close match", web + "depends_on = [\"queue\"]\n",
			[]string{`3:15: services.web.depends_on: unknown service "queue"`}},
		{"self dependency", web + "depends_on = [ \"web\" ]\n",
			[]string{`3:16: services.web.depends_on: service "web" depends on itself`}},
		{"dependency listed twice", web + "depends_on = [\"db\", \"db\"]\n[services.db]\ncommand = \"db\"\n",
			[]string{`3:21: services.web.depends_on: "db" is listed twice`}},
		{"two-service cycle", "[services.a]\ncommand = \"a\"\ndepends_on = [\"b\"]\n[services.b]\ncommand = \"b\"\ndepends_on = [\"a\"]\n",
			[]string{`3:15: depends_on cycle: a -> b -> a`}},
		{"three-service cycle behind a tail", "[services.x]\ncommand = \"x\"\ndepends_on = [\"a\"]\n" +
			"[services.a]\ncommand = \"a\"\ndepends_on = [\"b\"]\n" +
			"[services.b]\ncommand = \"b\"\ndepends_on = [\"c\"]\n" +
			"[services.c]\ncommand = \"c\"\ndepends_on = [\"a\"]\n",
			[]string{`6:15: depends_on cycle: a -> b -> c -> a`}},
		{"missing command", "[services.web]\nrestart = \"always\"\n",
			[]string{`1:11: services.web: missing required key "command"`}},
		{"empty string command", "[services.web]\ncommand = \" \"\n",
			[]string{`2:11: services.web.command: must not be empty`}},
		{"empty array command", "[services.web]\ncommand = []\n",
			[]string{`2:11: services.web.command: must not be empty`}},
		{"empty program", "[services.web]\ncommand = [\"\", \"-x\"]\n",
			[]string{`2:12: services.web.command[0]: the program name must not be empty`}},
		{"non-string argument", "[services.web]\ncommand = [\"serve\", 80]\n",
			[]string{`2:21: services.web.command[1]: expected a string, got integer 80`}},
		{"command of the wrong type", "[services.web]\ncommand = true\n",
			[]string{`2:11: services.web.command: expected a string (run by /bin/sh -c) or an array of strings (run directly), got boolean true`}},
		{"invalid service name", "[services.\"a b\"]\ncommand = \"x\"\n",
			[]string{`1:11: invalid service name "a b": ` + nameRule}},
		{"service name starting with a dash", "[services.-web]\ncommand = \"x\"\n",
			[]string{`1:11: invalid service name "-web": ` + nameRule}},
		{"service name too long", "[services." + strings.Repeat("a", 65) + "]\ncommand = \"x\"\n",
			[]string{`1:11: invalid service name "` + strings.Repeat("a", 65) + `": ` + nameRule}},
		{"no services", "state_dir = \"s\"\n",
			[]string{`1:1: no services defined; add a [services.NAME] table`}},
		{"empty services table", "[services]\n",
			[]string{`1:2: no services defined; add a [services.NAME] table`}},
		{"max below initial", web + "backoff = { initial = \"2s\", max = \"1s\" }\n",
			[]string{`3:35: services.web.backoff.max: 1s is less than initial (2s)`}},
		{"initial above the default max", web + "backoff.initial = \"1m\"\n",
			[]string{`3:19: services.web.backoff.initial: 1m0s is more than max (30s, the default); set max too`}},
		{"jitter above 1", web + "backoff.jitter = 1.5\n",
			[]string{`3:18: services.web.backoff.jitter: must be between 0 and 1, got 1.5`}},
		{"jitter nan", web + "backoff.jitter = nan\n",
			[]string{`3:18: services.web.backoff.jitter: must be between 0 and 1, got nan`}},
		{"multiplier below 1", web + "backoff.multiplier = 0.5\n",
			[]string{`3:22: services.web.backoff.multiplier: must be a number of at least 1 (1 keeps the delay constant), got 0.5`}},
		{"multiplier inf", web + "backoff.multiplier = inf\n",
			[]string{`3:22: services.web.backoff.multiplier: must be a number of at least 1 (1 keeps the delay constant), got inf`}},
		{"negative crashes", web + "crash_loop.crashes = -1\n",
			[]string{`3:22: services.web.crash_loop.crashes: must not be negative, got -1`}},
		{"zero window", web + "crash_loop.window = \"0s\"\n",
			[]string{`3:21: services.web.crash_loop: window must be more than 0 when crashes > 0 (crashes = 0 disables the breaker)`}},
		{"exit code out of range", web + "success_exit = [0, 256]\n",
			[]string{`3:20: services.web.success_exit[1]: exit code 256 is outside 0..255`}},
		{"env value not a string", web + "env = { PORT = 8080 }\n",
			[]string{`3:16: services.web.env.PORT: expected a string (quote it: "8080"), got integer 8080`}},
		{"env name with =", web + "env = { \"A=B\" = \"x\" }\n",
			[]string{`3:9: services.web.env: invalid variable name "A=B": it must be non-empty without '=' or NUL`}},
		{"NUL in an argument", "[services.web]\ncommand = [\"a\\u0000b\"]\n",
			[]string{`2:12: services.web.command[0]: must not contain a NUL byte`}},
		{"empty cwd", web + "cwd = \"\"\n",
			[]string{`3:7: services.web.cwd: must not be empty`}},
		{"negative user id", web + "user = -1\n",
			[]string{`3:8: services.web.user: must not be negative, got -1`}},
		{"depends_on not an array", web + "depends_on = \"db\"\n",
			[]string{`3:14: services.web.depends_on: expected an array of strings, got string "db"`}},
		{"depends_on with a number", web + "depends_on = [1]\n",
			[]string{`3:15: services.web.depends_on[0]: expected a string, got integer 1`}},
		{"success_exit not an array", web + "success_exit = 0\n",
			[]string{`3:16: services.web.success_exit: expected an array of exit codes, got integer 0`}},
		{"success_exit with a string", web + "success_exit = [\"0\"]\n",
			[]string{`3:17: services.web.success_exit[0]: expected an integer, got string "0"`}},
		{"jitter as a string", web + "backoff.jitter = \"0.2\"\n",
			[]string{`3:18: services.web.backoff.jitter: expected a number, got string "0.2"`}},
		{"user as a boolean", web + "user = false\n",
			[]string{`3:8: services.web.user: expected a name or a number, got boolean false`}},
		{"max_files too large", "logs.max_files = 9999999999\n" + web,
			[]string{`1:18: logs.max_files: 9999999999 is too large`}},
		{"max_size as a float", "logs.max_size = 1.5\n" + web,
			[]string{`1:17: logs.max_size: expected a size such as "10MiB" or a number of bytes, got float 1.5`}},
		{"datetime", web + "stop_timeout = 1979-05-27\n",
			[]string{`3:16: services.web.stop_timeout: expected a duration string such as "10s", got datetime 1979-05-27`}},
		{"long string is cut", web + "autostart = \"" + strings.Repeat("y", 50) + "\"\n",
			[]string{`3:13: services.web.autostart: expected true or false, got string "` + strings.Repeat("y", 40) + `…"`}},
		{"env not a table", web + "env = [\"A=1\"]\n",
			[]string{`3:7: services.web.env: expected a table such as { KEY = "value" }, got an array`}},
		{"logs not a table", "logs = 10\n" + web,
			[]string{`1:8: logs: expected a table, got integer 10`}},
		{"services not a table", "services = [\"web\"]\n",
			[]string{`1:12: services: expected a table of services, got an array`}},
		{"NUL in state_dir", "state_dir = \"a\\u0000\"\n" + web,
			[]string{`1:13: state_dir: must not contain a NUL byte`}},
		{"syntax error", "[services.web\ncommand = \"x\"\n",
			[]string{`1:14: expected ']' to close table name`}},
		{"unterminated string", web + "cwd = \"x\n",
			[]string{`3:9: basic strings cannot have new lines`}},
		{"key defined twice", web + "command = \"again\"\n",
			[]string{`3:1: key command is already defined`}},
		{"every problem, in file order", "[services.b]\ncommand = \"b\"\nstop_timeout = 5\ndepends_on = [\"zzz\"]\n" +
			"[services.a]\ncomand = \"a\"\nrestart = \"sometimes\"\n[logs]\nmax_files = -2\n",
			[]string{
				`3:16: services.b.stop_timeout: expected a duration string such as "10s", got integer 5`,
				`4:15: services.b.depends_on: unknown service "zzz"`,
				`6:1: unknown key "comand" in [services.a]; did you mean "command"?`,
				`7:11: services.a.restart: invalid value "sometimes"; want "always", "on-failure" or "never"`,
				`9:13: logs.max_files: must not be negative, got -2`,
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := write(t, "vigil.toml", tt.toml)
			cfg, err := Load(path)
			if err == nil {
				t.Fatalf("Load succeeded (%+v), want errors %q", cfg, tt.want)
			}
			if cfg != nil {
				t.Errorf("Load returned a Config with an error")
			}
			got := problemsOf(t, err, path)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			if want := path + ":" + tt.want[0]; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Error() = %q, want it to start with %q", err.Error(), want)
			}
			if lines := strings.Count(err.Error(), "\n") + 1; lines != len(tt.want) {
				t.Errorf("Error() has %d lines, want one per problem (%d)", lines, len(tt.want))
			}
		})
	}
}

func TestErrorsUnwrapToEachError(t *testing.T) {
	t.Parallel()
	path := write(t, "vigil.toml", web+"restart = 3\n")
	_, err := Load(path)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("errors.As(%v, *Error) = false", err)
	}
	if e.Line != 3 || e.Col != 11 {
		t.Errorf("first error at %d:%d, want 3:11", e.Line, e.Col)
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	path := write(t, "vigil.toml", web)
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(path)
	want := &Config{
		Path:       path,
		Dir:        dir,
		StateDir:   filepath.Join(dir, ".vigil"),
		Logs:       LogLimits{MaxSize: 10 << 20, MaxFiles: 3},
		Journal:    Journal{SegmentSize: 8 << 20, MaxSize: 256 << 20, MaxAge: 720 * time.Hour, CrashOutputLines: 20, CrashOutputBytes: 8 << 10},
		Checkpoint: Checkpoint{Interval: time.Minute, Activity: 50, MaxAge: 24 * time.Hour, WarnSize: 50 << 20},
		SafeMode:   SafeMode{Crashes: 3, Window: time.Minute},
		Sessions: Sessions{Heartbeat: 5 * time.Second, StaleAfter: 30 * time.Second, StaleAction: "report",
			CleanupPeriod: time.Minute, KillGrace: 5 * time.Second},
		Services: []Service{{
			Name:        "web",
			Command:     []string{"/bin/sh", "-c", "serve"},
			Shell:       true,
			Dir:         dir,
			Restart:     RestartOnFailure,
			SuccessExit: []int{0},
			StopSignal:  syscall.SIGTERM,
			StopTimeout: 10 * time.Second,
			Autostart:   true,
			Backoff:     Backoff{Initial: 100 * time.Millisecond, Max: 30 * time.Second, Multiplier: 2, Jitter: 0.2, ResetAfter: 60 * time.Second},
			CrashLoop:   CrashLoop{Crashes: 5, Window: 60 * time.Second},

			Ready:        Readiness{Kind: ReadyStarted, Period: 100 * time.Millisecond, Timeout: time.Second},
			StartTimeout: 90 * time.Second,
			NotifyAccess: NotifyGroup,
			HookTimeout:  30 * time.Second,
		}},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("Load =\n%+v\nwant\n%+v", cfg, want)
	}
}

func TestEveryOption(t *testing.T) {
	t.Parallel()
	path := write(t, "vigil.toml", `
state_dir = "run/state"
[logs]
max_size = "512KiB"
max_files = 0

[journal]
segment_size = "1MiB"
max_size = "64MiB"
max_age = "168h"
crash_output_lines = 50
crash_output_bytes = "16KiB"

[checkpoint]
interval = "30s"
activity = 10
max_age = "12h"
warn_size = "1MiB"

[safe_mode]
crashes = 5
window = "5m"

[sessions]
heartbeat = "2s"
stale_after = "10s"
stale_action = "kill"
cleanup_period = "15s"
kill_grace = "1s"

[services.db]
command = ["postgres", "-D", "data dir"]
cwd = "/srv/db"
env = { ZED = "last", ALPHA = "first", "MIXED.case" = "x=y" }
user = "postgres"
group = 70
restart = "always"
success_exit = [0, 143]
stop_signal = "int"
stop_timeout = "1m30s"
essential = true
autostart = false
ready = "notify"
start_timeout = "2m"
watchdog = "5s"
notify_access = "main"
on_crash = ["./bin/release-claims", "--service", "db"]
on_failed = "mail -s 'db is down' ops"
hook_timeout = "5s"
[services.db.liveness]
exec = ["pg_isready", "-q"]
period = "30s"
timeout = "2s"
failure_threshold = 5
initial_delay = "1m"
[services.db.backoff]
initial = "0s"
max = "0s"
multiplier = 1
jitter = 0
reset_after = "0s"
[services.db.crash_loop]
crashes = 0
window = "0s"
cooldown = "5m"

[services.web]
command = "exec serve --port $PORT"
cwd = "web"
depends_on = ["db"]
backoff = { multiplier = 1.5, jitter = 1.0 }
crash_loop = { crashes = 2, window = "10s" }
ready = "http://127.0.0.1:8080/healthz"
ready_check = { period = "250ms", timeout = "3s" }
liveness = { tcp = "127.0.0.1:8080" }

[services.cache]
command = ["redis-server"]
ready = "tcp://[::1]:6379"
watchdog = "10ms"
[services.cache.liveness]
http = "https://localhost/ping?deep=1"
timeout = "250ms"

[services.worker]
command = ["work"]
ready = ["exec", "./bin/work", "--ping", ""]
watchdog = "0s"
`)
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(path)
	want := &Config{
		Path:       path,
		Dir:        dir,
		StateDir:   filepath.Join(dir, "run", "state"),
		Logs:       LogLimits{MaxSize: 512 << 10, MaxFiles: 0},
		Journal:    Journal{SegmentSize: 1 << 20, MaxSize: 64 << 20, MaxAge: 168 * time.Hour, CrashOutputLines: 50, CrashOutputBytes: 16 << 10},
		Checkpoint: Checkpoint{Interval: 30 * time.Second, Activity: 10, MaxAge: 12 * time.Hour, WarnSize: 1 << 20},
		SafeMode:   SafeMode{Crashes: 5, Window: 5 * time.Minute},
		Sessions: Sessions{Heartbeat: 2 * time.Second, StaleAfter: 10 * time.Second, StaleAction: "kill",
			CleanupPeriod: 15 * time.Second, KillGrace: time.Second},
		Services: []Service{{
			Name:        "db",
			Command:     []string{"postgres", "-D", "data dir"},
			Dir:         "/srv/db",
			Env:         []string{"ZED=last", "ALPHA=first", "MIXED.case=x=y"},
			User:        "postgres",
			Group:       "70",
			Restart:     RestartAlways,
			SuccessExit: []int{0, 143},
			StopSignal:  syscall.SIGINT,
			StopTimeout: 90 * time.Second,
			Essential:   true,
			Autostart:   false,
			Backoff:     Backoff{Multiplier: 1},
			CrashLoop:   CrashLoop{Crashes: 0, Window: 0, Cooldown: 5 * time.Minute},

			Ready:        Readiness{Kind: ReadyNotify, Period: 100 * time.Millisecond, Timeout: time.Second},
			StartTimeout: 2 * time.Minute,
			Watchdog:     5 * time.Second,
			NotifyAccess: NotifyMain,
			OnCrash:      []string{"./bin/release-claims", "--service", "db"},
			OnFailed:     []string{"/bin/sh", "-c", "mail -s 'db is down' ops"},
			HookTimeout:  5 * time.Second,
			Liveness: &Probe{Kind: ReadyExec, Command: []string{"pg_isready", "-q"}, Period: 30 * time.Second,
				Timeout: 2 * time.Second, FailureThreshold: 5, InitialDelay: time.Minute},
		}, {
			Name:        "web",
			Command:     []string{"/bin/sh", "-c", "exec serve --port $PORT"},
			Shell:       true,
			Dir:         filepath.Join(dir, "web"),
			Restart:     RestartOnFailure,
			SuccessExit: []int{0},
			StopSignal:  syscall.SIGTERM,
			StopTimeout: 10 * time.Second,
			DependsOn:   []string{"db"},
			Autostart:   true,
			Backoff:     Backoff{Initial: 100 * time.Millisecond, Max: 30 * time.Second, Multiplier: 1.5, Jitter: 1, ResetAfter: 60 * time.Second},
			CrashLoop:   CrashLoop{Crashes: 2, Window: 10 * time.Second},

			Ready: Readiness{Kind: ReadyHTTP, URL: "http://127.0.0.1:8080/healthz", Period: 250 * time.Millisecond,
				Timeout: 3 * time.Second},
			StartTimeout: 90 * time.Second,
			NotifyAccess: NotifyGroup,
			HookTimeout:  30 * time.Second,
			Liveness: &Probe{Kind: ReadyTCP, Address: "127.0.0.1:8080", Period: 10 * time.Second,
				Timeout: time.Second, FailureThreshold: 3},
		}, {
			Name:        "cache",
			Command:     []string{"redis-server"},
			Dir:         dir,
			Restart:     RestartOnFailure,
			SuccessExit: []int{0},
			StopSignal:  syscall.SIGTERM,
			StopTimeout: 10 * time.Second,
			Autostart:   true,
			Backoff:     defaultBackoff,
			CrashLoop:   defaultCrashLoop,

			Ready:        Readiness{Kind: ReadyTCP, Address: "[::1]:6379", Period: 100 * time.Millisecond, Timeout: time.Second},
			StartTimeout: 90 * time.Second,
			Watchdog:     10 * time.Millisecond,
			NotifyAccess: NotifyGroup,
			HookTimeout:  30 * time.Second,
			Liveness: &Probe{Kind: ReadyHTTP, URL: "https://localhost/ping?deep=1", Period: 10 * time.Second,
				Timeout: 250 * time.Millisecond, FailureThreshold: 3},
		}, {
			Name:        "worker",
			Command:     []string{"work"},
			Dir:         dir,
			Restart:     RestartOnFailure,
			SuccessExit: []int{0},
			StopSignal:  syscall.SIGTERM,
			StopTimeout: 10 * time.Second,
			Autostart:   true,
			Backoff:     defaultBackoff,
			CrashLoop:   defaultCrashLoop,

			Ready: Readiness{Kind: ReadyExec, Command: []string{"./bin/work", "--ping", ""},
				Period: 100 * time.Millisecond, Timeout: time.Second},
			StartTimeout: 90 * time.Second,
			NotifyAccess: NotifyGroup,
			HookTimeout:  30 * time.Second,
		}},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("Load =\n%+v\nwant\n%+v", cfg, want)
	}
}

func TestRelativePathsBecomeAbsolute(t *testing.T) {
	// Not parallel: it changes the working directory.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "vigil.toml"), []byte(web), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	cfg, err := Load("vigil.toml")
	if err != nil {
		t.Fatal(err)
	}
	for what, p := range map[string]string{"Path": cfg.Path, "Dir": cfg.Dir, "StateDir": cfg.StateDir, "Services[0].Dir": cfg.Services[0].Dir} {
		if !filepath.IsAbs(p) {
			t.Errorf("%s = %q, want an absolute path", what, p)
		}
	}
	if cfg.Path != filepath.Join(dir, "vigil.toml") {
		t.Errorf("Path = %q, want %q", cfg.Path, filepath.Join(dir, "vigil.toml"))
	}
	// Errors name the file as it was given.
	if err := os.WriteFile("bad.toml", []byte("restart = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load("bad.toml")
	if !strings.HasPrefix(err.Error(), "bad.toml:1:1: ") {
		t.Errorf("Load error = %q, want it to start with %q", err, "bad.toml:1:1: ")
	}
}

func TestSignalSpellings(t *testing.T) {
	t.Parallel()
	for _, spelling := range []string{`"SIGTERM"`, `"TERM"`, `"sigterm"`, `"Term"`, `15`, `"15"`} {
		path := write(t, "vigil.toml", web+"stop_signal = "+spelling+"\n")
		cfg, err := Load(path)
		if err != nil {
			t.Errorf("stop_signal = %s: %v", spelling, err)
			continue
		}
		if got := cfg.Services[0].StopSignal; got != syscall.SIGTERM {
			t.Errorf("stop_signal = %s gave %v, want SIGTERM", spelling, got)
		}
	}
	path := write(t, "vigil.toml", web+"stop_signal = 40\n")
	if cfg, err := Load(path); err != nil || cfg.Services[0].StopSignal != syscall.Signal(40) {
		t.Errorf("stop_signal = 40 (a real-time signal): %v", err)
	}
}

func TestParseSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{
		"4096": 4096, "1B": 1, "512KiB": 512 << 10, "10MiB": 10 << 20, "1GiB": 1 << 30, "2TiB": 2 << 40,
		"10MB": 10e6, "1kb": 1000, "3 GB": 3e9, "7mib": 7 << 20,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "1.5GiB", "-1MiB", "10 megs", "10MiBs", "9223372036854775808", "9000000000GiB"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
}

func TestIntegerForms(t *testing.T) {
	t.Parallel()
	path := write(t, "vigil.toml", "logs = { max_size = 0x10_00, max_files = 1_0 }\n"+web+"backoff.multiplier = 0b11\nsuccess_exit = [0o17]\n")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Logs.MaxSize != 4096 || cfg.Logs.MaxFiles != 10 || cfg.Services[0].Backoff.Multiplier != 3 || cfg.Services[0].SuccessExit[0] != 15 {
		t.Errorf("got logs %+v, multiplier %v, success_exit %v", cfg.Logs, cfg.Services[0].Backoff.Multiplier, cfg.Services[0].SuccessExit)
	}
}

func TestServiceOrderIsFileOrder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, toml string
		want       []string
	}{
		{"tables", "[services.zeta]\ncommand = \"z\"\n[services.alpha]\ncommand = \"a\"\n[services.mid]\ncommand = \"m\"\n",
			[]string{"zeta", "alpha", "mid"}},
		{"sub-table first", "[services.b.backoff]\ninitial = \"1s\"\n[services.a]\ncommand = \"a\"\n[services.b]\ncommand = \"b\"\n",
			[]string{"b", "a"}},
		{"dotted keys", "services.y.command = \"y\"\nservices.x.command = \"x\"\n", []string{"y", "x"}},
		{"inline", "services = { q = { command = \"q\" }, p = { command = \"p\" } }\n", []string{"q", "p"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := Load(write(t, "vigil.toml", tt.toml))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range cfg.Services {
				got = append(got, s.Name)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("services %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	t.Parallel()
	_, err := Load(filepath.Join(t.TempDir(), "vigil.toml"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load of a missing file = %v, want fs.ErrNotExist", err)
	}
}

func TestFind(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := Find(dir); !errors.Is(err, ErrNoConfig) || !strings.Contains(err.Error(), "vigil.toml or Procfile") || !strings.Contains(err.Error(), dir) {
		t.Errorf("Find in an empty dir = %v, want ErrNoConfig naming both files and the dir", err)
	}
	procfile := filepath.Join(dir, "Procfile")
	if err := os.WriteFile(procfile, []byte("web: serve\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := Find(dir); err != nil || got != procfile {
		t.Errorf("Find with a Procfile = %q, %v; want %q", got, err, procfile)
	}
	toml := filepath.Join(dir, "vigil.toml")
	if err := os.WriteFile(toml, []byte(web), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := Find(dir); err != nil || got != toml {
		t.Errorf("Find with both = %q, %v; want %q (vigil.toml wins)", got, err, toml)
	}

	onlyDir := t.TempDir()
	if err := os.Mkdir(filepath.Join(onlyDir, "vigil.toml"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Find(onlyDir); !errors.Is(err, ErrNoConfig) {
		t.Errorf("Find with a directory named vigil.toml = %v, want ErrNoConfig", err)
	}
}
