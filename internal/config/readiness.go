package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Defaults of the readiness, watchdog and probe options. Why each is what it
// is: docs/config.md, "Why these defaults".
const (
	defaultStartTimeout   = 90 * time.Second // systemd's TimeoutStartSec
	defaultHookTimeout    = 30 * time.Second
	defaultReadyPeriod    = 100 * time.Millisecond
	defaultCheckTimeout   = time.Second      // Kubernetes' timeoutSeconds
	defaultProbePeriod    = 10 * time.Second // Kubernetes' periodSeconds
	defaultProbeThreshold = 3                // Kubernetes' failureThreshold
	// minWatchdog keeps a heartbeat interval above the daemon's timer
	// precision and a child's scheduling delay, so a busy machine is not
	// mistaken for a hung service.
	minWatchdog = 10 * time.Millisecond
)

var (
	readyCheckKeys   = []string{"period", "timeout"}
	livenessKeys     = []string{"http", "tcp", "exec", "period", "timeout", "failure_threshold", "initial_delay"}
	readyWords       = []string{string(ReadyStarted), string(ReadyNotify)}
	notifyAccessVals = []string{string(NotifyMain), string(NotifyGroup)}
)

// ready decodes `ready`: "started", "notify", "http(s)://…",
// "tcp://HOST:PORT" or ["exec", program, args…].
func (d *decoder) ready(f *value, path string, r *Readiness) {
	switch f.kind {
	case kindArray:
		elems, ok := d.stringArray(f, path)
		if !ok {
			return
		}
		if len(elems) < 2 || elems[0].text != "exec" {
			d.add(f.pos, `%s: an array must be ["exec", "program", "arg"…]`, path)
			return
		}
		if argv, ok := d.argv(elems[1:], path, 1); ok {
			r.Kind, r.Command = ReadyExec, argv
		}
		return
	case kindString:
	default:
		d.wrongType(f, path, `"started", "notify", "http://…", "tcp://…" or ["exec", …]`)
		return
	}
	if !d.noNUL(f, path) {
		return
	}
	s := f.text
	switch {
	case s == string(ReadyStarted) || s == string(ReadyNotify):
		r.Kind = ReadyKind(s)
	case strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://"):
		if msg := urlProblem(s); msg != "" {
			d.add(f.pos, "%s: %s", path, msg)
			return
		}
		r.Kind, r.URL = ReadyHTTP, s
	case strings.HasPrefix(s, "tcp://"):
		addr := strings.TrimPrefix(s, "tcp://")
		if msg := addressProblem(addr); msg != "" {
			d.add(f.pos, "%s: %s", path, msg)
			return
		}
		r.Kind, r.Address = ReadyTCP, addr
	default:
		d.add(f.pos, `%s: unknown readiness %q: use "started", "notify", "http://HOST:PORT/PATH", "tcp://HOST:PORT" or ["exec", …]%s`,
			path, s, suggestion(s, readyWords))
	}
}

// argv turns the string elements of an exec array into a command line;
// first is the index of elems[0] in the array, for messages. The program
// name must not be empty: it is what is executed.
func (d *decoder) argv(elems []*value, path string, first int) ([]string, bool) {
	ok := true
	argv := make([]string, 0, len(elems))
	for i, e := range elems {
		ep := fmt.Sprintf("%s[%d]", path, first+i)
		if i == 0 && e.text == "" {
			d.add(e.pos, "%s: the program name must not be empty", ep)
			ok = false
		}
		ok = d.noNUL(e, ep) && ok
		argv = append(argv, e.text)
	}
	return argv, ok
}

// urlProblem says what is wrong with an http(s) URL to GET, or "" if
// nothing is. Only what can be known without the network is checked.
func urlProblem(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the whole URL
		}
		return fmt.Sprintf("invalid URL %q: %v", s, err)
	}
	switch {
	case !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://"):
		return fmt.Sprintf("URL %q must start with http:// or https://", s)
	case u.Hostname() == "":
		return fmt.Sprintf("URL %q has no host", s)
	case u.Port() != "" && !validPort(u.Port()):
		return fmt.Sprintf("URL %q has port %s, outside 1..65535", s, u.Port())
	}
	return ""
}

