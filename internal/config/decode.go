package config

import (
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// Defaults. Why each is what it is: docs/config.md, "Why these defaults".
const (
	defaultStateDir    = ".vigil"
	defaultMaxLogSize  = 10 << 20
	defaultMaxLogFiles = 3
	defaultStopTimeout = 10 * time.Second
)

var (
	defaultBackoff   = Backoff{Initial: 100 * time.Millisecond, Max: 30 * time.Second, Multiplier: 2, Jitter: 0.2, ResetAfter: 60 * time.Second}
	defaultCrashLoop = CrashLoop{Crashes: 5, Window: 60 * time.Second}
)

// defaultConfig is the Config of a file that sets nothing but services.
func defaultConfig(path, dir string) *Config {
	return &Config{
		Path:     path,
		Dir:      dir,
		StateDir: filepath.Join(dir, defaultStateDir),
		Logs:     LogLimits{MaxSize: defaultMaxLogSize, MaxFiles: defaultMaxLogFiles},

		Journal:    defaultJournal,
		Checkpoint: defaultCheckpoint,
		SafeMode:   defaultSafeMode,
		Sessions:   defaultSessions,
	}
}

// defaultService is a service that sets nothing but its command.
func defaultService(name, dir string) Service {
	return Service{
		Name:        name,
		Dir:         dir,
		Restart:     RestartOnFailure,
		SuccessExit: []int{0},
		StopSignal:  syscall.SIGTERM,
		StopTimeout: defaultStopTimeout,
		Autostart:   true,
		Backoff:     defaultBackoff,
		CrashLoop:   defaultCrashLoop,

		Ready:        Readiness{Kind: ReadyStarted, Period: defaultReadyPeriod, Timeout: defaultCheckTimeout},
		StartTimeout: defaultStartTimeout,
		NotifyAccess: NotifyGroup,
		HookTimeout:  defaultHookTimeout,
	}
}

// The keys each table accepts, for suggestions when a key is unknown.
var (
	topKeys       = []string{"state_dir", "logs", "journal", "checkpoint", "safe_mode", "sessions", "services"}
	logsKeys      = []string{"max_size", "max_files"}
	serviceKeys   = []string{"command", "cwd", "env", "user", "group", "restart", "success_exit", "stop_signal", "stop_timeout", "depends_on", "essential", "autostart", "backoff", "crash_loop", "ready", "ready_check", "start_timeout", "watchdog", "notify_access", "liveness", "on_crash", "on_failed", "hook_timeout"}
	backoffKeys   = []string{"initial", "max", "multiplier", "jitter", "reset_after"}
	crashLoopKeys = []string{"crashes", "window", "cooldown"}
	restartValues = []string{string(RestartAlways), string(RestartOnFailure), string(RestartNever)}
)

var serviceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// nameRule explains serviceName to a person.
const nameRule = "names are 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"

// decoder turns the tree of a vigil.toml into a Config, reporting every
// problem it finds rather than stopping at the first.
type decoder struct {
	*problems
	dir string
	// deps keeps each service's depends_on entries with their positions,
	// for the checks that need every service decoded first.
	deps map[string][]*value
}

func decodeTOML(root *value, path, dir string, pr *problems) *Config {
	d := &decoder{problems: pr, dir: dir, deps: map[string][]*value{}}
	cfg := defaultConfig(path, dir)
	var services *value
	d.eachField(root, "", topKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "state_dir":
			if s, ok := d.nonEmptyString(f, fp); ok {
				cfg.StateDir = d.abs(s)
			}
		case "logs":
			cfg.Logs = d.logs(f, fp)
		case "journal":
			cfg.Journal = d.journal(f, fp)
		case "checkpoint":
			cfg.Checkpoint = d.checkpoint(f, fp)
		case "safe_mode":
			cfg.SafeMode = d.safeMode(f, fp)
		case "sessions":
			cfg.Sessions = d.sessions(f, fp)
		case "services":
			services = f
			cfg.Services = d.services(f, fp)
		default:
			return false
		}
		return true
	})
	switch {
	case services == nil:
		d.add(position{1, 1}, "no services defined; add a [services.NAME] table")
	case services.kind == kindTable && len(services.table.keys) == 0:
		d.add(services.keyPos, "no services defined; add a [services.NAME] table")
	case services.kind == kindTable:
		d.checkDependencies(services.table.keys)
	}
	return cfg
}

