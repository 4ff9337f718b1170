// Package registry keeps vigil's sessions: external processes (agents,
// editors, worker pools, `vigil run`) that vigil did not start but that
// register themselves, heartbeat, and declare the process groups they own,
// so that when an owner dies nothing it started outlives it.
//
// The registry is state and decisions only: Sweep says which sessions are
// dead (owner gone, or its pid reused: the start time differs) or stale
// (no heartbeat for StaleAfter), and what to do; the daemon signals the
// groups, journals each change and checkpoints the sessions. Identity is
// always pid plus start time, never a pid alone. Safe for concurrent use.
package registry

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Errors, matched with errors.Is.
var (
	ErrNotFound = errors.New("registry: no such session")
	ErrInvalid  = errors.New("registry: invalid session")
)

// Group is a process group a session owns. LeaderStart is the start time
// of the process whose pid is the group's id when it registered (0 if it
// had already gone): a group id is only reused once the group is empty,
// and a new leader with that pid then has another start time.
type Group struct {
	PGID        int    `json:"pgid"`
	LeaderStart uint64 `json:"leader_start,omitempty"`
}

// Session is one registered owner.
type Session struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Type string `json:"type,omitempty"` // free text: "agent", "editor", "run"…
	// PID and StartTime are the owner: when it is gone the session is dead.
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	// Boot is the boot it was registered in: a session of another boot
	// died with it.
	Boot   string  `json:"boot,omitempty"`
	Groups []Group `json:"groups"`
	// Heartbeat is how often the owner promised to heartbeat; StaleAfter
	// how long without one makes it stale.
	Heartbeat    time.Duration `json:"heartbeat"`
	StaleAfter   time.Duration `json:"stale_after"`
	RegisteredAt time.Time     `json:"registered_at"`
	LastSeen     time.Time     `json:"last_seen"`
	// Stale is set once a sweep found it stale (reported once).
	Stale bool `json:"stale,omitempty"`
}

// Registry holds the sessions. Its zero value is ready to use.
type Registry struct {
	mu       sync.Mutex
	sessions map[string]*Session
}

// Register adds s with a fresh ID, RegisteredAt and LastSeen at now, and
// returns it. PID and StartTime are required; Heartbeat and StaleAfter
// take defHeartbeat and defStale when zero.
func (r *Registry) Register(s Session, now time.Time, defHeartbeat, defStale time.Duration) (Session, error) {
	if s.PID <= 0 || s.StartTime == 0 {
		return Session{}, fmt.Errorf("%w: pid %d with start time %d: the owner must be a live process", ErrInvalid, s.PID, s.StartTime)
	}
	for _, g := range s.Groups {
		if g.PGID <= 1 {
			return Session{}, fmt.Errorf("%w: process group %d", ErrInvalid, g.PGID)
		}
	}
	if s.Heartbeat <= 0 {
		s.Heartbeat = defHeartbeat
	}
	if s.StaleAfter <= 0 {
		s.StaleAfter = defStale
	}
	var b [8]byte
	rand.Read(b[:])
	s.ID = hex.EncodeToString(b[:])
	s.RegisteredAt, s.LastSeen, s.Stale = now, now, false
	s.Groups = slices.Clone(s.Groups)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sessions == nil {
		r.sessions = map[string]*Session{}
	}
	r.sessions[s.ID] = &s
	return s, nil
}

// Heartbeat marks the session seen at now.
func (r *Registry) Heartbeat(id string, now time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.sessions[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	s.LastSeen, s.Stale = now, false
	return nil
}

// Remove forgets the session and returns it.
func (r *Registry) Remove(id string) (Session, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.sessions[id]
	if !ok {
		return Session{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	delete(r.sessions, id)
	return *s, nil
}

// Get returns the session with id.
func (r *Registry) Get(id string) (Session, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.sessions[id]
	if !ok {
		return Session{}, false
	}
	return clone(s), true
}

// List returns every session, oldest registration first.
func (r *Registry) List() []Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Session, 0, len(r.sessions))
	for _, s := range r.sessions {
		out = append(out, clone(s))
	}
	slices.SortFunc(out, func(a, b Session) int {
		if c := a.RegisteredAt.Compare(b.RegisteredAt); c != 0 {
			return c
		}
		return compare(a.ID, b.ID)
	})
	return out
}

// Restore puts sessions back (after the daemon's restart), each seen at
// now at the latest: their owners could not reach a dead daemon.
func (r *Registry) Restore(sessions []Session, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sessions == nil {
		r.sessions = map[string]*Session{}
	}
	for _, s := range sessions {
		s := clone(&s)
		if s.LastSeen.Before(now) {
			s.LastSeen = now
		}
		r.sessions[s.ID] = &s
	}
}

// Verdict is what a sweep decided about one session.
type Verdict string

const (
	Dead  Verdict = "dead"  // the owner is gone or its pid was reused: remove, kill its groups
	Stale Verdict = "stale" // alive, but no heartbeat for StaleAfter
)

// Decision is one session a sweep found dead or stale.
type Decision struct {
	Session Session
	Verdict Verdict
	// Kill: its groups are to be terminated and the session removed.
	Kill bool
}

// Sweep decides about every session at now: a dead owner (alive reports
// false for its pid and start time) means remove and kill; a stale one is
// reported once, or killed and removed when killStale. Sessions decided
// for removal are removed here; the caller terminates their groups.
func (r *Registry) Sweep(now time.Time, alive func(pid int, start uint64) bool, killStale bool) []Decision {
	r.mu.Lock()
	snapshot := maps.Clone(r.sessions)
	r.mu.Unlock()
	var out []Decision
	for id := range snapshot {
		r.mu.Lock()
		cur, ok := r.sessions[id]
		var sess Session
		if ok {
			sess = clone(cur)
		}
		r.mu.Unlock()
		if !ok {
			continue
		}
		var d Decision
		switch {
		case !alive(sess.PID, sess.StartTime):
			d = Decision{Session: sess, Verdict: Dead, Kill: true}
		case now.Sub(sess.LastSeen) > sess.StaleAfter && (killStale || !sess.Stale):
			d = Decision{Session: sess, Verdict: Stale, Kill: killStale}
		default:
			continue
		}
		r.mu.Lock()
		if cur, ok := r.sessions[id]; ok && cur.LastSeen.Equal(sess.LastSeen) { // no heartbeat meanwhile
			if d.Kill {
				delete(r.sessions, id)
			} else {
				cur.Stale = true
			}
			out = append(out, d)
		}
		r.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Decision) int { return compare(a.Session.ID, b.Session.ID) })
	return out
}

func clone(s *Session) Session {
	c := *s
	c.Groups = slices.Clone(s.Groups)
	return c
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
