package supervisor

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vigil-dev/vigil/internal/config"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/notify"
	"github.com/vigil-dev/vigil/internal/policy"
)

// This file is the supervisor's side of "alive is not the same as working":
// readiness (started, sd_notify READY=1, or an http/tcp/exec check), the
// sd_notify watchdog, liveness probes, and the routing of sd_notify
// datagrams to the service whose process sent them.
//
// Heartbeats are cheap by design: a WATCHDOG=1 only records the time. One
// timer per watched instance fires at the earliest possible deadline and
// re-arms itself for the remainder when a heartbeat came in meanwhile, so a
// thousand services heartbeating cost no timer churn.

// CheckFunc runs one readiness or liveness check; nil means it passed.
type CheckFunc func(ctx context.Context, kind config.ReadyKind, url, address string, command []string, timeout time.Duration) error

// Notify routes one sd_notify datagram from pid. It is called from the
// notify server's goroutine and never blocks: the main pid of every
// instance is looked up in an index the loop keeps; any other sender is
// resolved to its process group (through Options.ProcessGroup), which for
// a service is its main pid.
//
// A plain heartbeat from a main process (the common case, thousands a
// second with many services) does not wake the loop at all: it stores the
// time in the instance's heartbeat cell, which the watchdog timer reads.
func (s *Supervisor) Notify(pid int, m notify.Message) {
	if v, ok := s.pids.Load(pid); ok {
		hb := v.(*heartbeat)
		if m.Watchdog && len(m.Assignments) == 1 {
			hb.last.Store(s.clock.Now().UnixNano())
			return
		}
		s.post(func() { s.notified(hb.service, pid, pid, m) })
		return
	}
	if s.pgidOf != nil {
		if pgid, ok := s.pgidOf(pid); ok {
			if v, ok := s.pids.Load(pgid); ok {
				s.post(func() { s.notified(v.(*heartbeat).service, pid, pgid, m) })
				return
			}
		}
	}
	s.notifyUnknown.Add(1)
}

// heartbeat is an instance's last WATCHDOG=1, shared between the notify
// goroutine (which writes it) and the loop (which reads it when a
// watchdog deadline comes).
type heartbeat struct {
	service string
	last    atomic.Int64 // unix nanoseconds
}

func (h *heartbeat) at() time.Time { return time.Unix(0, h.last.Load()) }

func (h *heartbeat) beat(t time.Time) { h.last.Store(t.UnixNano()) }

// NotifyDrops reports datagrams dropped by the supervisor: from a process
// of no service, and from a process other than the main one of a service
// with notify_access = "main".
func (s *Supervisor) NotifyDrops() (unknownSender, notMain uint64) {
	return s.notifyUnknown.Load(), s.notifyNotMain.Load()
}

// notified applies a datagram to the instance that sent it; pgid is the
// sender's process group, which is the instance's main pid.
func (s *Supervisor) notified(name string, pid, pgid int, m notify.Message) {
	svc, ok := s.services[name]
	if !ok || svc.inst == nil || svc.inst.pid != pgid {
		s.notifyUnknown.Add(1) // an instance that has since ended
		return
	}
	inst := svc.inst
	if svc.cfg.NotifyAccess == config.NotifyMain && pid != inst.pid && pid != inst.mainPID {
		s.notifyNotMain.Add(1)
		return
	}
	now := s.clock.Now()
	if m.Status != nil {
		svc.statusText = *m.Status
	}
	for _, id := range m.Leases {
		if !slices.Contains(inst.leases, id) {
			inst.leases = append(inst.leases, id)
		}
	}
	for _, id := range m.Releases {
		inst.leases = slices.DeleteFunc(inst.leases, func(l string) bool { return l == id })
	}
	if m.MainPID != 0 && m.MainPID != inst.mainPID {
		// Never trust a pid a child names: only one of its own processes
		// may become the main one.
		if inst.h.Owns(m.MainPID) {
			inst.mainPID = m.MainPID
		} else {
			s.log.Warn("ignored MAINPID= of a process outside the service", "service", name, "pid", m.MainPID)
		}
	}
	if m.HasWatchdogUSec {
		inst.watchdog = m.WatchdogUSec
		inst.hb.beat(now)
		s.armWatchdog(svc, inst)
	}
	if m.Watchdog {
		inst.hb.beat(now)
	}
	if m.HasExtendTimeout {
		s.extendTimeout(svc, inst, m.ExtendTimeout)
	}
	if m.Reloading {
		svc.ready = false
	}
	if m.Stopping {
		svc.reason = "service reported STOPPING=1"
	}
	if m.Ready {
		if svc.state == Starting && svc.cfg.Ready.Kind == config.ReadyNotify {
			s.becameReady(svc, inst)
		} else if svc.state == Running {
			svc.ready = true
		}
	}
	if m.WatchdogTrigger {
		s.hung(svc, inst, policy.ClassUnresponsive, "WATCHDOG=trigger")
	}
}