func (d *decoder) logs(v *value, path string) LogLimits {
	l := LogLimits{MaxSize: defaultMaxLogSize, MaxFiles: defaultMaxLogFiles}
	d.eachField(v, path, logsKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "max_size":
			if n, ok := d.size(f, fp); ok {
				l.MaxSize = n
			}
		case "max_files":
			if n, ok := d.nonNegativeInt(f, fp); ok {
				l.MaxFiles = n
			}
		default:
			return false
		}
		return true
	})
	return l
}

func (d *decoder) services(v *value, path string) []Service {
	if v.kind != kindTable {
		d.wrongType(v, path, "a table of services")
		return nil
	}
	var services []Service
	for _, name := range v.table.keys {
		f := v.table.fields[name]
		if !serviceName.MatchString(name) {
			d.add(f.keyPos, "invalid service name %q: %s", name, nameRule)
		}
		services = append(services, d.service(name, f, keyPath(path, name)))
	}
	return services
}

func (d *decoder) service(name string, v *value, path string) Service {
	s := defaultService(name, d.dir)
	// commandSeen is also set by a misspelt "command": that is reported as
	// an unknown key, and saying it is missing too would report one typo twice.
	commandSeen := false
	known := d.eachField(v, path, serviceKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "command":
			commandSeen = true
			s.Command, s.Shell = d.command(f, fp)
		case "on_crash":
			s.OnCrash, _ = d.command(f, fp)
		case "on_failed":
			s.OnFailed, _ = d.command(f, fp)
		case "hook_timeout":
			if t, ok := d.positive(f, fp); ok {
				s.HookTimeout = t
			}
		case "cwd":
			if dir, ok := d.nonEmptyString(f, fp); ok {
				s.Dir = d.abs(dir)
			}
		case "env":
			s.Env = d.env(f, fp)
		case "user":
			s.User = d.identity(f, fp)
		case "group":
			s.Group = d.identity(f, fp)
		case "restart":
			if r, ok := d.restart(f, fp); ok {
				s.Restart = r
			}
		case "success_exit":
			if codes, ok := d.exitCodes(f, fp); ok {
				s.SuccessExit = codes
			}
		case "stop_signal":
			if sig, ok := d.signal(f, fp); ok {
				s.StopSignal = sig
			}
		case "stop_timeout":
			if t, ok := d.duration(f, fp); ok {
				s.StopTimeout = t
			}
		case "depends_on":
			if elems, ok := d.stringArray(f, fp); ok {
				d.deps[name] = elems
				for _, e := range elems {
					s.DependsOn = append(s.DependsOn, e.text)
				}
			}
		case "essential":
			if b, ok := d.boolean(f, fp); ok {
				s.Essential = b
			}
		case "autostart":
			if b, ok := d.boolean(f, fp); ok {
				s.Autostart = b
			}
		case "backoff":
			s.Backoff = d.backoff(f, fp)
		case "crash_loop":
			s.CrashLoop = d.crashLoop(f, fp)
		case "ready":
			d.ready(f, fp, &s.Ready)
		case "ready_check":
			d.readyCheck(f, fp, &s.Ready)
		case "start_timeout":
			if t, ok := d.positive(f, fp); ok {
				s.StartTimeout = t
			}
		case "watchdog":
			if t, ok := d.watchdog(f, fp); ok {
				s.Watchdog = t
			}
		case "notify_access":
			if a, ok := d.notifyAccess(f, fp); ok {
				s.NotifyAccess = a
			}
		case "liveness":
			s.Liveness = d.liveness(f, fp)
		default:
			commandSeen = commandSeen || closest(key, serviceKeys) == "command"
			return false
		}
		return true
	})
	if known && !commandSeen {
		d.add(v.keyPos, "%s: missing required key \"command\"", path)
	}
	return s
}

