package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"time"

	"github.com/vigil-dev/vigil/internal/policy"
	"github.com/vigil-dev/vigil/internal/registry"
)

// Format is the envelope's "format" value.
const Format = "vigil-checkpoint"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// envelope is line 1 as written; field order is the documented order.
type envelope struct {
	Format     string `json:"format"`
	Version    int    `json:"version"`
	Generation uint64 `json:"generation"`
	WrittenAt  string `json:"written_at"`
	State      *State `json:"state"`
}

// encode renders a complete checkpoint file.
func encode(gen uint64, writtenAt time.Time, st *State) ([]byte, error) {
	line, err := json.Marshal(envelope{
		Format:     Format,
		Version:    Version,
		Generation: gen,
		WrittenAt:  writtenAt.UTC().Format(time.RFC3339Nano),
		State:      st,
	})
	if err != nil {
		return nil, err
	}
	line = append(line, '\n')
	out := make([]byte, 0, len(line)+40)
	out = append(out, line...)
	out = fmt.Appendf(out, "crc32c=%08x length=%d\n", crc32.Checksum(line, castagnoli), len(line))
	return out, nil
}

// problem is why a file was rejected: a message of its own, and the
// sentinel (and cause, if any) it wraps.
type problem struct {
	kind  error
	msg   string
	cause error
}

func (p *problem) Error() string {
	if p.cause != nil {
		return p.msg + ": " + p.cause.Error()
	}
	return p.msg
}

func (p *problem) Unwrap() []error {
	if p.cause != nil {
		return []error{p.kind, p.cause}
	}
	return []error{p.kind}
}

func corrupt(format string, args ...any) error {
	return &problem{kind: ErrCorrupt, msg: "corrupt: " + fmt.Sprintf(format, args...)}
}

func invalid(cause error, format string, args ...any) error {
	return &problem{kind: ErrInvalid, msg: fmt.Sprintf(format, args...), cause: cause}
}

// decoded is a file that passed every check but the clock's.
type decoded struct {
	Generation uint64
	WrittenAt  time.Time
	State      State
	Skipped    []EntryError // Path not yet set
}

// decode verifies a checkpoint file in the documented order and returns
// its valid entries. It does not look at the clock.
func decode(data []byte) (*decoded, error) {
	line, err := verify(data)
	if err != nil {
		return nil, err
	}
	// One pass on the happy path; the header alone only to explain a
	// failure, so a newer schema is named as such even if its shape changed.
	var env struct {
		Format     string  `json:"format"`
		Version    int     `json:"version"`
		Generation uint64  `json:"generation"`
		WrittenAt  *string `json:"written_at"`
		State      *struct {
			SafeMode bool              `json:"safe_mode"`
			Services []json.RawMessage `json:"services"`
			Sessions []json.RawMessage `json:"sessions"`
		} `json:"state"`
	}
	envErr := json.Unmarshal(line, &env)
	if envErr != nil {
		var head struct {
			Format  string `json:"format"`
			Version int    `json:"version"`
		}
		if err := json.Unmarshal(line, &head); err != nil {
			return nil, invalid(err, "envelope")
		}
		env.Format, env.Version = head.Format, head.Version
	}
	if env.Format != Format {
		return nil, invalid(nil, "format is %q, not %q", env.Format, Format)
	}
	if env.Version > Version {
		return nil, &problem{kind: ErrFutureVersion,
			msg: fmt.Sprintf("schema version %d is newer than this vigil (%d)", env.Version, Version)}
	}
	if env.Version < 1 {
		return nil, invalid(nil, "schema version %d is invalid", env.Version)
	}
	if envErr != nil {
		return nil, invalid(envErr, "envelope")
	}
	if env.Generation == 0 {
		return nil, invalid(nil, "generation is 0")
	}
	if env.WrittenAt == nil || *env.WrittenAt == "" {
		return nil, invalid(nil, "written_at is missing")
	}
	at, err := time.Parse(time.RFC3339Nano, *env.WrittenAt)
	if err != nil {
		return nil, invalid(err, "written_at")
	}
	if y := at.UTC().Year(); y < 1 || y > 9999 {
		return nil, invalid(nil, "written_at %q is out of range", *env.WrittenAt)
	}
	st := env.State
	if st == nil {
		return nil, invalid(nil, "state is missing")
	}
	d := &decoded{Generation: env.Generation, WrittenAt: at, State: State{SafeMode: st.SafeMode}}
	seen := make(map[string]bool, len(st.Services))
	for i, raw := range st.Services {
		var svc Service
		err := json.Unmarshal(raw, &svc)
		if err == nil {
			err = svc.Validate()
		}
		if err == nil && seen[svc.Name] {
			err = errors.New("duplicate name")
		}
		if err != nil {
			d.Skipped = append(d.Skipped, EntryError{Index: i, Name: svc.Name, Err: err})
			continue
		}
		seen[svc.Name] = true
		d.State.Services = append(d.State.Services, svc)
	}
	ids := make(map[string]bool, len(st.Sessions))
	for i, raw := range st.Sessions {
		var s registry.Session
		err := json.Unmarshal(raw, &s)
		if err == nil {
			err = validateSession(&s)
		}
		if err == nil && ids[s.ID] {
			err = errors.New("duplicate id")
		}
		if err != nil {
			d.Skipped = append(d.Skipped, EntryError{List: "sessions", Index: i, Name: s.ID, Err: err})
			continue
		}
		ids[s.ID] = true
		d.State.Sessions = append(d.State.Sessions, s)
	}
	return d, nil
}

