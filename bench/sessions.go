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
// socket: registering (journaled and fsync'd before the answer),
// heartbeating (memory only), listing, and a cleanup over 1000 live
// sessions and over 1000 whose owners are dead.
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
	percentiles("session register (durable: journaled + fsync before the answer)", reg)
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
	for _, id := range ids {
		if err := c.EndSession(ctx, id); err != nil {
			return err
		}
	}
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
