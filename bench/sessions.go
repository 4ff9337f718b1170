package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/api/client"
	"github.com/vigil-dev/vigil/internal/proc"
)

// sessionsScenario times the session registry through the API on its unix
// socket: registering and ending (written to the journal before the
// answer, fsync'd in its next group commit), heartbeating (memory only),
// listing, and a cleanup over 1000 live sessions and over 1000 whose
// owners are dead.
func sessionsScenario(bin, dir string) error {
	d, err := startDaemon(bin, dir, "[sessions]\ncleanup_period = \"1h\"\nstale_after = \"1h\"\n[services.idle]\ncommand = [\"sleep\", \"100000\"]\n", nil)
	if err != nil {
		return err
	}
	defer d.down()
	c := &client.Client{SocketPath: filepath.Join(dir, ".vigil", "vigil.sock")}
	ctx := context.Background()
	self, err := proc.ReadIdentity(os.Getpid())
	if err != nil {
		return err
	}
	const n = 1000
	// The first requests to a fresh daemon from a fresh client are slower
	// (heaps, buffers and maps grow): they are measured apart, as the cold
	// round, and the registry's figures are taken warm, as a long-running
	// daemon answers them.
	var cold, coldEnd []time.Duration
	for i := range n {
		t0 := time.Now()
		s, err := c.RegisterSession(ctx, apitype.SessionRequest{Name: fmt.Sprint("w", i), PID: self.PID, StartTime: self.StartTime})
		cold = append(cold, time.Since(t0))
		if err != nil {
			return err
		}
		t0 = time.Now()
		if err := c.EndSession(ctx, s.ID); err != nil {
			return err
		}
		coldEnd = append(coldEnd, time.Since(t0))
	}
	percentiles("cold round: session register on a fresh daemon", cold)
	percentiles("cold round: session end on a fresh daemon", coldEnd)
	var reg, hb []time.Duration
	var ids []string
	for i := range n {
		t0 := time.Now()
		s, err := c.RegisterSession(ctx, apitype.SessionRequest{Name: fmt.Sprint("s", i), PID: self.PID, StartTime: self.StartTime})
		reg = append(reg, time.Since(t0))
		if err != nil {
			return err
		}
		ids = append(ids, s.ID)
	}
	for _, id := range ids {
		t0 := time.Now()
		if err := c.HeartbeatSession(ctx, id); err != nil {
			return err
		}
		hb = append(hb, time.Since(t0))
	}
	percentiles("session register (journaled: written before the answer)", reg)
	percentiles("session heartbeat", hb)
	t0 := time.Now()
	ss, err := c.Sessions(ctx)
	if err != nil || len(ss) != n {
		return fmt.Errorf("list: %d sessions, %v", len(ss), err)
	}
	fmt.Printf("session list of %d: %.3fms\n", n, ms(time.Since(t0)))
	var live []time.Duration
	for range 20 {
		res, err := c.Cleanup(ctx)
		if err != nil || len(res.Removed) != 0 {
			return fmt.Errorf("gc over live sessions: %+v, %v", res, err)
		}
		live = append(live, time.Duration(res.TookMS*float64(time.Millisecond)))
	}
	percentiles(fmt.Sprintf("cleanup cycle over %d live sessions (daemon's timing)", n), live)
	var end []time.Duration
	for _, id := range ids {
		t0 := time.Now()
		if err := c.EndSession(ctx, id); err != nil {
			return err
		}
		end = append(end, time.Since(t0))
	}
	percentiles("session end (journaled: written before the answer)", end)
	// Owners that died: the start time no longer matches.
	for i := range n {
		if _, err := c.RegisterSession(ctx, apitype.SessionRequest{Name: fmt.Sprint("d", i), PID: self.PID, StartTime: self.StartTime + 1}); err != nil {
			return err
		}
	}
	res, err := c.Cleanup(ctx)
	if err != nil || len(res.Removed) != n {
		return fmt.Errorf("gc over dead sessions removed %d, %v", len(res.Removed), err)
	}
	fmt.Printf("cleanup cycle removing %d dead sessions (journaled): %.3fms (daemon's timing)\n", n, res.TookMS)
	return nil
}

// hookScenario: a service that crashes every 200ms with an on_crash hook;
// the time from the kernel's exit of the crashed process to the exec of
// its hook, which waits for the crash record's fsync and runs off the
// event loop.
func hookScenario(bin, dir string) error {
	d, stop, err := startWatched(bin, dir, `
[services.crash]
command = ["/bin/false"]
restart = "always"
on_crash = ["/bin/sleep", "0.01"]
[services.crash.backoff]
initial = "200ms"
max = "200ms"
multiplier = 1
jitter = 0
[services.crash.crash_loop]
crashes = 0
`)
	if err != nil {
		return err
	}
	defer stop()
	comm := func(pid int) string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return string(b)
	}
	n := min(*samples, 60)
	var lat []time.Duration
	var lastExit uint64
	service := map[int]bool{}
	deadline := time.Now().Add(2 * time.Minute)
	for len(lat) < n && time.Now().Before(deadline) {
		e, err := d.next()
		if err != nil {
			return err
		}
		switch e.What {
		case procEventExec:
			if !d.children[e.PID] {
				continue
			}
			switch c := comm(e.PID); c {
			case "false\n":
				service[e.PID] = true
			case "sleep\n":
				if lastExit != 0 {
					lat = append(lat, time.Duration(e.TS-lastExit))
					lastExit = 0
				}
			}
		case procEventExit:
			if service[e.PID] {
				lastExit = e.TS
				delete(service, e.PID)
			}
		}
	}
	if len(lat) < n {
		return fmt.Errorf("only %d hook runs measured", len(lat))
	}
	percentiles("hook dispatch (crashed process exit → on_crash exec)", lat[5:])
	return nil
}
