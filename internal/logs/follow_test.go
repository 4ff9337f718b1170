package logs

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// startFollow runs follow for service "web" and returns its output and a
// function that cancels it and returns its result; the test's cleanup
// calls that too.
func startFollow(t *testing.T, state string) (*syncBuffer, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := newSyncBuffer()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- follow(ctx, state, "web", out, func() { close(ready) }) }()
	stop := sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			return errors.New("follow did not return after cancel")
		}
	})
	t.Cleanup(func() { stop() })
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("follow: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not start")
	}
	return out, stop
}

func TestFollowNewLinesAcrossRotation(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	f, err := OpenForChild(state, "web")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write := func(s string) {
		t.Helper()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	write("before\n")
	out, stop := startFollow(t, state)

	write("one\ntwo\nhalf")
	out.waitFor(t, "two lines", func(s string) bool { return s == "one\ntwo\n" })
	write("-done\n")
	out.waitFor(t, "the finished line", func(s string) bool { return s == "one\ntwo\nhalf-done\n" })

	write(numbered("pad", 1, 20))
	want := "one\ntwo\nhalf-done\n" + numbered("pad", 1, 20)
	out.waitFor(t, "padding", func(s string) bool { return s == want })
	if rotated, err := rotate(Path(state, "web"), Limits{MaxSize: 100, MaxFiles: 1}); err != nil || !rotated {
		t.Fatalf("rotate = %v, %v", rotated, err)
	}
	write("after\n")
	out.waitFor(t, "the line after rotation", func(s string) bool { return s == want+"after\n" })

	write("unfinished")
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Follow returned %v, want context.Canceled", err)
	}
	if got := out.String(); got != want+"after\nunfinished\n" {
		t.Errorf("final output %q: the unfinished line was not written at the end", got)
	}
}

func TestFollowMissingFile(t *testing.T) {
	t.Parallel()
	err := Follow(context.Background(), t.TempDir(), "web", new(strings.Builder))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("err = %v, want ErrNotExist", err)
	}
}

func TestTailerHoldsPartialUpToLimit(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/f"
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tl, err := newTailer(f)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	emit := func(l []byte) error { lines = append(lines, string(l)); return nil }
	w, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	w.WriteString(strings.Repeat("x", maxPartial))
	if err := tl.drain(emit); err != nil || len(lines) != 0 {
		t.Fatalf("after exactly %d bytes: lines %d, err %v; want it held", maxPartial, len(lines), err)
	}
	w.WriteString("yy")
	if err := tl.drain(emit); err != nil {
		t.Fatal(err)
	}
	if len(lines) != 1 || lines[0] != strings.Repeat("x", maxPartial) {
		t.Fatalf("over the limit: got %d lines, want the first %d bytes", len(lines), maxPartial)
	}
	w.WriteString("\n")
	if err := tl.drain(emit); err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || lines[1] != "yy" {
		t.Fatalf("lines = %d, last %q; want the rest as a line", len(lines), lines[len(lines)-1])
	}
}
