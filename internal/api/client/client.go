// Package client talks to a vigil daemon's control API over its unix
// socket. Its errors are *apitype.Error values, so callers test them with
// errors.Is(err, apitype.ErrNotFound) and never by text.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"syscall"

	"github.com/vigil-dev/vigil/internal/api/apitype"
)

// Client is a daemon's API client. Its zero value with SocketPath set works.
type Client struct {
	SocketPath string

	once sync.Once
	hc   *http.Client
}

func (c *Client) httpClient() *http.Client {
	c.once.Do(func() {
		c.hc = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", c.SocketPath)
			},
		}}
	})
	return c.hc
}

func (c *Client) do(ctx context.Context, method, path string, out any) error {
	return c.doBody(ctx, method, path, nil, out)
}

func (c *Client) doBody(ctx context.Context, method, path string, in []byte, out any) error {
	var reqBody io.Reader
	if in != nil {
		reqBody = bytes.NewReader(in)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://vigil"+path, reqBody)
	if err != nil {
		return err
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return c.dialError(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return apitype.Errorf(apitype.CodeUnavailable, "reading the daemon's answer: %v", err)
	}
	if resp.StatusCode/100 != 2 {
		var ae apitype.Error
		if json.Unmarshal(body, &ae) != nil || ae.Code == "" {
			return apitype.Errorf(apitype.CodeInternal, "daemon answered %s", resp.Status)
		}
		return &ae
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return apitype.Errorf(apitype.CodeInternal, "decoding the daemon's answer: %v", err)
		}
	}
	return nil
}

func (c *Client) dialError(err error) error {
	switch {
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ECONNREFUSED):
		return apitype.Errorf(apitype.CodeUnavailable, "daemon is not running (no socket at %s)", c.SocketPath)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return apitype.Errorf(apitype.CodePermissionDenied, "permission denied on %s: the daemon belongs to another user", c.SocketPath)
	}
	// The server closes connections from other users unanswered, which
	// reaches us in several shapes (EOF, reset, broken pipe, a closed idle
	// connection). The socket's owner is the daemon's user, so ask it
	// rather than guess from the shape.
	if owner, ok := socketOwner(c.SocketPath); ok && owner != os.Geteuid() && os.Geteuid() != 0 {
		return apitype.Errorf(apitype.CodePermissionDenied, "the daemon at %s refused us: it belongs to another user (uid %d)", c.SocketPath, owner)
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) {
		return apitype.Errorf(apitype.CodeUnavailable, "the daemon at %s closed the connection before answering", c.SocketPath)
	}
	return apitype.Errorf(apitype.CodeUnavailable, "talking to the daemon at %s: %v", c.SocketPath, err)
}

func socketOwner(path string) (int, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

// Ping reports whether the daemon answers.
func (c *Client) Ping(ctx context.Context) error { return c.do(ctx, "GET", "/v1/ping", nil) }

// Status returns the daemon's and every service's status.
func (c *Client) Status(ctx context.Context) (apitype.Status, error) {
	var st apitype.Status
	err := c.do(ctx, "GET", "/v1/status", &st)
	return st, err
}

func (c *Client) service(ctx context.Context, name, verb string) error {
	return c.do(ctx, "POST", fmt.Sprintf("/v1/services/%s/%s", url.PathEscape(name), verb), nil)
}

// Start starts a service.
func (c *Client) Start(ctx context.Context, name string) error { return c.service(ctx, name, "start") }

// Stop stops a service and returns once it has stopped.
func (c *Client) Stop(ctx context.Context, name string) error { return c.service(ctx, name, "stop") }

// Restart restarts a service (planned: not counted as a crash).
func (c *Client) Restart(ctx context.Context, name string) error {
	return c.service(ctx, name, "restart")
}

// Reset closes a service's crash-loop breaker and starts it again.
func (c *Client) Reset(ctx context.Context, name string) error { return c.service(ctx, name, "reset") }

// Reload makes the daemon re-read its config.
func (c *Client) Reload(ctx context.Context) (apitype.ReloadResult, error) {
	var res apitype.ReloadResult
	err := c.do(ctx, "POST", "/v1/reload", &res)
	return res, err
}

// Shutdown asks the daemon to stop every service and exit.
func (c *Client) Shutdown(ctx context.Context) error { return c.do(ctx, "POST", "/v1/shutdown", nil) }

// Checkpoint has the daemon write a checkpoint now and says what it wrote.
func (c *Client) Checkpoint(ctx context.Context) (apitype.CheckpointInfo, error) {
	var out apitype.CheckpointInfo
	err := c.do(ctx, "POST", "/v1/checkpoint", &out)
	return out, err
}

// SetState stores a service's own state (a JSON value; null clears it)
// in every checkpoint from now on.
func (c *Client) SetState(ctx context.Context, name string, state []byte) error {
	return c.doBody(ctx, "PUT", "/v1/services/"+url.PathEscape(name)+"/state", state, nil)
}

// Recovery returns the daemon's own recovery state.
func (c *Client) Recovery(ctx context.Context) (apitype.Recovery, error) {
	var out apitype.Recovery
	err := c.do(ctx, "GET", "/v1/recovery", &out)
	return out, err
}

// RetryRecovery resumes a recovery whose stage failed and returns where it ended.
func (c *Client) RetryRecovery(ctx context.Context) (apitype.Recovery, error) {
	var out apitype.Recovery
	err := c.do(ctx, "POST", "/v1/recovery/retry", &out)
	return out, err
}

// SetSafeMode enters (on) or leaves safe mode.
func (c *Client) SetSafeMode(ctx context.Context, on bool) error {
	verb := "exit"
	if on {
		verb = "enter"
	}
	return c.do(ctx, "POST", "/v1/safe-mode/"+verb, nil)
}

// RegisterSession registers an external session and returns it with its ID.
func (c *Client) RegisterSession(ctx context.Context, req apitype.SessionRequest) (apitype.Session, error) {
	var out apitype.Session
	body, err := json.Marshal(req)
	if err != nil {
		return out, err
	}
	err = c.doBody(ctx, "POST", "/v1/sessions", body, &out)
	return out, err
}

// HeartbeatSession tells the daemon the session's owner is alive.
func (c *Client) HeartbeatSession(ctx context.Context, id string) error {
	return c.do(ctx, "POST", "/v1/sessions/"+url.PathEscape(id)+"/heartbeat", nil)
}

// EndSession ends a session; what it owned is its owner's business.
func (c *Client) EndSession(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/sessions/"+url.PathEscape(id), nil)
}

// Sessions lists the registered sessions.
func (c *Client) Sessions(ctx context.Context) ([]apitype.Session, error) {
	var out []apitype.Session
	err := c.do(ctx, "GET", "/v1/sessions", &out)
	return out, err
}

// Cleanup runs a cleanup of dead and stale sessions now (`vigil gc`).
func (c *Client) Cleanup(ctx context.Context) (apitype.Cleanup, error) {
	var out apitype.Cleanup
	err := c.do(ctx, "POST", "/v1/gc", &out)
	return out, err
}