// addressProblem says what is wrong with a HOST:PORT to connect to, or ""
// if nothing is. The port must be a number: service names depend on the
// /etc/services of the machine, which this package does not read.
func addressProblem(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	switch {
	case err != nil:
		return fmt.Sprintf("address %q must be HOST:PORT", addr)
	case host == "":
		return fmt.Sprintf("address %q has no host", addr)
	case !validPort(port):
		return fmt.Sprintf("address %q has port %q; want a number 1..65535", addr, port)
	}
	return ""
}

func validPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 1 && n <= 65535 && s[0] != '+'
}

// positive decodes a duration that must be more than zero.
func (d *decoder) positive(f *value, path string) (time.Duration, bool) {
	t, ok := d.duration(f, path)
	if ok && t == 0 {
		d.add(f.pos, "%s: must be more than 0", path)
		return 0, false
	}
	return t, ok
}

func (d *decoder) readyCheck(v *value, path string, r *Readiness) {
	d.eachField(v, path, readyCheckKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "period":
			if t, ok := d.positive(f, fp); ok {
				r.Period = t
			}
		case "timeout":
			if t, ok := d.positive(f, fp); ok {
				r.Timeout = t
			}
		default:
			return false
		}
		return true
	})
}

func (d *decoder) watchdog(f *value, path string) (time.Duration, bool) {
	t, ok := d.duration(f, path)
	if ok && t != 0 && t < minWatchdog {
		d.add(f.pos, "%s: must be 0 (off) or at least %s, got %q", path, minWatchdog, f.text)
		return 0, false
	}
	return t, ok
}

func (d *decoder) notifyAccess(f *value, path string) (NotifyAccess, bool) {
	if f.kind != kindString {
		d.wrongType(f, path, `"main" or "group"`)
		return "", false
	}
	if f.text != string(NotifyMain) && f.text != string(NotifyGroup) {
		d.add(f.pos, `%s: must be "main" or "group", got %q%s`, path, f.text, suggestion(f.text, notifyAccessVals))
		return "", false
	}
	return NotifyAccess(f.text), true
}

// liveness decodes a [services.NAME.liveness] table, which names exactly
// one check.
func (d *decoder) liveness(v *value, path string) *Probe {
	p := &Probe{Period: defaultProbePeriod, Timeout: defaultCheckTimeout, FailureThreshold: defaultProbeThreshold}
	kinds := 0
	known := d.eachField(v, path, livenessKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "http":
			kinds++
			if s, ok := d.nonEmptyString(f, fp); ok {
				if msg := urlProblem(s); msg != "" {
					d.add(f.pos, "%s: %s", fp, msg)
				}
				p.Kind, p.URL = ReadyHTTP, s
			}
		case "tcp":
			kinds++
			if s, ok := d.nonEmptyString(f, fp); ok {
				if strings.HasPrefix(s, "tcp://") {
					d.add(f.pos, `%s: write the address without "tcp://": %q`, fp, strings.TrimPrefix(s, "tcp://"))
				} else if msg := addressProblem(s); msg != "" {
					d.add(f.pos, "%s: %s", fp, msg)
				}
				p.Kind, p.Address = ReadyTCP, s
			}
		case "exec":
			kinds++
			if elems, ok := d.stringArray(f, fp); ok {
				if len(elems) == 0 {
					d.add(f.pos, "%s: must name a program", fp)
				}
				p.Command, _ = d.argv(elems, fp, 0)
				p.Kind = ReadyExec
			}
		case "period":
			if t, ok := d.positive(f, fp); ok {
				p.Period = t
			}
		case "timeout":
			if t, ok := d.positive(f, fp); ok {
				p.Timeout = t
			}
		case "failure_threshold":
			if n, ok := d.nonNegativeInt(f, fp); ok {
				if n < 1 {
					d.add(f.pos, "%s: must be at least 1", fp)
				} else {
					p.FailureThreshold = n
				}
			}
		case "initial_delay":
			if t, ok := d.duration(f, fp); ok {
				p.InitialDelay = t
			}
		default:
			return false
		}
		return true
	})
	if known && kinds != 1 {
		d.add(v.keyPos, "%s: give exactly one of http, tcp or exec (got %d)", path, kinds)
	}
	return p
}