// afterSpawn starts the wait for readiness: at once for ready = "started",
// otherwise with a start timeout and, for http/tcp/exec, a polling check.
func (s *Supervisor) afterSpawn(svc *service, inst *instance) {
	inst.hb = &heartbeat{service: svc.cfg.Name}
	inst.hb.beat(inst.startedAt)
	s.pids.Store(inst.pid, inst.hb)
	inst.mainPID = inst.pid
	inst.watchdog = svc.cfg.Watchdog
	switch svc.cfg.Ready.Kind {
	case config.ReadyStarted, "":
		s.becameReady(svc, inst)
		return
	case config.ReadyNotify:
		s.move(svc, Starting, "waiting for READY=1")
	default:
		s.move(svc, Starting, "waiting for "+string(svc.cfg.Ready.Kind)+" readiness")
		s.pollReady(svc, inst)
	}
	s.armStartTimeout(svc, inst, svc.cfg.StartTimeout)
}

func (s *Supervisor) armStartTimeout(svc *service, inst *instance, d time.Duration) {
	stopTimer(&inst.startTimer)
	inst.startDeadline = s.clock.Now().Add(d)
	inst.startTimer = s.clock.AfterFunc(d, func() {
		s.post(func() {
			if svc.inst == inst && svc.state == Starting && !inst.stopRequested {
				s.failInstance(svc, inst, policy.ClassStartTimeout, "not ready within "+d.String())
			}
		})
	})
}

// extendTimeout is EXTEND_TIMEOUT_USEC=: the running start or stop timeout
// ends no earlier than d from now.
func (s *Supervisor) extendTimeout(svc *service, inst *instance, d time.Duration) {
	now := s.clock.Now()
	switch {
	case svc.state == Starting && inst.startTimer != nil:
		if now.Add(d).After(inst.startDeadline) {
			s.armStartTimeout(svc, inst, d)
		}
	case inst.killTimer != nil:
		if now.Add(d).After(inst.killDeadline) {
			s.armKill(svc, inst, d)
		}
	}
}

// pollReady runs the http/tcp/exec readiness check every period until it
// passes; the check itself runs off the loop.
func (s *Supervisor) pollReady(svc *service, inst *instance) {
	r := svc.cfg.Ready
	s.runCheck(r.Kind, r.URL, r.Address, r.Command, r.Timeout, func(err error) {
		if svc.inst != inst || svc.state != Starting || inst.stopRequested {
			return
		}
		if err == nil {
			s.becameReady(svc, inst)
			return
		}
		svc.reason = "not ready yet: " + err.Error()
		inst.checkTimer = s.clock.AfterFunc(r.Period, func() { s.post(func() { s.pollReady(svc, inst) }) })
	})
}

// runCheck runs one check on its own goroutine and hands the result to
// done on the loop.
func (s *Supervisor) runCheck(kind config.ReadyKind, url, addr string, cmd []string, timeout time.Duration, done func(error)) {
	if s.check == nil {
		done(nil)
		return
	}
	go func() {
		err := s.check(context.Background(), kind, url, addr, cmd, timeout)
		s.post(func() { done(err) })
		if s.checkPosted != nil {
			s.checkPosted()
		}
	}()
}

// becameReady makes a started instance Running and arms its watchdog and
// liveness probe.
func (s *Supervisor) becameReady(svc *service, inst *instance) { s.readyBecause(svc, inst, "") }

// readyBecause is becameReady with the reason the state change shows.
func (s *Supervisor) readyBecause(svc *service, inst *instance, reason string) {
	stopTimer(&inst.startTimer)
	stopTimer(&inst.checkTimer)
	svc.ready = true
	inst.hb.beat(s.clock.Now())
	s.move(svc, Running, reason)
	s.armWatchdog(svc, inst)
	if p := svc.cfg.Liveness; p != nil {
		inst.probeTimer = s.clock.AfterFunc(p.InitialDelay, func() { s.post(func() { s.probe(svc, inst) }) })
	}
	s.finishStarted(svc, nil)
	s.kick() // dependents may start now
}

