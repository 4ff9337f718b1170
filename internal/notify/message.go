package notify

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxDatagram is the largest notify datagram accepted, in bytes. systemd
// accepts more, but no sd_notify message needs more than a short status line,
// and the issue bounds it at 4 KiB.
const MaxDatagram = 4096

// MaxLeaseID is the longest LEASE=/RELEASE= id accepted, in bytes.
const MaxLeaseID = 128

// Errors returned by Parse, wrapped with the offending line where there is one.
var (
	ErrEmpty        = errors.New("notify: empty message")
	ErrTooLarge     = errors.New("notify: message larger than 4096 bytes")
	ErrNUL          = errors.New("notify: NUL byte in message")
	ErrSyntax       = errors.New("notify: line is not KEY=VALUE")
	ErrInvalidValue = errors.New("notify: invalid value")
)

// Assignment is one KEY=VALUE line of a datagram.
type Assignment struct {
	Key, Value string
}

// Message is one parsed datagram: its assignments in order, plus a field for
// each key vigil understands. The zero value means "nothing was said".
//
// A boolean field is set when its exact assignment occurs anywhere in the
// datagram (READY=1, WATCHDOG=trigger, …); other values of those keys, such
// as READY=0, are ignored, as systemd does. For the other known keys the first
// assignment wins, as systemd looks them up, but every assignment of a known
// key is validated. LEASE= and RELEASE= collect every assignment in order.
type Message struct {
	// Assignments holds every line in order, known and unknown keys alike.
	Assignments []Assignment

	Ready           bool // READY=1: start-up (or a reload) is complete
	Stopping        bool // STOPPING=1: the service is shutting down
	Reloading       bool // RELOADING=1: the service is reloading its configuration
	Watchdog        bool // WATCHDOG=1: a keep-alive ping
	WatchdogTrigger bool // WATCHDOG=trigger: the service asks to be treated as hung
	Barrier         bool // BARRIER=1: the sender waits for its passed fd to be closed

	// Status is the STATUS= text, nil when absent; always valid UTF-8.
	Status *string
	// MainPID is MAINPID=, 0 when absent; never trust it without checking
	// that it is a descendant of the service.
	MainPID int
	// ExtendTimeout is EXTEND_TIMEOUT_USEC=; HasExtendTimeout tells a present
	// 0 from absence.
	ExtendTimeout    time.Duration
	HasExtendTimeout bool
	// WatchdogUSec is WATCHDOG_USEC=, the new watchdog interval;
	// HasWatchdogUSec tells a present 0 (which disables the watchdog in
	// systemd) from absence.
	WatchdogUSec    time.Duration
	HasWatchdogUSec bool
	// Errno is ERRNO=, the errno-style failure code a service may report; 0
	// when absent.
	Errno int
	// Monotonic is MONOTONIC_USEC=, the sender's CLOCK_MONOTONIC time sent
	// with RELOADING=1 (go-systemd's SdNotifyMonotonicUsec); 0 when absent.
	Monotonic time.Duration

	// Leases and Releases are the LEASE= and RELEASE= ids, in order. An id is
	// 1 to MaxLeaseID bytes of [A-Za-z0-9._:-].
	Leases, Releases []string
}

