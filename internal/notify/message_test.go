package notify

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

func str(s string) *string { return &s }

// known is m without Assignments: the fields Format carries.
func known(m Message) Message {
	m.Assignments = nil
	return m
}

func TestParseAccepts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want Message
	}{
		{"READY=1", Message{Ready: true}},
		{"READY=1\n", Message{Ready: true}},
		{"STOPPING=1", Message{Stopping: true}},
		{"RELOADING=1\nMONOTONIC_USEC=123456789", Message{Reloading: true, Monotonic: 123456789 * time.Microsecond}},
		{"WATCHDOG=1", Message{Watchdog: true}},
		{"WATCHDOG=trigger", Message{WatchdogTrigger: true}},
		{"WATCHDOG=1\nWATCHDOG=trigger", Message{Watchdog: true, WatchdogTrigger: true}},
		{"BARRIER=1", Message{Barrier: true}},
		{"STATUS=Processing request 3 of 7", Message{Status: str("Processing request 3 of 7")}},
		{"STATUS=", Message{Status: str("")}},
		{"STATUS=a=b=c", Message{Status: str("a=b=c")}},
		{"STATUS=héllo ✓", Message{Status: str("héllo ✓")}},
		{"MAINPID=4242", Message{MainPID: 4242}},
		{"MAINPID=007", Message{MainPID: 7}},
		{"EXTEND_TIMEOUT_USEC=5000000", Message{ExtendTimeout: 5 * time.Second, HasExtendTimeout: true}},
		{"EXTEND_TIMEOUT_USEC=0", Message{HasExtendTimeout: true}},
		{"WATCHDOG_USEC=2000000", Message{WatchdogUSec: 2 * time.Second, HasWatchdogUSec: true}},
		{"WATCHDOG_USEC=0", Message{HasWatchdogUSec: true}},
		{"ERRNO=2", Message{Errno: 2}},
		{"LEASE=job-17", Message{Leases: []string{"job-17"}}},
		{"RELEASE=job-17", Message{Releases: []string{"job-17"}}},
		{"LEASE=a\nLEASE=B.c_d:e-9\nRELEASE=a", Message{Leases: []string{"a", "B.c_d:e-9"}, Releases: []string{"a"}}},
		{"LEASE=" + strings.Repeat("x", MaxLeaseID), Message{Leases: []string{strings.Repeat("x", MaxLeaseID)}}},
		{"READY=1\nSTATUS=up\nMAINPID=12\nWATCHDOG=1\n", Message{Ready: true, Status: str("up"), MainPID: 12, Watchdog: true}},
		// Empty lines are skipped.
		{"\nREADY=1\n\n\nWATCHDOG=1\n\n", Message{Ready: true, Watchdog: true}},
		// Values other than the flag's are ignored, as systemd does.
		{"READY=0\nWATCHDOG=yes\nBARRIER=2", Message{}},
		// Unknown keys are ignored (but kept in Assignments).
		{"FDSTORE=1\nFDNAME=sock\nX_CUSTOM=anything at all\nready=1", Message{}},
		// The first assignment of a key wins; later ones are still validated.
		{"STATUS=one\nSTATUS=two\nMAINPID=5\nMAINPID=6", Message{Status: str("one"), MainPID: 5}},
		// Exactly the limit.
		{"STATUS=" + strings.Repeat("z", MaxDatagram-7), Message{Status: str(strings.Repeat("z", MaxDatagram-7))}},
	} {
		got, err := Parse([]byte(tc.in))
		if err != nil {
			t.Errorf("Parse(%.40q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(known(got), tc.want) {
			t.Errorf("Parse(%.40q) =\n%+v, want\n%+v", tc.in, known(got), tc.want)
		}
	}
}