// command returns argv: a string runs through /bin/sh -c, an array is
// exec'd as it is, so no shell ever re-splits or expands its words.
func (d *decoder) command(f *value, path string) (argv []string, shell bool) {
	switch f.kind {
	case kindString:
		if strings.TrimSpace(f.text) == "" {
			d.add(f.pos, "%s: must not be empty", path)
		}
		d.noNUL(f, path)
		return []string{"/bin/sh", "-c", f.text}, true
	case kindArray:
		if len(f.elems) == 0 {
			d.add(f.pos, "%s: must not be empty", path)
			return nil, false
		}
		for i, e := range f.elems {
			ep := fmt.Sprintf("%s[%d]", path, i)
			if e.kind != kindString {
				d.wrongType(e, ep, "a string")
				continue
			}
			if i == 0 && e.text == "" {
				d.add(e.pos, "%s: the program name must not be empty", ep)
			}
			d.noNUL(e, ep)
			argv = append(argv, e.text)
		}
		return argv, false
	default:
		d.wrongType(f, path, "a string (run by /bin/sh -c) or an array of strings (run directly)")
		return nil, false
	}
}

func (d *decoder) env(v *value, path string) []string {
	if v.kind != kindTable {
		d.wrongType(v, path, "a table such as { KEY = \"value\" }")
		return nil
	}
	var env []string
	for _, key := range v.table.keys {
		f := v.table.fields[key]
		fp := keyPath(path, key)
		if key == "" || strings.ContainsAny(key, "=\x00") {
			d.add(f.keyPos, "%s: invalid variable name %q: it must be non-empty without '=' or NUL", path, key)
			continue
		}
		if f.kind != kindString {
			want := "a string"
			if f.kind == kindInteger || f.kind == kindFloat || f.kind == kindBool {
				want = fmt.Sprintf("a string (quote it: %q)", f.text)
			}
			d.wrongType(f, fp, want)
			continue
		}
		if d.noNUL(f, fp) {
			env = append(env, key+"="+f.text)
		}
	}
	return env
}

// identity is a user or group: a name, or a number given as an integer.
func (d *decoder) identity(f *value, path string) string {
	if f.kind == kindInteger {
		if n, ok := d.nonNegativeInt(f, path); ok {
			return strconv.Itoa(n)
		}
		return ""
	}
	if f.kind != kindString {
		d.wrongType(f, path, "a name or a number")
		return ""
	}
	d.noNUL(f, path)
	return f.text
}

func (d *decoder) restart(f *value, path string) (Restart, bool) {
	if f.kind != kindString {
		d.wrongType(f, path, `a string ("always", "on-failure" or "never")`)
		return "", false
	}
	if !slices.Contains(restartValues, f.text) {
		d.add(f.pos, `%s: invalid value %q; want "always", "on-failure" or "never"%s`, path, f.text, suggestion(f.text, restartValues))
		return "", false
	}
	return Restart(f.text), true
}

func (d *decoder) exitCodes(f *value, path string) ([]int, bool) {
	if f.kind != kindArray {
		d.wrongType(f, path, "an array of exit codes")
		return nil, false
	}
	codes := []int{}
	ok := true
	for i, e := range f.elems {
		ep := fmt.Sprintf("%s[%d]", path, i)
		n, good := d.integer(e, ep)
		if good && (n < 0 || n > 255) {
			d.add(e.pos, "%s: exit code %d is outside 0..255", ep, n)
			good = false
		}
		ok = ok && good
		codes = append(codes, int(n))
	}
	return codes, ok
}

// maxSignal is the highest Linux signal number (_NSIG - 1); 34 and up are
// the real-time signals, which have numbers but no names.
const maxSignal = 64

// signals are the Linux signal names, without "SIG", aliases included.
var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "ILL": syscall.SIGILL,
	"TRAP": syscall.SIGTRAP, "ABRT": syscall.SIGABRT, "IOT": syscall.SIGIOT, "BUS": syscall.SIGBUS,
	"FPE": syscall.SIGFPE, "KILL": syscall.SIGKILL, "USR1": syscall.SIGUSR1, "SEGV": syscall.SIGSEGV,
	"USR2": syscall.SIGUSR2, "PIPE": syscall.SIGPIPE, "ALRM": syscall.SIGALRM, "TERM": syscall.SIGTERM,
	"STKFLT": syscall.SIGSTKFLT, "CHLD": syscall.SIGCHLD, "CLD": syscall.SIGCLD, "CONT": syscall.SIGCONT,
	"STOP": syscall.SIGSTOP, "TSTP": syscall.SIGTSTP, "TTIN": syscall.SIGTTIN, "TTOU": syscall.SIGTTOU,
	"URG": syscall.SIGURG, "XCPU": syscall.SIGXCPU, "XFSZ": syscall.SIGXFSZ, "VTALRM": syscall.SIGVTALRM,
	"PROF": syscall.SIGPROF, "WINCH": syscall.SIGWINCH, "IO": syscall.SIGIO, "POLL": syscall.SIGPOLL,
	"PWR": syscall.SIGPWR, "SYS": syscall.SIGSYS,
}

