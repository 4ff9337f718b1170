package config

import (
	"errors"
	"net"
	neturl "net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// FuzzLoad feeds arbitrary bytes to Load as a vigil.toml or a Procfile. Load
// must not panic, and whatever it returns must keep its promises: problems
// carry a real position and a one-line message; a Config satisfies every
// invariant in the package comment.
func FuzzLoad(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, procfile bool) {
		name := "vigil.toml"
		if procfile {
			name = "Procfile"
		}
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(path)
		if err != nil {
			checkProblems(t, err, path, data)
			return
		}
		checkConfig(t, cfg)
	})
}

func checkProblems(t *testing.T, err error, path string, data []byte) {
	var errs Errors
	if !errors.As(err, &errs) || len(errs) == 0 {
		t.Fatalf("Load error %v (%T) is not a non-empty Errors", err, err)
	}
	lines := 1 + strings.Count(string(data), "\n")
	for _, e := range errs {
		if e.File != path || e.Line < 1 || e.Line > lines || e.Col < 1 || e.Msg == "" || strings.Contains(e.Msg, "\n") {
			t.Errorf("malformed problem %#v (file has %d lines)", e, lines)
		}
	}
}

func checkConfig(t *testing.T, cfg *Config) {
	if len(cfg.Services) == 0 {
		t.Fatal("a Config without services")
	}
	for _, p := range []string{cfg.Path, cfg.Dir, cfg.StateDir} {
		if !filepath.IsAbs(p) {
			t.Errorf("path %q is not absolute", p)
		}
	}
	if cfg.Logs.MaxSize <= 0 || cfg.Logs.MaxFiles < 0 {
		t.Errorf("log limits %+v", cfg.Logs)
	}
	names := map[string]bool{}
	for _, s := range cfg.Services {
		if !serviceName.MatchString(s.Name) || names[s.Name] {
			t.Errorf("invalid or duplicate service name %q", s.Name)
		}
		names[s.Name] = true
		if len(s.Command) == 0 || s.Command[0] == "" || !filepath.IsAbs(s.Dir) {
			t.Errorf("service %s: command %q, dir %q", s.Name, s.Command, s.Dir)
		}
		b, c := s.Backoff, s.CrashLoop
		if b.Initial < 0 || b.Max < b.Initial || !(b.Multiplier >= 1) || !(b.Jitter >= 0 && b.Jitter <= 1) || b.ResetAfter < 0 ||
			c.Crashes < 0 || c.Window < 0 || c.Cooldown < 0 || (c.Crashes > 0 && c.Window == 0) || s.StopTimeout < 0 {
			t.Errorf("service %s: policy out of range: %+v %+v %v", s.Name, b, c, s.StopTimeout)
		}
		if s.StopSignal < 1 || s.StopSignal > maxSignal {
			t.Errorf("service %s: stop signal %d", s.Name, s.StopSignal)
		}
		checkReadiness(t, s)
	}
	order := DependencyOrder(cfg.Services)
	if len(order) != len(cfg.Services) {
		t.Fatalf("DependencyOrder = %q for %d services", order, len(cfg.Services))
	}
	for _, s := range cfg.Services {
		at := slices.Index(order, s.Name)
		for _, dep := range s.DependsOn {
			if dep == s.Name || !names[dep] {
				t.Errorf("service %s depends on %q", s.Name, dep)
			} else if slices.Index(order, dep) > at {
				t.Errorf("DependencyOrder %q puts %s before its dependency %s", order, s.Name, dep)
			}
		}
	}
}

// checkReadiness checks the readiness, watchdog and liveness invariants of
// the package comment.
func checkReadiness(t *testing.T, s Service) {
	t.Helper()
	r := s.Ready
	if !target(r.Kind, r.URL, r.Address, r.Command) || r.Period <= 0 || r.Timeout <= 0 {
		t.Errorf("service %s: readiness %+v", s.Name, r)
	}
	if s.StartTimeout <= 0 || (s.Watchdog != 0 && s.Watchdog < 10*time.Millisecond) ||
		(s.NotifyAccess != NotifyMain && s.NotifyAccess != NotifyGroup) {
		t.Errorf("service %s: start_timeout %v, watchdog %v, notify_access %q", s.Name, s.StartTimeout, s.Watchdog, s.NotifyAccess)
	}
	if p := s.Liveness; p != nil {
		if p.Kind == ReadyStarted || p.Kind == ReadyNotify || !target(p.Kind, p.URL, p.Address, p.Command) ||
			p.Period <= 0 || p.Timeout <= 0 || p.FailureThreshold < 1 || p.InitialDelay < 0 {
			t.Errorf("service %s: liveness %+v", s.Name, *p)
		}
	}
}

// target reports whether a check of kind names exactly what it needs.
func target(kind ReadyKind, url, address string, command []string) bool {
	switch kind {
	case ReadyStarted, ReadyNotify:
		return url == "" && address == "" && command == nil
	case ReadyHTTP:
		u, err := neturl.Parse(url)
		return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Hostname() != "" && address == "" && command == nil
	case ReadyTCP:
		host, _, err := net.SplitHostPort(address)
		return err == nil && host != "" && url == "" && command == nil
	case ReadyExec:
		return len(command) > 0 && command[0] != "" && url == "" && address == ""
	}
	return false
}