func TestParseAssignmentsInOrder(t *testing.T) {
	t.Parallel()
	m, err := Parse([]byte("X_ONE=1\nREADY=1\n\nSTATUS=a=b\nX_ONE=2\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Assignment{{"X_ONE", "1"}, {"READY", "1"}, {"STATUS", "a=b"}, {"X_ONE", "2"}}
	if !reflect.DeepEqual(m.Assignments, want) {
		t.Errorf("Assignments = %q, want %q", m.Assignments, want)
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want error
	}{
		{"", ErrEmpty},
		{"\n", ErrEmpty},
		{"\n\n\n", ErrEmpty},
		{strings.Repeat("x", MaxDatagram+1), ErrTooLarge},
		{"STATUS=" + strings.Repeat("z", MaxDatagram), ErrTooLarge},
		{"READY=1\x00", ErrNUL},
		{"\x00", ErrNUL},
		{"STATUS=a\x00b", ErrNUL},
		{"READY", ErrSyntax},
		{"READY=1\nWATCHDOG", ErrSyntax},
		{"=1", ErrSyntax},
		{"MAINPID=", ErrInvalidValue},
		{"MAINPID=0", ErrInvalidValue},
		{"MAINPID=-1", ErrInvalidValue},
		{"MAINPID=+5", ErrInvalidValue},
		{"MAINPID= 5", ErrInvalidValue},
		{"MAINPID=5x", ErrInvalidValue},
		{"MAINPID=0x10", ErrInvalidValue},
		{"MAINPID=4294967296", ErrInvalidValue},
		{"MAINPID=5\nMAINPID=bad", ErrInvalidValue},
		{"ERRNO=-1", ErrInvalidValue},
		{"ERRNO=-0", ErrInvalidValue},
		{"ERRNO=x", ErrInvalidValue},
		{"EXTEND_TIMEOUT_USEC=1.5", ErrInvalidValue},
		{"EXTEND_TIMEOUT_USEC=-1", ErrInvalidValue},
		{"EXTEND_TIMEOUT_USEC=18446744073709551615", ErrInvalidValue},
		{"WATCHDOG_USEC=9223372036854776", ErrInvalidValue}, // overflows time.Duration
		{"WATCHDOG_USEC=", ErrInvalidValue},
		{"WATCHDOG_USEC=1_000", ErrInvalidValue},
		{"MONOTONIC_USEC=now", ErrInvalidValue},
		{"LEASE=", ErrInvalidValue},
		{"LEASE=has space", ErrInvalidValue},
		{"LEASE=a/b", ErrInvalidValue},
		{"LEASE=ü", ErrInvalidValue},
		{"RELEASE=" + strings.Repeat("x", MaxLeaseID+1), ErrInvalidValue},
		{"RELEASE=\t", ErrInvalidValue},
		{"STATUS=\xff\xfe", ErrInvalidValue},
	} {
		m, err := Parse([]byte(tc.in))
		if !errors.Is(err, tc.want) {
			t.Errorf("Parse(%.40q) = %v, want %v", tc.in, err, tc.want)
		}
		if !reflect.DeepEqual(m, Message{}) {
			t.Errorf("Parse(%.40q) returned %+v with its error, want the zero Message", tc.in, m)
		}
	}
}

func TestParseLargestValues(t *testing.T) {
	t.Parallel()
	m, err := Parse([]byte("MAINPID=2147483647\nERRNO=0\nWATCHDOG_USEC=9223372036854775"))
	if err != nil {
		t.Fatal(err)
	}
	if m.MainPID != 1<<31-1 || m.WatchdogUSec != 9223372036854775*time.Microsecond {
		t.Errorf("got %+v", known(m))
	}
}

// checkRoundTrip is the property: whatever Parse accepts, Format re-serialises
// to a payload no longer than the input that parses to the same known fields.
func checkRoundTrip(t *testing.T, in []byte) {
	t.Helper()
	m, err := Parse(in)
	if err != nil {
		return
	}
	out := m.Format()
	if len(out) > len(in) {
		t.Fatalf("Format(Parse(%q)) = %q is longer than the input", in, out)
	}
	if out == "" {
		if !reflect.DeepEqual(known(m), Message{}) {
			t.Fatalf("Format of %+v is empty", known(m))
		}
		return
	}
	again, err := Parse([]byte(out))
	if err != nil {
		t.Fatalf("Parse(Format(Parse(%q))) = %v; Format gave %q", in, err, out)
	}
	if !reflect.DeepEqual(known(again), known(m)) {
		t.Fatalf("round trip of %q:\n%+v, want\n%+v", in, known(again), known(m))
	}
}

// randomPayload joins lines drawn from valid, borderline and junk pieces.
func randomPayload(r *rand.Rand) []byte {
	keys := []string{"READY", "STOPPING", "RELOADING", "WATCHDOG", "BARRIER", "STATUS", "MAINPID",
		"EXTEND_TIMEOUT_USEC", "WATCHDOG_USEC", "ERRNO", "MONOTONIC_USEC", "LEASE", "RELEASE", "X_OTHER"}
	values := []string{"1", "0", "trigger", "", "42", "007", "job-1", "a.b:c_d-e", "héllo", "x y",
		"18446744073709551615", "9223372036854775", strconv.Itoa(r.IntN(1 << 31))}
	var lines []string
	for range 1 + r.IntN(6) {
		lines = append(lines, keys[r.IntN(len(keys))]+"="+values[r.IntN(len(values))])
		if r.IntN(10) == 0 {
			lines = append(lines, "")
		}
	}
	s := strings.Join(lines, "\n")
	if r.IntN(2) == 0 {
		s += "\n"
	}
	return []byte(s)
}

func TestParseFormatRoundTrip(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	accepted := 0
	for range 20000 {
		in := randomPayload(r)
		if _, err := Parse(in); err == nil {
			accepted++
		}
		checkRoundTrip(t, in)
	}
	if accepted < 1000 {
		t.Errorf("only %d of 20000 random payloads were valid: the property was barely exercised", accepted)
	}
	seeds, err := filepath.Glob("testdata/fuzz/FuzzParse/*")
	if err != nil || len(seeds) == 0 {
		t.Fatalf("seed corpus: %v, %d files", err, len(seeds))
	}
	for _, path := range seeds {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		in, err := corpusValue(string(b))
		if err != nil {
			t.Fatalf("seed %s: %v", path, err)
		}
		checkRoundTrip(t, []byte(in))
	}
}

// corpusValue decodes a one-value `go test fuzz v1` file holding []byte("…").
func corpusValue(file string) (string, error) {
	_, value, _ := strings.Cut(file, "\n")
	value = strings.TrimSpace(value)
	if !strings.HasPrefix(value, "[]byte(") || !strings.HasSuffix(value, ")") {
		return "", fmt.Errorf("not a []byte value: %q", value)
	}
	return strconv.Unquote(value[len("[]byte(") : len(value)-1])
}

// FuzzParse: Parse never panics, never accepts what its contract rejects, and
// what it accepts survives the Format round trip.
func FuzzParse(f *testing.F) {
	f.Add([]byte("READY=1\nSTATUS=up\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := Parse(in)
		if err != nil {
			return
		}
		if len(in) == 0 || len(in) > MaxDatagram || strings.IndexByte(string(in), 0) >= 0 {
			t.Fatalf("Parse accepted %q", in)
		}
		if len(m.Assignments) == 0 {
			t.Fatalf("Parse accepted %q with no assignments", in)
		}
		for _, id := range append(m.Leases, m.Releases...) {
			if !ValidLeaseID(id) {
				t.Fatalf("Parse accepted lease id %q", id)
			}
		}
		checkRoundTrip(t, in)
	})
}