// Parse parses one datagram payload: newline-separated KEY=VALUE lines.
// Empty lines, including a trailing newline, are skipped. It rejects an empty
// payload (or one of empty lines only), a payload over MaxDatagram bytes or
// holding a NUL byte, a non-empty line without '=' or with an empty key, a
// malformed number in a numeric key, a STATUS= that is not UTF-8, and an
// invalid lease id. Parse does no I/O and never panics.
func Parse(b []byte) (Message, error) {
	var m Message
	switch {
	case len(b) == 0:
		return m, ErrEmpty
	case len(b) > MaxDatagram:
		return m, ErrTooLarge
	case bytes.IndexByte(b, 0) >= 0:
		return m, ErrNUL
	}
	// One string for the whole payload; keys and values are slices of it.
	s := string(b)
	m.Assignments = make([]Assignment, 0, strings.Count(s, "\n")+1)
	seen := seenKeys(0)
	for line := range strings.SplitSeq(s, "\n") {
		if line == "" {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || key == "" {
			return Message{}, fmt.Errorf("%w: %q", ErrSyntax, clip(line))
		}
		m.Assignments = append(m.Assignments, Assignment{Key: key, Value: value})
		if err := m.apply(key, value, &seen); err != nil {
			return Message{}, fmt.Errorf("%w: %s=%q", err, key, clip(value))
		}
	}
	if len(m.Assignments) == 0 {
		return Message{}, ErrEmpty
	}
	return m, nil
}

// seenKeys records which first-wins keys have been assigned already.
type seenKeys uint8

const (
	seenStatus seenKeys = 1 << iota
	seenMainPID
	seenExtend
	seenWatchdogUSec
	seenErrno
	seenMonotonic
)

// first reports whether k is being assigned for the first time.
func (s *seenKeys) first(k seenKeys) bool {
	f := *s&k == 0
	*s |= k
	return f
}

func (m *Message) apply(key, value string, seen *seenKeys) error {
	switch key {
	case "READY":
		m.Ready = m.Ready || value == "1"
	case "STOPPING":
		m.Stopping = m.Stopping || value == "1"
	case "RELOADING":
		m.Reloading = m.Reloading || value == "1"
	case "BARRIER":
		m.Barrier = m.Barrier || value == "1"
	case "WATCHDOG":
		m.Watchdog = m.Watchdog || value == "1"
		m.WatchdogTrigger = m.WatchdogTrigger || value == "trigger"
	case "STATUS":
		if !utf8.ValidString(value) {
			return ErrInvalidValue
		}
		if seen.first(seenStatus) {
			m.Status = &value
		}
	case "MAINPID":
		pid, err := parseInt(value, 1)
		if err != nil {
			return err
		}
		if seen.first(seenMainPID) {
			m.MainPID = pid
		}
	case "ERRNO":
		errno, err := parseInt(value, 0)
		if err != nil {
			return err
		}
		if seen.first(seenErrno) {
			m.Errno = errno
		}
	case "EXTEND_TIMEOUT_USEC":
		d, err := parseUSec(value)
		if err != nil {
			return err
		}
		if seen.first(seenExtend) {
			m.ExtendTimeout, m.HasExtendTimeout = d, true
		}
	case "WATCHDOG_USEC":
		d, err := parseUSec(value)
		if err != nil {
			return err
		}
		if seen.first(seenWatchdogUSec) {
			m.WatchdogUSec, m.HasWatchdogUSec = d, true
		}
	case "MONOTONIC_USEC":
		d, err := parseUSec(value)
		if err != nil {
			return err
		}
		if seen.first(seenMonotonic) {
			m.Monotonic = d
		}
	case "LEASE":
		if !ValidLeaseID(value) {
			return ErrInvalidValue
		}
		m.Leases = append(m.Leases, value)
	case "RELEASE":
		if !ValidLeaseID(value) {
			return ErrInvalidValue
		}
		m.Releases = append(m.Releases, value)
	}
	return nil
}

// parseInt parses a decimal int32 (a pid or an errno) of at least min.
func parseInt(s string, min int) (int, error) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || s[0] < '0' || s[0] > '9' || n < int64(min) {
		return 0, ErrInvalidValue
	}
	return int(n), nil
}

// parseUSec parses a decimal count of microseconds that fits a time.Duration.
func parseUSec(s string) (time.Duration, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > math.MaxInt64/uint64(time.Microsecond) {
		return 0, ErrInvalidValue
	}
	return time.Duration(n) * time.Microsecond, nil
}

// ValidLeaseID reports whether id may be used with LEASE= and RELEASE=.
func ValidLeaseID(id string) bool {
	if id == "" || len(id) > MaxLeaseID {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// clip shortens s for an error message.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}

// Format returns a datagram payload carrying m's known fields, one line each,
// in a fixed order, with no trailing newline; Assignments are not consulted.
// For any m that Parse returned, Format(m) is no longer than the payload it
// came from and Parse(Format(m)) gives back m's known fields.
func (m Message) Format() string {
	var lines []string
	flag := func(set bool, line string) {
		if set {
			lines = append(lines, line)
		}
	}
	num := func(set bool, key string, v int64) {
		if set {
			lines = append(lines, key+"="+strconv.FormatInt(v, 10))
		}
	}
	flag(m.Ready, "READY=1")
	flag(m.Stopping, "STOPPING=1")
	flag(m.Reloading, "RELOADING=1")
	flag(m.Watchdog, "WATCHDOG=1")
	flag(m.WatchdogTrigger, "WATCHDOG=trigger")
	flag(m.Barrier, "BARRIER=1")
	if m.Status != nil {
		lines = append(lines, "STATUS="+*m.Status)
	}
	num(m.MainPID != 0, "MAINPID", int64(m.MainPID))
	num(m.HasExtendTimeout, "EXTEND_TIMEOUT_USEC", m.ExtendTimeout.Microseconds())
	num(m.HasWatchdogUSec, "WATCHDOG_USEC", m.WatchdogUSec.Microseconds())
	num(m.Errno != 0, "ERRNO", int64(m.Errno))
	num(m.Monotonic != 0, "MONOTONIC_USEC", m.Monotonic.Microseconds())
	for _, id := range m.Leases {
		lines = append(lines, "LEASE="+id)
	}
	for _, id := range m.Releases {
		lines = append(lines, "RELEASE="+id)
	}
	return strings.Join(lines, "\n")
}
