package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// notifyScenario measures, with N services under a watchdog:
//   - sd_notify datagrams processed per second while every service
//     heartbeats as fast as the machine allows (the bench, as root, sends
//     WATCHDOG=1 with each service's pid in SCM_CREDENTIALS), and the
//     daemon's CPU use meanwhile;
//   - watchdog precision: the services (sleep, which never heartbeats) are
//     aborted when two intervals have passed since they started; the
//     lateness is the kernel's exit timestamp minus (exec + 2 × interval);
//   - the daemon's RSS with watched services against unwatched ones.
func notifyScenario(bin, dir string) error {
	var rlim unix.Rlimit // no core files from the aborted sleeps
	_ = unix.Setrlimit(unix.RLIMIT_CORE, &rlim)

	// Throughput: a long watchdog, so nothing fires during the blast.
	d, err := startDaemon(bin, filepath.Join(dir, "rate"), servicesTOML(*services, "watchdog = \"60s\""), nil)
	if err != nil {
		return err
	}
	st, err := d.waitAllRunning(2 * time.Minute)
	if err != nil {
		return err
	}
	var oobs [][]byte // SCM_CREDENTIALS naming each service's main pid
	for _, s := range st.Services {
		oobs = append(oobs, unix.UnixCredentials(&unix.Ucred{Pid: int32(s.PID)}))
	}
	sock := st.Daemon.Notify.Socket
	before := st.Daemon.Notify.Accepted
	c0 := cpuNS(d.pid)
	var sent atomic.Uint64
	blast := 5 * time.Second
	deadline := time.Now().Add(blast)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return
			}
			defer unix.Close(fd)
			to := &unix.SockaddrUnix{Name: sock}
			msg := []byte("WATCHDOG=1")
			n := uint64(0)
			for i := w; ; i += 4 {
				if n%1024 == 0 && !time.Now().Before(deadline) {
					break
				}
				if unix.Sendmsg(fd, msg, oobs[i%len(oobs)], to, 0) == nil {
					n++
				}
			}
			sent.Add(n)
		}(w)
	}
	wg.Wait()
	c1 := cpuNS(d.pid)
	time.Sleep(200 * time.Millisecond) // let the queue drain
	st, err = d.status()
	if err != nil {
		return err
	}
	accepted := st.Daemon.Notify.Accepted - before
	fmt.Printf("notify: %d services heartbeating, %.0f datagrams/s accepted (%d sent, %d accepted in %v), daemon CPU %.2f cores, dropped %v\n",
		*services, float64(accepted)/blast.Seconds(), sent.Load(), accepted, blast,
		float64(c1-c0)/float64(blast.Nanoseconds()), st.Daemon.Notify.Dropped)
	watchedRSS, _ := smaps(d.pid)
	if err := d.down(); err != nil {
		return err
	}

	// RSS of the same services without a watchdog.
	d, err = startDaemon(bin, filepath.Join(dir, "plain"), servicesTOML(*services, ""), nil)
	if err != nil {
		return err
	}
	if _, err := d.waitAllRunning(2 * time.Minute); err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	plainRSS, _ := smaps(d.pid)
	if err := d.down(); err != nil {
		return err
	}
	fmt.Printf("notify: daemon RSS with %d watched services %.1f MB, unwatched %.1f MB: %.2f KB per watched service (after heartbeat traffic)\n",
		*services, float64(watchedRSS)/1024, float64(plainRSS)/1024, float64(watchedRSS-plainRSS)/float64(*services))

	// Precision: sleeps under a 1s watchdog, never heartbeating.
	ev, err := openProcEvents()
	if err != nil {
		return err
	}
	defer ev.Close()
	interval := time.Second
	d, err = startDaemon(bin, filepath.Join(dir, "precision"),
		servicesTOML(*services, "watchdog = \"1s\"\nrestart = \"never\"\nstop_timeout = \"5s\""), ev)
	if err != nil {
		return err
	}
	defer d.down()
	execAt := map[int]uint64{}
	var late []time.Duration
	end := time.Now().Add(30 * time.Second)
	for len(late) < *services && time.Now().Before(end) {
		e, err := d.next()
		if err != nil {
			return err
		}
		switch e.What {
		case procEventExec:
			if d.children[e.PID] {
				execAt[e.PID] = e.TS
			}
		case procEventExit:
			if t, ok := execAt[e.PID]; ok {
				late = append(late, time.Duration(e.TS-t)-2*interval)
				delete(execAt, e.PID)
			}
		}
	}
	if len(late) < *services {
		return fmt.Errorf("only %d of %d watchdogs fired", len(late), *services)
	}
	slices.Sort(late)
	fmt.Printf("watchdog: %d services, interval %v: fired after 2×interval + p50 %.1fms, p99 %.1fms, max %.1fms (min %.1fms)\n",
		len(late), interval, ms(late[len(late)/2]), ms(late[len(late)*99/100]), ms(late[len(late)-1]), ms(late[0]))
	return nil
}

func servicesTOML(n int, extra string) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "[services.s%04d]\ncommand = [\"sleep\", \"100000\"]\n%s\n", i, extra)
	}
	return b.String()
}