// armWatchdog arms the instance's watchdog timer for the earliest moment
// two intervals can have passed since the last heartbeat.
func (s *Supervisor) armWatchdog(svc *service, inst *instance) {
	stopTimer(&inst.wdTimer)
	if inst.watchdog <= 0 || svc.state != Running {
		return
	}
	wait := inst.hb.at().Add(2 * inst.watchdog).Sub(s.clock.Now())
	inst.wdTimer = s.clock.AfterFunc(wait, func() {
		s.post(func() {
			if svc.inst != inst || inst.stopRequested || inst.failClass != "" {
				return
			}
			if s.clock.Now().Sub(inst.hb.at()) < 2*inst.watchdog {
				s.armWatchdog(svc, inst) // a heartbeat came: wait for the rest
				return
			}
			class := policy.ClassUnresponsive
			if !inst.h.Alive(inst.mainPID) {
				class = policy.ClassHeartbeatTimeout
			}
			s.hung(svc, inst, class, "no heartbeat for "+(2*inst.watchdog).String())
		})
	})
}

// probe runs one liveness check; failure_threshold failures in a row make
// the instance unresponsive.
func (s *Supervisor) probe(svc *service, inst *instance) {
	p := svc.cfg.Liveness
	s.runCheck(p.Kind, p.URL, p.Address, p.Command, p.Timeout, func(err error) {
		if svc.inst != inst || inst.stopRequested || inst.failClass != "" {
			return
		}
		if err == nil {
			inst.probeFailures = 0
		} else {
			inst.probeFailures++
			s.log.Warn("liveness probe failed", "service", svc.cfg.Name, "pid", inst.pid,
				"failures", inst.probeFailures, "err", err)
			if inst.probeFailures >= p.FailureThreshold {
				s.hung(svc, inst, policy.ClassUnresponsive,
					"liveness probe failed "+strconv.Itoa(inst.probeFailures)+" times: "+err.Error())
				return
			}
		}
		inst.probeTimer = s.clock.AfterFunc(p.Period, func() { s.post(func() { s.probe(svc, inst) }) })
	})
}

// hung ends an instance that is alive but not working (unresponsive: first
// SIGABRT to its main process, so a core or stack trace can be had, then
// SIGKILL to all of it after stop_timeout) or whose main process vanished
// without an exit we could see (heartbeat_timeout: killed at once).
func (s *Supervisor) hung(svc *service, inst *instance, class policy.Class, why string) {
	if inst.failClass != "" || inst.stopRequested {
		return
	}
	inst.failClass = class
	s.log.Warn("instance hung", "service", svc.cfg.Name, "pid", inst.pid, "class", class, "why", why)
	s.bus.Publish(event.Event{Time: s.clock.Now(), Topic: event.ServiceState, Service: svc.cfg.Name,
		State: string(svc.state), PID: inst.pid, Reason: string(class), Message: why})
	if class == policy.ClassHeartbeatTimeout {
		inst.h.KillAll()
		return
	}
	if err := inst.h.SignalMain(inst.mainPID, syscall.SIGABRT); err != nil {
		s.log.Warn("SIGABRT failed", "service", svc.cfg.Name, "pid", inst.mainPID, "err", err)
	}
	s.armKill(svc, inst, svc.cfg.StopTimeout)
}

// failInstance ends a start that did not become ready in time: the stop
// signal, then SIGKILL after stop_timeout; its exit counts as class.
func (s *Supervisor) failInstance(svc *service, inst *instance, class policy.Class, why string) {
	inst.failClass = class
	s.log.Warn("start failed", "service", svc.cfg.Name, "pid", inst.pid, "class", class, "why", why)
	if err := inst.h.Signal(svc.cfg.StopSignal); err != nil {
		s.log.Warn("stop signal failed", "service", svc.cfg.Name, "pid", inst.pid, "err", err)
	}
	s.armKill(svc, inst, svc.cfg.StopTimeout)
}

// armKill escalates to SIGKILL of the whole instance after d.
func (s *Supervisor) armKill(svc *service, inst *instance, d time.Duration) {
	stopTimer(&inst.killTimer)
	inst.killDeadline = s.clock.Now().Add(d)
	inst.killTimer = s.clock.AfterFunc(d, func() {
		s.post(func() {
			if svc.inst == inst {
				n := inst.h.KillAll()
				s.log.Warn("timeout: killed", "service", svc.cfg.Name, "pid", inst.pid, "count", n)
			}
		})
	})
}

// endTimers stops everything armed for an instance.
func (inst *instance) endTimers() {
	stopTimer(&inst.killTimer)
	stopTimer(&inst.startTimer)
	stopTimer(&inst.checkTimer)
	stopTimer(&inst.wdTimer)
	stopTimer(&inst.probeTimer)
}
