// Package probe runs one health check — an HTTP GET, a TCP connect or a
// command — bounded by a timeout, and says whether it passed. Scheduling
// (periods, thresholds, initial delays, what a failure means) is the
// supervisor's job, not this package's.
//
// Checks behave as Kubernetes' probes do. HTTP passes on 2xx and 3xx; a
// redirect is not followed (it passes itself), certificates are not
// verified, at most 4 KiB of the body is read, and no connection outlives
// its check. TCP passes when a connection is accepted (and closed at once).
// A command passes when it exits 0. It runs directly, never through a
// shell, with stdin, stdout and stderr on /dev/null, in a process group of
// its own; that group is killed whole with SIGKILL when the check times out
// and again after the command exits, so neither a hung command nor what it
// left running in the background outlives its check. A process that moves
// to another group or session escapes this, as it would escape a stop.
//
// Every failure is an error with a one-line message naming the check
// ("probe: tcp 127.0.0.1:5432: connection refused"); one that ran out of
// time wraps ErrTimeout.
package probe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vigil-dev/vigil/internal/config"
)

// ErrTimeout is wrapped by the error of a check that did not finish within
// its timeout.
var ErrTimeout = errors.New("timed out")

// Spawner starts argv (argv[0] looked up in PATH when it has no slash) with
// stdin, stdout and stderr on /dev/null, in a new process group whose id is
// the returned pid. wait blocks until that process exits and returns its
// status; it is called exactly once.
//
// The daemon passes one backed by its reaper, the only component there
// allowed to wait for children: os/exec's Wait would race with it.
type Spawner func(argv []string) (pid int, wait func() (syscall.WaitStatus, error), err error)

// Checker runs checks. Its zero value starts commands with os/exec.
type Checker struct {
	// Spawn starts exec checks; nil means with os/exec, which is right
	// wherever nothing else waits for this process's children.
	Spawn Spawner
}

// Check runs one check with the zero Checker.
func Check(ctx context.Context, kind config.ReadyKind, url, address string, command []string, timeout time.Duration) error {
	return Checker{}.Check(ctx, kind, url, address, command, timeout)
}

// Check runs one check of kind — a GET of url, a connect to address, or
// command — and returns nil when it passes. It returns within about timeout,
// or sooner when ctx ends.
func (c Checker) Check(ctx context.Context, kind config.ReadyKind, url, address string, command []string, timeout time.Duration) error {
	var what string
	switch kind {
	case config.ReadyHTTP:
		what = url
	case config.ReadyTCP:
		what = "tcp " + address
	case config.ReadyExec:
		if len(command) == 0 {
			return errors.New("probe: exec: no command")
		}
		what = "exec " + command[0]
	default:
		return fmt.Errorf("probe: unknown check kind %q", kind)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, ErrTimeout)
	defer cancel()
	var err error
	switch kind {
	case config.ReadyHTTP:
		err = checkHTTP(ctx, url)
	case config.ReadyTCP:
		err = checkTCP(ctx, address)
	case config.ReadyExec:
		err = c.checkExec(ctx, command)
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() == nil:
		return fmt.Errorf("probe: %s: %w", what, err)
	case errors.Is(context.Cause(ctx), ErrTimeout):
		return fmt.Errorf("probe: %s: %w after %v", what, ErrTimeout, timeout)
	default: // the caller's ctx ended first
		return fmt.Errorf("probe: %s: %w", what, context.Cause(ctx))
	}
}

// maxBody is how much of a response body a check reads: enough for a
// server that writes a short status page and waits for it to be read,
// without letting one that streams forever hold the check to its timeout.
const maxBody = 4 << 10

// client opens a new connection for every check and closes it with the
// response body, and never follows redirects.
var client = &http.Client{
	Transport: &http.Transport{
		Proxy:             nil, // a health check goes to the service itself, never via $HTTP_PROXY
		DisableKeepAlives: true,
		// As Kubernetes' HTTPS probes: a health endpoint on localhost
		// commonly has a self-signed certificate, and the check asks
		// whether the service answers, not who it is.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	},
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
		var ue *neturl.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the method and URL
		}
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
	if resp.StatusCode < 200 || resp.StatusCode > 399 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func checkTCP(ctx context.Context, address string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return dialReason(err)
	}
	return conn.Close()
}

// dialReason shortens a dial error to its cause ("connection refused"),
// since the check's message already names the address.
func dialReason(err error) error {
	var se *os.SyscallError
	if errors.As(err, &se) {
		return se.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Err
	}
	return err
}

func (c Checker) checkExec(ctx context.Context, argv []string) error {
	spawn := c.Spawn
	if spawn == nil {
		spawn = execSpawn
	}
	pid, wait, err := spawn(argv)
	if err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() {
		ws, err := wait()
		if err == nil {
			err = exitReason(ws)
		}
		exited <- err
	}()
	select {
	case err = <-exited:
	case <-ctx.Done():
		_ = unix.Kill(-pid, unix.SIGKILL)
		err = <-exited
	}
	// Whatever the command left running in its group goes with it. While
	// any member is left the kernel keeps the group's id from being reused,
	// so this reaches only them; when none is left (ESRCH, the usual
	// answer), another group could take the id only if the pid space
	// wrapped around in the moment since the reap.
	_ = unix.Kill(-pid, unix.SIGKILL)
	return err
}

// exitReason is nil for exit status 0, else what ended the command.
func exitReason(ws syscall.WaitStatus) error {
	switch {
	case ws.Exited() && ws.ExitStatus() == 0:
		return nil
	case ws.Exited():
		return fmt.Errorf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		return fmt.Errorf("killed by %s", unix.SignalName(ws.Signal()))
	default:
		return fmt.Errorf("ended with wait status %#x", uint32(ws))
	}
}

// execSpawn is the Spawner of the zero Checker.
func execSpawn(argv []string) (int, func() (syscall.WaitStatus, error), error) {
	cmd := exec.Command(argv[0], argv[1:]...) // nil Stdin, Stdout and Stderr are /dev/null
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
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