// validateSession checks what cleanup relies on: an owner to watch and
// process groups that may be signalled.
func validateSession(s *registry.Session) error {
	switch {
	case s.ID == "":
		return errors.New("id is empty")
	case s.PID <= 0 || s.StartTime == 0:
		return fmt.Errorf("owner is pid %d with start time %d", s.PID, s.StartTime)
	case s.Heartbeat < 0 || s.StaleAfter < 0:
		return fmt.Errorf("heartbeat %s, stale after %s", s.Heartbeat, s.StaleAfter)
	}
	for _, g := range s.Groups {
		if g.PGID <= 1 {
			return fmt.Errorf("process group %d", g.PGID)
		}
	}
	return nil
}

// verify checks the trailer, length and CRC and returns line 1.
func verify(data []byte) ([]byte, error) {
	if len(data) == 0 {
		return nil, corrupt("empty file")
	}
	if data[len(data)-1] != '\n' {
		return nil, corrupt("no trailer: the file does not end in a newline")
	}
	i := bytes.LastIndexByte(data[:len(data)-1], '\n')
	if i < 0 {
		return nil, corrupt("no trailer line")
	}
	line, trailer := data[:i+1], data[i+1:len(data)-1]
	sum, n, ok := parseTrailer(trailer)
	if !ok {
		return nil, corrupt("malformed trailer %.60q", trailer)
	}
	if n != uint64(len(line)) {
		return nil, corrupt("length mismatch: trailer says %d bytes, envelope has %d", n, len(line))
	}
	if got := crc32.Checksum(line, castagnoli); got != sum {
		return nil, corrupt("crc32c mismatch: trailer says %08x, envelope has %08x", sum, got)
	}
	return line, nil
}

// parseTrailer parses "crc32c=<8 lowercase hex> length=<decimal>",
// accepting only the canonical spelling.
func parseTrailer(b []byte) (sum uint32, n uint64, ok bool) {
	const pre, mid = "crc32c=", " length="
	if len(b) > 64 || !bytes.HasPrefix(b, []byte(pre)) || len(b) < len(pre)+8+len(mid)+1 {
		return 0, 0, false
	}
	hex := b[len(pre) : len(pre)+8]
	for _, c := range hex {
		switch {
		case '0' <= c && c <= '9':
			sum = sum<<4 | uint32(c-'0')
		case 'a' <= c && c <= 'f':
			sum = sum<<4 | uint32(c-'a'+10)
		default:
			return 0, 0, false
		}
	}
	rest := b[len(pre)+8:]
	if !bytes.HasPrefix(rest, []byte(mid)) {
		return 0, 0, false
	}
	digits := string(rest[len(mid):])
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || strconv.FormatUint(n, 10) != digits {
		return 0, 0, false
	}
	return sum, n, true
}

// Validate reports why s cannot be restored, or nil.
func (s *Service) Validate() error {
	switch {
	case s.Name == "":
		return errors.New("name is empty")
	case s.Desired != DesiredRunning && s.Desired != DesiredStopped:
		return fmt.Errorf("desired is %q, not %q or %q", s.Desired, DesiredRunning, DesiredStopped)
	case s.Restarts < 0:
		return fmt.Errorf("restarts is %d", s.Restarts)
	case s.Tracker.Attempt < 0:
		return fmt.Errorf("tracker attempt is %d", s.Tracker.Attempt)
	case len(s.Blob) > 0 && !json.Valid(s.Blob):
		return errors.New("blob is not valid JSON")
	}
	switch s.Tracker.Breaker {
	case "", policy.BreakerClosed, policy.BreakerOpen, policy.BreakerHalfOpen:
	default:
		return fmt.Errorf("tracker breaker is %q", s.Tracker.Breaker)
	}
	if s.Instance != nil {
		if err := s.Instance.Validate(); err != nil {
			return fmt.Errorf("instance: %w", err)
		}
	}
	return nil
}

// Validate reports why i cannot identify a live process tree, or nil.
func (i *Instance) Validate() error {
	switch {
	case i.PID <= 0:
		return fmt.Errorf("pid is %d", i.PID)
	case i.PGID <= 0:
		return fmt.Errorf("pgid is %d", i.PGID)
	case i.StartTime == 0:
		return errors.New("start_time is 0")
	case i.MainPID < 0:
		return fmt.Errorf("main_pid is %d", i.MainPID)
	}
	return nil
}
