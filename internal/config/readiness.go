package config

import (
	"net"
	"net/url"
	"strings"
	"time"
)

// Defaults of the readiness, watchdog and probe options.
const (
	defaultStartTimeout   = 90 * time.Second // systemd's TimeoutStartSec
	defaultReadyPeriod    = 100 * time.Millisecond
	defaultCheckTimeout   = time.Second
	defaultProbePeriod    = 10 * time.Second // Kubernetes' periodSeconds
	defaultProbeThreshold = 3                // Kubernetes' failureThreshold
	minWatchdog           = 10 * time.Millisecond
)

var (
	readyCheckKeys   = []string{"period", "timeout"}
	livenessKeys     = []string{"http", "tcp", "exec", "period", "timeout", "failure_threshold", "initial_delay"}
	readyWords       = []string{string(ReadyStarted), string(ReadyNotify)}
	notifyAccessVals = []string{string(NotifyMain), string(NotifyGroup)}
)

// ready decodes `ready`: "started", "notify", "http://…", "tcp://host:port"
// or ["exec", prog, args…].
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
		r.Kind = ReadyExec
		for _, e := range elems[1:] {
			r.Command = append(r.Command, e.text)
		}
		return
	case kindString:
	default:
		d.wrongType(f, path, `"started", "notify", "http://…", "tcp://…" or ["exec", …]`)
		return
	}
	s := f.text
	switch {
	case s == string(ReadyStarted) || s == string(ReadyNotify):
		r.Kind = ReadyKind(s)
	case strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://"):
		if msg := checkURL(s); msg != "" {
			d.add(f.pos, "%s: %s", path, msg)
			return
		}
		r.Kind, r.URL = ReadyHTTP, s
	case strings.HasPrefix(s, "tcp://"):
		addr := strings.TrimPrefix(s, "tcp://")
		if msg := checkAddress(addr); msg != "" {
			d.add(f.pos, "%s: %s", path, msg)
			return
		}
		r.Kind, r.Address = ReadyTCP, addr
	default:
		d.add(f.pos, `%s: unknown readiness %q: use "started", "notify", "http://HOST:PORT/PATH", "tcp://HOST:PORT" or ["exec", …]%s`,
			path, s, suggestion(s, readyWords))
	}
}

func checkURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "invalid URL " + quote(s)
	}
	if u.Host == "" || u.Hostname() == "" {
		return "URL " + quote(s) + " has no host"
	}
	return ""
}

func checkAddress(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return "address " + quote(addr) + " must be HOST:PORT"
	}
	if host == "" {
		return "address " + quote(addr) + " has no host"
	}
	return ""
}

func quote(s string) string { return `"` + s + `"` }

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
	s, ok := d.nonEmptyString(f, path)
	if !ok {
		return "", false
	}
	if s != string(NotifyMain) && s != string(NotifyGroup) {
		d.add(f.pos, `%s: must be "main" or "group", got %q%s`, path, s, suggestion(s, notifyAccessVals))
		return "", false
	}
	return NotifyAccess(s), true
}

func (d *decoder) liveness(v *value, path string) *Probe {
	p := &Probe{Period: defaultProbePeriod, Timeout: defaultCheckTimeout, FailureThreshold: defaultProbeThreshold}
	var kinds []string
	known := d.eachField(v, path, livenessKeys, func(key string, f *value, fp string) bool {
		switch key {
		case "http":
			kinds = append(kinds, key)
			if s, ok := d.nonEmptyString(f, fp); ok {
				if msg := checkURL(s); msg != "" || !(strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")) {
					if msg == "" {
						msg = "URL " + quote(s) + " must start with http:// or https://"
					}
					d.add(f.pos, "%s: %s", fp, msg)
				}
				p.Kind, p.URL = ReadyHTTP, s
			}
		case "tcp":
			kinds = append(kinds, key)
			if s, ok := d.nonEmptyString(f, fp); ok {
				if msg := checkAddress(s); msg != "" {
					d.add(f.pos, "%s: %s", fp, msg)
				}
				p.Kind, p.Address = ReadyTCP, s
			}
		case "exec":
			kinds = append(kinds, key)
			if elems, ok := d.stringArray(f, fp); ok {
				if len(elems) == 0 {
					d.add(f.pos, "%s: must name a program", fp)
				}
				p.Kind, p.Command = ReadyExec, nil
				for _, e := range elems {
					p.Command = append(p.Command, e.text)
				}
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
	if known && len(kinds) != 1 {
		d.add(v.keyPos, "%s: give exactly one of http, tcp or exec (got %d)", path, len(kinds))
	}
	return p
}