// signal accepts "SIGTERM", "TERM", "sigterm", 15 or "15".
func (d *decoder) signal(f *value, path string) (syscall.Signal, bool) {
	var n int64
	switch f.kind {
	case kindInteger:
		var ok bool
		if n, ok = d.integer(f, path); !ok {
			return 0, false
		}
	case kindString:
		if num, err := strconv.ParseInt(f.text, 10, 64); err == nil {
			n = num
			break
		}
		name := strings.TrimPrefix(strings.ToUpper(f.text), "SIG")
		sig, ok := signals[name]
		if !ok {
			hint := ""
			if c := closest(name, slices.Sorted(maps.Keys(signals))); c != "" {
				hint = `; did you mean "SIG` + c + `"?`
			}
			d.add(f.pos, "%s: unknown signal %q%s", path, f.text, hint)
			return 0, false
		}
		return sig, true
	default:
		d.wrongType(f, path, `a signal name such as "SIGTERM" or a number`)
		return 0, false
	}
	if n < 1 || n > maxSignal {
		d.add(f.pos, "%s: signal number %d is outside 1..%d", path, n, maxSignal)
		return 0, false
	}
	return syscall.Signal(n), true
}

func (d *decoder) backoff(v *value, path string) Backoff {
	b := defaultBackoff
	var initialAt, maxAt *value
	d.eachField(v, path, backoffKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "initial":
			if t, ok := d.duration(f, fp); ok {
				b.Initial, initialAt = t, f
			}
		case "max":
			if t, ok := d.duration(f, fp); ok {
				b.Max, maxAt = t, f
			}
		case "multiplier":
			if x, ok := d.number(f, fp); ok {
				if x >= 1 && !math.IsInf(x, 1) {
					b.Multiplier = x
				} else {
					d.add(f.pos, "%s: must be a number of at least 1 (1 keeps the delay constant), got %s", fp, f.text)
				}
			}
		case "jitter":
			if x, ok := d.number(f, fp); ok {
				if x >= 0 && x <= 1 {
					b.Jitter = x
				} else {
					d.add(f.pos, "%s: must be between 0 and 1, got %s", fp, f.text)
				}
			}
		case "reset_after":
			if t, ok := d.duration(f, fp); ok {
				b.ResetAfter = t
			}
		default:
			return false
		}
		return true
	})
	switch {
	case b.Max >= b.Initial:
	case maxAt != nil:
		d.add(maxAt.pos, "%s: %s is less than initial (%s)", keyPath(path, "max"), b.Max, b.Initial)
	case initialAt != nil:
		d.add(initialAt.pos, "%s: %s is more than max (%s, the default); set max too", keyPath(path, "initial"), b.Initial, b.Max)
	}
	return b
}

func (d *decoder) crashLoop(v *value, path string) CrashLoop {
	c := defaultCrashLoop
	var crashesAt, windowAt *value
	d.eachField(v, path, crashLoopKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "crashes":
			if n, ok := d.nonNegativeInt(f, fp); ok {
				c.Crashes, crashesAt = n, f
			}
		case "window":
			if t, ok := d.duration(f, fp); ok {
				c.Window, windowAt = t, f
			}
		case "cooldown":
			if t, ok := d.duration(f, fp); ok {
				c.Cooldown = t
			}
		default:
			return false
		}
		return true
	})
	if c.Crashes > 0 && c.Window == 0 {
		at := windowAt
		if at == nil {
			at = crashesAt
		}
		d.add(at.pos, "%s: window must be more than 0 when crashes > 0 (crashes = 0 disables the breaker)", path)
	}
	return c
}

