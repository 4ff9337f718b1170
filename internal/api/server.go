// Package api serves vigil's control API: HTTP/JSON under /v1/ on a unix
// socket that only the daemon's own user (or root) may use.
//
// Every answer is JSON: the wire structs of package apitype on success, an
// apitype.Error on failure, with the HTTP status derived from its code. The
// package holds no supervisor state; it calls a Controller.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/vigil-dev/vigil/internal/api/apitype"
	"golang.org/x/sys/unix"
)

// Controller is what the API operates; the daemon implements it on top of
// the supervisor. Every method is safe for concurrent use.
type Controller interface {
	Status() apitype.Status
	Start(name string) error
	Stop(name string) error    // returns once the service has stopped
	Restart(name string) error // planned; returns once the new instance is spawned
	Reset(name string) error   // close the breaker and start again
	Reload() (apitype.ReloadResult, error)
	Shutdown() // begin a graceful shutdown of the daemon; returns at once
	// Checkpoint writes a checkpoint now.
	Checkpoint(ctx context.Context) (apitype.CheckpointInfo, error)
	// SetState stores a service's own state blob (JSON) for the checkpoint.
	SetState(name string, state []byte) error
	// Recovery is the daemon's own recovery state; RetryRecovery resumes
	// a recovery whose stage failed.
	Recovery() (apitype.Recovery, error)
	RetryRecovery(ctx context.Context) (apitype.Recovery, error)
	// SetSafeMode enters (on) or leaves safe mode: essential services only.
	SetSafeMode(on bool) error
	// The session registry and its cleanup.
	RegisterSession(req apitype.SessionRequest) (apitype.Session, error)
	HeartbeatSession(id string) error
	EndSession(id string) error
	Sessions() []apitype.Session
	Cleanup(ctx context.Context) (apitype.Cleanup, error)
}

// Listen creates the control socket at path with mode 0600. The caller holds
// the daemon lock, so a socket already there is stale and is replaced; any
// other kind of file (a symlink above all) is refused. The socket is bound
// inside the 0700 state dir, so the moment between bind and chmod exposes
// nothing. Serve adds the peer-credential check to whatever it is given.
func Listen(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("api: %s is %s, not a socket: refusing to replace it", path, fileKind(fi.Mode()))
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("api: removing stale socket: %w", err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("api: %w", err)
	}
	return l, nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "a symlink"
	case m.IsDir():
		return "a directory"
	case m.IsRegular():
		return "a regular file"
	}
	return "a file of type " + m.Type().String()
}

// peerListener accepts only unix connections whose peer (SO_PEERCRED) is
// our own user or root, and closes every other one. The socket's 0600 mode
// already says so; this holds even if the mode is loosened by hand, and for
// any listener handed to Serve, not only one made by Listen.
type peerListener struct {
	net.Listener
	uid int
	log *slog.Logger
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(c)
		if err == nil && (uid == l.uid || uid == 0) {
			return c, nil
		}
		l.log.Warn("api: refused a connection from another user", "uid", uid, "err", err)
		c.Close()
	}
}

func peerUID(c net.Conn) (int, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return -1, errors.New("api: not a unix connection")
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return -1, err
	}
	if cerr != nil {
		return -1, cerr
	}
	return int(cred.Uid), nil
}

// maxStateBody bounds a service state upload; the supervisor's own limit
// is lower and gives the clear error.
const maxStateBody = 1 << 20

// Server answers the API.
type Server struct {
	c   Controller
	log *slog.Logger
	srv *http.Server
}

