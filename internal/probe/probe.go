// Package probe runs one health check — an HTTP GET, a TCP connect or a
// command — bounded by a timeout, and says whether it passed. Scheduling
// (periods, thresholds, initial delays) is the supervisor's job, not this
// package's.
//
// HTTP passes on 2xx and 3xx (a redirect is not followed: it passes
// itself), as Kubernetes defines it. A command passes when it exits 0; it
// runs directly (never through a shell) in a process group of its own,
// which is killed whole on timeout, so a check never leaves a process
// behind.
package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/vigil-dev/vigil/internal/config"
)

// Spawner starts argv in a process group of its own (pgid = pid) and
// returns a wait function for its exit status. The daemon passes one backed
// by its reaper, the only component there allowed to wait for children.
type Spawner func(argv []string) (pid int, wait func() (syscall.WaitStatus, error), err error)

// Checker runs checks. Its zero value starts commands with os/exec.
type Checker struct {
	Spawn Spawner
}

// ErrTimeout is wrapped by the error of a check that did not finish in time.
var ErrTimeout = errors.New("timed out")

// Check runs one check of kind with the given target.
func Check(ctx context.Context, kind config.ReadyKind, url, address string, command []string, timeout time.Duration) error {
	return Checker{}.Check(ctx, kind, url, address, command, timeout)
}

// Check runs one check of kind with the given target, bounded by timeout.
func (c Checker) Check(ctx context.Context, kind config.ReadyKind, url, address string, command []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	var what string
	switch kind {
	case config.ReadyHTTP:
		what, err = url, checkHTTP(ctx, url)
	case config.ReadyTCP:
		what, err = "tcp "+address, checkTCP(ctx, address)
	case config.ReadyExec:
		what = "exec " + strings.Join(command, " ")
		err = c.checkExec(ctx, command)
	default:
		return fmt.Errorf("probe: unknown kind %q", kind)
	}
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrTimeout) || ctx.Err() != nil {
		return fmt.Errorf("probe: %s: %w after %v", what, ErrTimeout, timeout)
	}
	return fmt.Errorf("probe: %s: %w", what, err)
}

// client never reuses connections between checks and never follows
// redirects.
var client = &http.Client{
	Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
}

func checkHTTP(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "vigil-probe")
	resp, err := client.Do(req)
	if err != nil {
		var ue interface{ Unwrap() error }
		if errors.As(err, &ue) && ctx.Err() == nil {
			return ue.Unwrap()
		}
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 399 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func checkTCP(ctx context.Context, address string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) && ctx.Err() == nil {
			return oe.Err
		}
		return err
	}
	return conn.Close()
}

func (c Checker) checkExec(ctx context.Context, argv []string) error {
	if len(argv) == 0 {
		return errors.New("no command")
	}
	spawn := c.Spawn
	if spawn == nil {
		spawn = execSpawn
	}
	pid, wait, err := spawn(argv)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		ws, err := wait()
		switch {
		case err != nil:
			done <- err
		case ws.Exited() && ws.ExitStatus() == 0:
			done <- nil
		case ws.Exited():
			done <- fmt.Errorf("exit status %d", ws.ExitStatus())
		default:
			done <- fmt.Errorf("killed by %v", ws.Signal())
		}
	}()
	select {
	case err := <-done:
		syscall.Kill(-pid, syscall.SIGKILL) // whatever it left in its group
		return err
	case <-ctx.Done():
		syscall.Kill(-pid, syscall.SIGKILL)
		<-done
		return ErrTimeout
	}
}

// execSpawn starts argv with os/exec, for use outside the daemon.
func execSpawn(argv []string) (int, func() (syscall.WaitStatus, error), error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, nil, nil
	cmd.Env = os.Environ()
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	return cmd.Process.Pid, func() (syscall.WaitStatus, error) {
		err := cmd.Wait()
		if cmd.ProcessState == nil {
			return 0, err
		}
		return cmd.ProcessState.Sys().(syscall.WaitStatus), nil
	}, nil
}
