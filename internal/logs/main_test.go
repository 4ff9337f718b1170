package logs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain lets the test binary act as a service writing output, as os/exec's
// own tests do: with VIGIL_LOGS_HELPER set it runs that helper and exits.
func TestMain(m *testing.M) {
	if h := os.Getenv("VIGIL_LOGS_HELPER"); h != "" {
		os.Exit(runHelper(h, os.Args[1:]))
	}
	os.Exit(m.Run())
}

func runHelper(name string, args []string) int {
	switch name {
	case "lines": // lines TAG COUNT SIZE: COUNT lines of SIZE bytes, one write each
		count, _ := strconv.Atoi(args[1])
		size, _ := strconv.Atoi(args[2])
		for i := range count {
			if _, err := os.Stdout.WriteString(helperLine(args[0], i, size) + "\n"); err != nil {
				return 1
			}
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper %q\n", name)
	return 2
}

// helperLine is line i of the "lines" helper, size bytes without newline.
func helperLine(tag string, i, size int) string {
	head := fmt.Sprintf("%s-%06d-", tag, i)
	return head + strings.Repeat("x", size-len(head))
}

// startHelper runs the test binary as helper name with its stdout and stderr
// on out, and makes sure it is gone when the test ends.
func startHelper(t *testing.T, out *os.File, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "VIGIL_LOGS_HELPER="+name)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

// syncBuffer is an io.Writer that tests can wait on.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{}
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{changed: make(chan struct{}, 1)} }

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	n, err := s.b.Write(p)
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return n, err
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor waits until cond holds for everything written so far and returns
// it, failing the test after a deadline.
func (s *syncBuffer) waitFor(t *testing.T, what string, cond func(string) bool) string {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		out := s.String()
		if cond(out) {
			return out
		}
		select {
		case <-s.changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s; output so far:\n%q", what, out)
		}
	}
}

// waitUntil polls cond until it holds, failing the test after a deadline.
// It is for state that nothing announces, such as a file appearing.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// numbered returns lines tag-0000001 … of exactly 10 bytes each with newline.
func numbered(tag string, from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&b, "%s-%07d\n", tag, i)
	}
	return b.String()
}
