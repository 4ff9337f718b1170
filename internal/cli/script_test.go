package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
	"github.com/vigil-dev/vigil/internal/api/apitype"
	"github.com/vigil-dev/vigil/internal/api/client"
)

// The test binary is also `vigil` inside the scripts.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"vigil": func() { os.Exit(Main()) }})
}

// TestScripts runs the end-to-end CLI scripts in testdata/script. Each
// script runs in its own directory; a daemon it starts is shut down when
// it ends, even when it fails.
func TestScripts(t *testing.T) {
	t.Parallel()
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		Setup: func(env *testscript.Env) error {
			sock := filepath.Join(env.WorkDir, ".vigil", "vigil.sock")
			env.Defer(func() { shutdown(sock) })
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"waitfor":      cmdWaitFor,
			"savepid":      cmdSavePID,
			"daemonpid":    cmdDaemonPID,
			"waitrestarts": cmdWaitRestarts,
			"nozombies":    cmdNoZombies,
			"waitdaemon":   cmdWaitDaemon,
			"guardianpid":  cmdGuardianPID,
			"waitgone":     cmdWaitGone,
			"strays":       cmdStrays,
			"waitsession":  cmdWaitSession,
			"waitfile":     cmdWaitFile,
		},
	})
}

func shutdown(sock string) {
	c := &client.Client{SocketPath: sock}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c.Shutdown(ctx) != nil {
		return
	}
	for c.Ping(ctx) == nil && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
}

func scriptClient(ts *testscript.TestScript) *client.Client {
	return &client.Client{SocketPath: filepath.Join(ts.Getenv("WORK"), ".vigil", "vigil.sock")}
}

func service(ts *testscript.TestScript, name string) (apitype.Service, error) {
	st, err := scriptClient(ts).Status(context.Background())
	if err != nil {
		return apitype.Service{}, err
	}
	for _, s := range st.Services {
		if s.Name == name {
			return s, nil
		}
	}
	return apitype.Service{}, fmt.Errorf("no service %q", name)
}

