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