// checkDependencies reports depends_on entries that name no service, the
// service itself or a service twice, and every dependency cycle, at the
// entry where the problem is written. names are all services in file order.
func (d *decoder) checkDependencies(names []string) {
	type edge struct {
		to string
		at *value
	}
	edges := map[string][]edge{}
	for _, name := range names {
		path := keyPath(keyPath("services", name), "depends_on")
		seen := map[string]bool{}
		for _, dep := range d.deps[name] {
			switch {
			case dep.text == name:
				d.add(dep.pos, "%s: service %q depends on itself", path, name)
			case !slices.Contains(names, dep.text):
				others := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == name })
				d.add(dep.pos, "%s: unknown service %q%s", path, dep.text, suggestion(dep.text, others))
			case seen[dep.text]:
				d.add(dep.pos, "%s: %q is listed twice", path, dep.text)
			default:
				seen[dep.text] = true
				// Cycles are searched among valid names only, so that a
				// cycle message never has to quote a name.
				if serviceName.MatchString(name) && serviceName.MatchString(dep.text) {
					edges[name] = append(edges[name], edge{dep.text, dep})
				}
			}
		}
	}

	const (
		unvisited = iota
		onPath
		done
	)
	state := map[string]int{}
	var path []string  // the services being visited, each depending on the next
	var taken []*value // taken[i] is the entry by which path[i] depends on path[i+1]
	var visit func(name string)
	visit = func(name string) {
		state[name] = onPath
		path = append(path, name)
		for _, e := range edges[name] {
			switch state[e.to] {
			case unvisited:
				taken = append(taken, e.at)
				visit(e.to)
				taken = taken[:len(taken)-1]
			case onPath:
				start := slices.Index(path, e.to)
				cycle := append(slices.Clone(path[start:]), e.to)
				at := e.at
				if start < len(taken) {
					at = taken[start]
				}
				d.add(at.pos, "depends_on cycle: %s", strings.Join(cycle, " -> "))
			}
		}
		path = path[:len(path)-1]
		state[name] = done
	}
	for _, name := range names {
		if state[name] == unvisited {
			visit(name)
		}
	}
}

// eachField calls set for each key of the table v in file order; set
// returns false for a key it does not know, which is reported with the
// closest of allowed as a suggestion. eachField returns false if v is not a
// table.
func (d *decoder) eachField(v *value, path string, allowed []string, set func(key string, f *value, fp string) bool) bool {
	if v.kind != kindTable {
		d.wrongType(v, path, "a table")
		return false
	}
	for _, key := range v.table.keys {
		f := v.table.fields[key]
		if set(key, f, keyPath(path, key)) {
			continue
		}
		where := "at the top level"
		if path != "" {
			where = "in [" + path + "]"
		}
		d.add(f.keyPos, "unknown key %q %s%s", key, where, suggestion(key, allowed))
	}
	return true
}

func (d *decoder) wrongType(f *value, path, want string) {
	d.add(f.pos, "%s: expected %s, got %s", path, want, describe(f))
}

// describe says what a value is, for "expected X, got Y" messages.
func describe(v *value) string {
	switch v.kind {
	case kindTable:
		return "a table"
	case kindArray:
		return "an array"
	case kindString:
		text := v.text
		if utf8.RuneCountInString(text) > 40 {
			text = string([]rune(text)[:40]) + "…"
		}
		return "string " + strconv.Quote(text)
	default:
		return string(v.kind) + " " + v.text
	}
}

func (d *decoder) nonEmptyString(f *value, path string) (string, bool) {
	if f.kind != kindString {
		d.wrongType(f, path, "a string")
		return "", false
	}
	if f.text == "" {
		d.add(f.pos, "%s: must not be empty", path)
		return "", false
	}
	return f.text, d.noNUL(f, path)
}

// noNUL reports a string the kernel could not pass on (argv, environment
// and paths are NUL-terminated) and returns whether the string is usable.
func (d *decoder) noNUL(f *value, path string) bool {
	if strings.IndexByte(f.text, 0) >= 0 {
		d.add(f.pos, "%s: must not contain a NUL byte", path)
		return false
	}
	return true
}

func (d *decoder) stringArray(f *value, path string) ([]*value, bool) {
	if f.kind != kindArray {
		d.wrongType(f, path, "an array of strings")
		return nil, false
	}
	ok := true
	for i, e := range f.elems {
		if e.kind != kindString {
			d.wrongType(e, fmt.Sprintf("%s[%d]", path, i), "a string")
			ok = false
		}
	}
	return f.elems, ok
}

func (d *decoder) boolean(f *value, path string) (bool, bool) {
	if f.kind != kindBool {
		d.wrongType(f, path, "true or false")
		return false, false
	}
	return f.text == "true", true
}

