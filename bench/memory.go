package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/event"
	"github.com/vigil-dev/vigil/internal/journal"
)

// cpRuns is how many checkpoints the checkpoint scenario asks for.
const cpRuns = 50

// crashesScenario builds a journal of -records records (half of them
// crash records of 50 services, half state changes, as the daemon writes
// them) and times `vigil crashes` as a user runs it: a new process each
// time, reading the state dir with no daemon.
func crashesScenario(bin, dir string) error {
	state := filepath.Join(dir, ".vigil")
	if err := os.MkdirAll(state, 0o700); err != nil {
		return err
	}
	began := time.Now()
	if err := buildJournal(filepath.Join(state, "journal"), *records); err != nil {
		return err
	}
	var size int64
	filepath.Walk(filepath.Join(state, "journal"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			size += fi.Size()
		}
		return nil
	})
	kept := 0
	if _, err := (&journal.Reader{Dir: filepath.Join(state, "journal")}).Scan(func(journal.Record) bool { kept++; return true }); err != nil {
		return err
	}
	fmt.Printf("journal: %d records (%d asked for), %.0f MiB of segments, built in %s\n", kept, *records,
		float64(size)/(1<<20), time.Since(began).Round(time.Millisecond))
	for _, args := range [][]string{
		{"crashes", "-n", "20"},
		{"crashes", "svc-07", "-n", "20"},
		{"crashes", "-n", "20", "--json"},
		{"events", "-n", "20"},
	} {
		var ds []time.Duration
		for range 30 {
			cmd := exec.Command(bin, append([]string{"--state-dir", state}, args...)...)
			t0 := time.Now()
			out, err := cmd.Output()
			ds = append(ds, time.Since(t0))
			if err != nil {
				return fmt.Errorf("vigil %s: %w", strings.Join(args, " "), err)
			}
			if n := strings.Count(string(out), "\n"); n < 20 {
				return fmt.Errorf("vigil %s printed %d lines", strings.Join(args, " "), n)
			}
		}
		percentiles("vigil "+strings.Join(args, " ")+" (whole process)", ds)
	}
	return nil
}

func buildJournal(dir string, n int) error {
	j, err := journal.Open(journal.Options{Dir: dir, MaxTotal: 1 << 40}) // keep all n: no pruning
	if err != nil {
		return err
	}
	crashes := make([][]byte, 50)
	states := make([][]byte, 50)
	at := time.Now().Add(-time.Hour)
	for i := range crashes {
		name := fmt.Sprintf("svc-%02d", i)
		code := 0
		c := &apitype.Crash{Service: name, PID: 40000 + i, StartTime: 123456789, StartedAt: at,
			Exit:     apitype.Exit{Class: "signal", Signal: "SIGSEGV", CoreDumped: true, Code: &code, At: at.Add(5 * time.Minute)},
			UptimeMS: 300000, Restarts: 3, Action: "restart in 400ms", Leases: []string{"task-7"},
			Output: []string{"panic: runtime error: index out of range [5] with length 5", "", "goroutine 1 [running]:",
				"main.main()", "\t/src/worker/main.go:42 +0x1d", "exit status 2"}}
		if crashes[i], err = json.Marshal(event.Event{Time: at, Topic: event.CrashDetected, Service: name, PID: c.PID, Exit: &c.Exit, Crash: c}); err != nil {
			return err
		}
		if states[i], err = json.Marshal(event.Event{Time: at, Topic: event.ServiceState, Service: name, State: "running", From: "starting", PID: c.PID}); err != nil {
			return err
		}
	}
	for i := range n {
		typ, p := journal.TypeEvent, states[i/2%50]
		if i%2 == 0 {
			typ, p = journal.TypeCrash, crashes[i/2%50]
		}
		for {
			_, err := j.Append(typ, p, nil)
			if !errors.Is(err, journal.ErrBehind) {
				if err != nil {
					return err
				}
				break
			}
			if err := j.Sync(); err != nil {
				return err
			}
		}
	}
	return j.Close()
}

// checkpointScenario runs a daemon with -services services and has it
// write checkpoints on request; the daemon reports each write's duration
// (snapshot of the supervisor excluded: that is the event loop's, not the
// disk's) and size.
func checkpointScenario(bin, dir string) error {
	d, err := startDaemon(bin, dir, servicesTOML(*services, ""), nil)
	if err != nil {
		return err
	}
	defer d.down()
	if _, err := d.waitAllRunning(2 * time.Minute); err != nil {
		return err
	}
	var writes, calls []time.Duration
	var size int64
	for range cpRuns {
		t0 := time.Now()
		out, err := exec.Command(bin, "-c", d.config, "checkpoint", "now", "--json").Output()
		calls = append(calls, time.Since(t0))
		if err != nil {
			return fmt.Errorf("vigil checkpoint now: %w", err)
		}
		var info apitype.CheckpointInfo
		if err := json.Unmarshal(out, &info); err != nil {
			return err
		}
		writes = append(writes, time.Duration(info.DurationMS*float64(time.Millisecond)))
		size = info.Size
	}
	fmt.Printf("checkpoint of %d services: %d bytes\n", *services, size)
	percentiles(fmt.Sprintf("checkpoint write, %d services (daemon's own timing: encode, write, fsync, link, rename, fsync dir)", *services), writes)
	percentiles(fmt.Sprintf("vigil checkpoint now, %d services (whole CLI process)", *services), calls)
	return nil
}
