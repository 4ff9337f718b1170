package supervisor

import (
	"slices"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/checkpoint"
	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/policy"
)

// Recovery after the daemon's own crash: the daemon restores what the last
// checkpoint kept, adopts the instances that survived, and only then calls
// StartAll for the rest. Both run on the loop like every other change.

// reasonAdopted is the reason of the state change that adopts an instance.
const reasonAdopted = "adopted"

// Restore gives services the state the checkpoint kept: breaker and
// backoff, restart count, what the operator wanted, their blobs. A service
// the operator had stopped stays stopped through StartAll; one whose
// breaker was open is failed again (with its cooldown, if it has one).
// Services the config no longer has are ignored.
func (s *Supervisor) Restore(saved []checkpoint.Service) {
	_ = s.call(func(done func(error)) {
		for _, cs := range saved {
			svc, ok := s.services[cs.Name]
			if !ok || svc.removed || svc.state != Stopped || svc.inst != nil {
				continue
			}
			svc.tracker = cs.Tracker
			svc.tracker.Crashes = slices.Clone(cs.Tracker.Crashes)
			svc.restarts = cs.Restarts
			svc.blob = slices.Clone([]byte(cs.Blob))
			svc.held = cs.Desired == checkpoint.DesiredStopped
			if svc.tracker.Breaker == policy.BreakerOpen {
				s.failed(svc, policy.ReasonManualActionRequired)
			}
		}
		done(nil)
	})
}

// Adopt makes ref, a live instance of name that the previous daemon
// started, the service's running instance without starting anything. Its
// watchdog counts from now, as if a heartbeat had just come (the grace
// period: the instance could not reach the dead daemon); one that was not
// ready yet gets a fresh start timeout. Its exit, once it comes, has no
// status unless the guardian reaped it (see Exit.Lost).
func (s *Supervisor) Adopt(name string, ref checkpoint.Instance) error {
	return s.call(func(done func(error)) {
		svc, err := s.lookup(name)
		if err != nil {
			done(err)
			return
		}
		if svc.inst != nil || svc.state != Stopped {
			done(apitype.Errorf(apitype.CodeFailedPrecondition, "%s is %s: nothing to adopt into", name, svc.state))
			return
		}
		inst := &instance{startedAt: ref.StartedAt, leases: append([]string{}, ref.Leases...)}
		h, err := s.runner.Adopt(&svc.cfg, ref, func(e Exit) {
			s.post(func() { s.exited(svc, inst, e) })
		})
		if err != nil {
			done(err)
			return
		}
		inst.h, inst.pid = h, ref.PID
		svc.inst = inst
		svc.want, svc.held = true, false
		now := s.clock.Now()
		inst.hb = &heartbeat{service: svc.cfg.Name}
		inst.hb.beat(now)
		s.pids.Store(inst.pid, inst.hb)
		inst.mainPID = inst.pid
		if ref.MainPID != 0 {
			inst.mainPID = ref.MainPID
		}
		inst.watchdog = svc.cfg.Watchdog
		s.move(svc, Starting, reasonAdopted)
		if ref.Ready || svc.cfg.Ready.Kind == config.ReadyStarted || svc.cfg.Ready.Kind == "" {
			s.readyBecause(svc, inst, reasonAdopted)
		} else {
			svc.reason = reasonAdopted + ", waiting for " + string(svc.cfg.Ready.Kind) + " readiness"
			if svc.cfg.Ready.Kind != config.ReadyNotify {
				s.pollReady(svc, inst)
			}
			s.armStartTimeout(svc, inst, svc.cfg.StartTimeout)
		}
		s.log.Info("adopted", "service", name, "pid", inst.pid)
		if s.safeMode && !svc.cfg.Essential && !s.neededByEssential(svc) {
			// Safe mode runs essential services only, survivors included.
			svc.want = false
			s.stop(svc)
		}
		done(nil)
	})
}

// SetSafeMode enters or leaves safe mode, in which only essential services
// (and what they depend on) run: entering stops every other service,
// leaving starts again those that start on their own, in dependency order.
// why is recorded with the event.
func (s *Supervisor) SetSafeMode(on bool, why string) error {
	return s.call(func(done func(error)) {
		if s.safeMode == on {
			done(nil)
			return
		}
		s.safeMode = on
		topic := event.SafeModeExited
		if on {
			topic = event.SafeModeEntered
			for _, name := range s.order {
				svc := s.services[name]
				if !svc.cfg.Essential && !s.neededByEssential(svc) {
					svc.want = false
					s.stop(svc)
				}
			}
		} else {
			for _, name := range s.order {
				svc := s.services[name]
				if svc.cfg.Autostart && !svc.held && !svc.removed && (svc.state == Stopped || svc.state == Exited) {
					s.want(svc)
				}
			}
			s.kick()
		}
		s.log.Warn("safe mode", "on", on, "why", why)
		s.bus.Publish(event.Event{Time: s.clock.Now(), Topic: topic, Message: why})
		done(nil)
	})
}

// SafeMode reports whether only essential services run.
func (s *Supervisor) SafeMode() bool {
	var on bool
	_ = s.call(func(done func(error)) { on = s.safeMode; done(nil) })
	return on
}

// neededByEssential reports whether an essential service depends on svc,
// directly or through others: it must keep running in safe mode.
func (s *Supervisor) neededByEssential(svc *service) bool {
	seen := map[string]bool{}
	var need func(name string) bool
	need = func(name string) bool {
		for _, d := range s.dependents[name] {
			if seen[d] {
				continue
			}
			seen[d] = true
			if dep := s.services[d]; dep != nil && (dep.cfg.Essential || need(d)) {
				return true
			}
		}
		return false
	}
	return need(svc.cfg.Name)
}

// Answers reports whether the loop runs an event within d. The daemon's
// heartbeat to its guardian is sent only while it does, so a wedged loop
// looks to the guardian like the dead daemon it effectively is.
func (s *Supervisor) Answers(d time.Duration) bool {
	ran := make(chan struct{})
	expired := make(chan struct{})
	t := s.clock.AfterFunc(d, func() { close(expired) })
	defer t.Stop()
	s.post(func() { close(ran) })
	select {
	case <-ran:
		return true
	case <-expired:
		return false
	}
}