func (d *decoder) integer(f *value, path string) (int64, bool) {
	if f.kind != kindInteger {
		d.wrongType(f, path, "an integer")
		return 0, false
	}
	// Base 0 reads TOML's 0x, 0o, 0b prefixes and '_' separators.
	n, err := strconv.ParseInt(f.text, 0, 64)
	if err != nil {
		d.add(f.pos, "%s: integer %s is out of range", path, f.text)
		return 0, false
	}
	return n, true
}

func (d *decoder) nonNegativeInt(f *value, path string) (int, bool) {
	n, ok := d.integer(f, path)
	if !ok {
		return 0, false
	}
	switch {
	case n < 0:
		d.add(f.pos, "%s: must not be negative, got %d", path, n)
		return 0, false
	case n > math.MaxInt32:
		d.add(f.pos, "%s: %d is too large", path, n)
		return 0, false
	}
	return int(n), true
}

// number is a float or an integer, since `multiplier = 2` means 2.0.
func (d *decoder) number(f *value, path string) (float64, bool) {
	if f.kind != kindFloat && f.kind != kindInteger {
		d.wrongType(f, path, "a number")
		return 0, false
	}
	x, err := strconv.ParseFloat(strings.ReplaceAll(f.text, "_", ""), 64)
	if err != nil && f.kind == kindInteger {
		// A hex, octal or binary integer.
		var n int64
		if n, err = strconv.ParseInt(f.text, 0, 64); err == nil {
			x = float64(n)
		}
	}
	if err != nil {
		d.add(f.pos, "%s: invalid number %s", path, f.text)
		return 0, false
	}
	return x, true
}

func (d *decoder) duration(f *value, path string) (time.Duration, bool) {
	if f.kind != kindString {
		d.wrongType(f, path, `a duration string such as "10s"`)
		return 0, false
	}
	t, err := time.ParseDuration(f.text)
	if err != nil {
		d.add(f.pos, `%s: invalid duration %q; write a number with a unit, such as "500ms", "10s" or "1m30s"`, path, f.text)
		return 0, false
	}
	if t < 0 {
		d.add(f.pos, "%s: duration must not be negative, got %q", path, f.text)
		return 0, false
	}
	return t, true
}

func (d *decoder) size(f *value, path string) (int64, bool) {
	var n int64
	switch f.kind {
	case kindInteger:
		var ok bool
		if n, ok = d.integer(f, path); !ok {
			return 0, false
		}
	case kindString:
		var err error
		if n, err = parseSize(f.text); err != nil {
			d.add(f.pos, `%s: invalid size %q: %v`, path, f.text, err)
			return 0, false
		}
	default:
		d.wrongType(f, path, `a size such as "10MiB" or a number of bytes`)
		return 0, false
	}
	if n <= 0 {
		d.add(f.pos, "%s: must be more than 0 bytes, got %s", path, f.text)
		return 0, false
	}
	return n, true
}

var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

// parseSize reads "512KiB", "10MiB", "1GiB", "10MB" or "4096": a whole
// number and an optional unit, case-insensitive; KB/MB/GB are powers of 1000
// and KiB/MiB/GiB powers of 1024.
func parseSize(s string) (int64, error) {
	digits := len(s) - len(strings.TrimLeft(s, "0123456789"))
	if digits == 0 {
		return 0, fmt.Errorf(`want a whole number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), such as "10MiB"`)
	}
	unit, ok := sizeUnits[strings.ToLower(strings.TrimSpace(s[digits:]))]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q; want B, KB, MB, GB, TB, KiB, MiB, GiB or TiB", strings.TrimSpace(s[digits:]))
	}
	n, err := strconv.ParseInt(s[:digits], 10, 64)
	if err != nil || n > math.MaxInt64/unit {
		return 0, fmt.Errorf("too large")
	}
	return n * unit, nil
}

func (d *decoder) abs(p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(d.dir, p)
}

// keyPath appends key to a dotted path, quoting it as TOML would need.
func keyPath(path, key string) string {
	if path == "" {
		return quoteKey(key)
	}
	return path + "." + quoteKey(key)
}

var bareKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

func quoteKey(key string) string {
	if bareKey.MatchString(key) {
		return key
	}
	return strconv.Quote(key)
}
