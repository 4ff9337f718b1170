package config

import (
	"fmt"
	"reflect"
	"slices"
)

// Equal reports whether s and o define the same service; reload restarts a
// service exactly when its definition is not Equal. Slices compare
// element-wise (nil equals empty) and their order counts.
func (s Service) Equal(o Service) bool {
	if !slices.Equal(s.Command, o.Command) || !slices.Equal(s.Env, o.Env) ||
		!slices.Equal(s.SuccessExit, o.SuccessExit) || !slices.Equal(s.DependsOn, o.DependsOn) {
		return false
	}
	s.Command, o.Command = nil, nil
	s.Env, o.Env = nil, nil
	// Hooks are read when they run, from the config of that moment: a
	// change to them is no reason to restart the service.
	s.OnCrash, o.OnCrash = nil, nil
	s.OnFailed, o.OnFailed = nil, nil
	s.HookTimeout, o.HookTimeout = 0, 0
	s.SuccessExit, o.SuccessExit = nil, nil
	s.DependsOn, o.DependsOn = nil, nil
	// The rest compares deeply, so a field added to Service later is
	// compared too without anyone remembering to list it here.
	return reflect.DeepEqual(s, o)
}

// DependencyOrder returns the services' names so that every service comes
// after the services it depends on; among services free to go next, the one
// earlier in services goes first. Start in this order, stop in reverse.
// Dependencies on names not in services are ignored, and services caught in
// a cycle (which Load rejects) follow in config order once nothing else can
// go, so every entry of services appears exactly once.
func DependencyOrder(services []Service) []string {
	unplaced := map[string]int{} // name → how many entries with it are not yet placed
	for _, s := range services {
		unplaced[s.Name]++
	}
	ready := func(s Service) bool {
		for _, dep := range s.DependsOn {
			if dep != s.Name && unplaced[dep] > 0 {
				return false
			}
		}
		return true
	}
	placed := make([]bool, len(services))
	order := make([]string, 0, len(services))
	for len(order) < len(services) {
		next := -1
		for i, s := range services {
			if !placed[i] && ready(s) {
				next = i
				break
			}
		}
		if next < 0 { // only cycles are left
			next = slices.Index(placed, false)
		}
		placed[next] = true
		unplaced[services[next].Name]--
		order = append(order, services[next].Name)
	}
	return order
}

// Lookup returns the service called name, or an error naming it with the
// closest existing name when one is close ("did you mean …?").
func (c *Config) Lookup(name string) (*Service, error) {
	names := make([]string, len(c.Services))
	for i := range c.Services {
		if c.Services[i].Name == name {
			return &c.Services[i], nil
		}
		names[i] = c.Services[i].Name
	}
	return nil, fmt.Errorf("unknown service %q%s", name, suggestion(name, names))
}