// waitfor NAME STATE [TIMEOUT]: wait until the service is in STATE.
func cmdWaitFor(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 || len(args) > 3 {
		ts.Fatalf("usage: waitfor NAME STATE [TIMEOUT]")
	}
	timeout := 10 * time.Second
	if len(args) == 3 {
		d, err := time.ParseDuration(args[2])
		ts.Check(err)
		timeout = d
	}
	deadline := time.Now().Add(timeout)
	for {
		s, err := service(ts, args[0])
		if err == nil && s.State == args[1] {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s not %s within %v (last: %+v, err %v)", args[0], args[1], timeout, s, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// savepid NAME VAR: put the service's pid in $VAR; `! savepid` fails unless it has none.
func cmdSavePID(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: savepid NAME VAR")
	}
	s, err := service(ts, args[0])
	ts.Check(err)
	if s.PID == 0 && !neg {
		ts.Fatalf("%s has no pid", args[0])
	}
	ts.Setenv(args[1], strconv.Itoa(s.PID))
}

// daemonpid VAR: put the daemon's pid in $VAR.
func cmdDaemonPID(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: daemonpid VAR")
	}
	st, err := scriptClient(ts).Status(context.Background())
	ts.Check(err)
	ts.Setenv(args[0], strconv.Itoa(st.Daemon.PID))
}

// waitrestarts NAME N [TIMEOUT]: wait until the service has restarted N times.
func cmdWaitRestarts(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: waitrestarts NAME N [TIMEOUT]")
	}
	n, err := strconv.Atoi(args[1])
	ts.Check(err)
	timeout := 30 * time.Second
	if len(args) == 3 {
		timeout, err = time.ParseDuration(args[2])
		ts.Check(err)
	}
	deadline := time.Now().Add(timeout)
	for {
		s, err := service(ts, args[0])
		if err == nil && s.Restarts >= n {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s restarted %d times within %v, want %d", args[0], s.Restarts, timeout, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// nozombies: the daemon has no zombie children that stay zombies (one may
// be between its exit and its reaping for a moment).
func cmdNoZombies(ts *testscript.TestScript, neg bool, args []string) {
	st, err := scriptClient(ts).Status(context.Background())
	ts.Check(err)
	deadline := time.Now().Add(2 * time.Second)
	for {
		z := zombieChildren(st.Daemon.PID)
		if len(z) == 0 {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("zombies under the daemon (pid %d): %v", st.Daemon.PID, z)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func zombieChildren(parent int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+2:])
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(parent) {
			out = append(out, pid)
		}
	}
	return out
}

// waitdaemon OLDPID [TIMEOUT]: wait until a daemon other than OLDPID
// answers with its recovery live.
func cmdWaitDaemon(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 || len(args) > 2 {
		ts.Fatalf("usage: waitdaemon OLDPID [TIMEOUT]")
	}
	timeout := 30 * time.Second
	if len(args) == 2 {
		var err error
		timeout, err = time.ParseDuration(args[1])
		ts.Check(err)
	}
	deadline := time.Now().Add(timeout)
	for {
		st, err := scriptClient(ts).Status(context.Background())
		if err == nil && strconv.Itoa(st.Daemon.PID) != args[0] && st.Daemon.RecoveryStage == "live" {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("no new daemon live within %v (last: %+v, %v)", timeout, st.Daemon, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// guardianpid VAR: put the guardian's pid (the daemon's parent) in $VAR.
func cmdGuardianPID(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: guardianpid VAR")
	}
	st, err := scriptClient(ts).Status(context.Background())
	ts.Check(err)
	ppid, ok := statField(st.Daemon.PID, 1)
	if !ok {
		ts.Fatalf("no /proc/%d/stat", st.Daemon.PID)
	}
	ts.Setenv(args[0], ppid)
}

// waitgone PID...: wait until none of the pids runs (zombies count as gone).
func cmdWaitGone(ts *testscript.TestScript, neg bool, args []string) {
	deadline := time.Now().Add(30 * time.Second)
	for _, a := range args {
		pid, err := strconv.Atoi(a)
		ts.Check(err)
		for {
			state, ok := statField(pid, 0)
			if !ok || state == "Z" {
				break
			}
			if time.Now().After(deadline) {
				ts.Fatalf("pid %d still runs", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// strays: every live process of this project's services is the instance
// status shows, and no zombie waits under the daemon or its guardian.
// With no daemon answering, no process of the project may be left at all.
func cmdStrays(ts *testscript.TestScript, neg bool, args []string) {
	want := map[int]string{}
	st, err := scriptClient(ts).Status(context.Background())
	if err == nil {
		for _, s := range st.Services {
			if s.PID != 0 {
				want[s.PID] = s.Name
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var bad []string
		for pid, svc := range projectProcs(ts.Getenv("WORK")) {
			if want[pid] != svc {
				bad = append(bad, fmt.Sprintf("%s pid %d", svc, pid))
			}
		}
		if err == nil {
			parent, _ := statField(st.Daemon.PID, 1)
			gpid, _ := strconv.Atoi(parent)
			for _, z := range append(zombieChildren(st.Daemon.PID), zombieChildren(gpid)...) {
				bad = append(bad, fmt.Sprintf("zombie %d", z))
			}
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("strays: %v", bad)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// projectProcs maps the live processes started for the project in work
// to their service.
func projectProcs(work string) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, ok := statField(pid, 0); !ok || state == "Z" {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		env := "\x00" + string(b)
		if !strings.Contains(env, "\x00WORK="+work+"\x00") {
			continue
		}
		if i := strings.Index(env, "\x00VIGIL_SERVICE="); i >= 0 {
			name, _, _ := strings.Cut(env[i+len("\x00VIGIL_SERVICE="):], "\x00")
			out[pid] = name
		}
	}
	return out
}

// statField returns field n (0: state, 1: ppid) of /proc/PID/stat.
func statField(pid, n int) (string, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", false
	}
	f := strings.Fields(s[i+2:])
	if len(f) <= n {
		return "", false
	}
	return f[n], true
}

// waitsession NAME: wait until a session called NAME is registered.
func cmdWaitSession(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitsession NAME")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ss, err := scriptClient(ts).Sessions(context.Background())
		for _, s := range ss {
			if s.Name == args[0] {
				return
			}
		}
		if time.Now().After(deadline) {
			ts.Fatalf("no session %q within 10s (%v)", args[0], err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitfile FILE: wait until FILE exists and is not empty.
func cmdWaitFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitfile FILE")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(ts.MkAbs(args[0])); err == nil && len(b) > 0 {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s not written within 10s", args[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
