package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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
			"waitfor": cmdWaitFor,
			"savepid": cmdSavePID,
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