// NewServer returns a server for c; logger may be nil.
func NewServer(c Controller, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Server{c: c, log: logger}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/ping", func(w http.ResponseWriter, r *http.Request) { reply(w, map[string]bool{"ok": true}, nil) })
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { reply(w, c.Status(), nil) })
	for verb, f := range map[string]func(string) error{
		"start": c.Start, "stop": c.Stop, "restart": c.Restart, "reset": c.Reset,
	} {
		mux.HandleFunc("POST /v1/services/{name}/"+verb, func(w http.ResponseWriter, r *http.Request) {
			name := r.PathValue("name")
			err := f(name)
			if err == nil {
				s.log.Info("api: "+verb, "service", name)
			}
			reply(w, map[string]string{"service": name, "done": verb}, err)
		})
	}
	mux.HandleFunc("POST /v1/reload", func(w http.ResponseWriter, r *http.Request) {
		res, err := c.Reload()
		reply(w, res, err)
	})
	mux.HandleFunc("POST /v1/checkpoint", func(w http.ResponseWriter, r *http.Request) {
		info, err := c.Checkpoint(r.Context())
		reply(w, info, err)
	})
	mux.HandleFunc("PUT /v1/services/{name}/state", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxStateBody))
		if err != nil {
			reply(w, nil, apitype.Errorf(apitype.CodeInvalidArgument, "state body: %v", err))
			return
		}
		reply(w, map[string]string{"service": r.PathValue("name")}, c.SetState(r.PathValue("name"), body))
	})
	mux.HandleFunc("POST /v1/safe-mode/{verb}", func(w http.ResponseWriter, r *http.Request) {
		switch r.PathValue("verb") {
		case "enter":
			reply(w, map[string]bool{"safe_mode": true}, c.SetSafeMode(true))
		case "exit":
			reply(w, map[string]bool{"safe_mode": false}, c.SetSafeMode(false))
		default:
			reply(w, nil, apitype.Errorf(apitype.CodeNotFound, "safe-mode %q: want enter or exit", r.PathValue("verb")))
		}
	})
	mux.HandleFunc("POST /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		var req apitype.SessionRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
			reply(w, nil, apitype.Errorf(apitype.CodeInvalidArgument, "session request: %v", err))
			return
		}
		s, err := c.RegisterSession(req)
		reply(w, s, err)
	})
	mux.HandleFunc("GET /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		reply(w, c.Sessions(), nil)
	})
	mux.HandleFunc("POST /v1/sessions/{id}/heartbeat", func(w http.ResponseWriter, r *http.Request) {
		reply(w, map[string]string{"id": r.PathValue("id")}, c.HeartbeatSession(r.PathValue("id")))
	})
	mux.HandleFunc("DELETE /v1/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, map[string]string{"id": r.PathValue("id")}, c.EndSession(r.PathValue("id")))
	})
	mux.HandleFunc("POST /v1/gc", func(w http.ResponseWriter, r *http.Request) {
		res, err := c.Cleanup(r.Context())
		reply(w, res, err)
	})
	mux.HandleFunc("GET /v1/recovery", func(w http.ResponseWriter, r *http.Request) {
		st, err := c.Recovery()
		reply(w, st, err)
	})
	mux.HandleFunc("POST /v1/recovery/retry", func(w http.ResponseWriter, r *http.Request) {
		st, err := c.RetryRecovery(r.Context())
		reply(w, st, err)
	})
	mux.HandleFunc("POST /v1/shutdown", func(w http.ResponseWriter, r *http.Request) {
		c.Shutdown()
		reply(w, map[string]bool{"ok": true}, nil)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		reply(w, nil, apitype.Errorf(apitype.CodeNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return s
}

// Serve answers on l until Shutdown. Connections from a peer that is
// neither the daemon's user nor root are closed unanswered.
func (s *Server) Serve(l net.Listener) error {
	err := s.srv.Serve(&peerListener{Listener: l, uid: os.Geteuid(), log: s.log})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting and waits (bounded by ctx) for answers in flight.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// StatusOf maps an error class to its HTTP status.
func StatusOf(code apitype.ErrorCode) int {
	switch code {
	case apitype.CodeNotFound:
		return http.StatusNotFound
	case apitype.CodeAlreadyExists, apitype.CodeFailedPrecondition:
		return http.StatusConflict
	case apitype.CodeInvalidArgument:
		return http.StatusBadRequest
	case apitype.CodeUnavailable:
		return http.StatusServiceUnavailable
	case apitype.CodePermissionDenied:
		return http.StatusForbidden
	}
	return http.StatusInternalServerError
}

func reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		// The class comes from the *apitype.Error inside err; the message
		// is all of err, so the context added by wrapping reaches the user.
		code := apitype.CodeInternal
		var ae *apitype.Error
		if errors.As(err, &ae) {
			code = ae.Code
		}
		w.WriteHeader(StatusOf(code))
		v = &apitype.Error{Code: code, Message: err.Error()}
	}
	_ = json.NewEncoder(w).Encode(v)
}
