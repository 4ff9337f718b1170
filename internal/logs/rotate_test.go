package logs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestGateSpacesChecks(t *testing.T) {
	t.Parallel()
	const iv = 250 * time.Millisecond
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var g gate
	steps := []struct {
		name     string
		now      time.Duration
		fired    bool // the deferred check runs instead of a write
		checkNow bool
		wait     time.Duration
	}{
		{name: "first write", now: 0, checkNow: true},
		{name: "write soon after", now: 10 * time.Millisecond, wait: 240 * time.Millisecond},
		{name: "write while deferred", now: 20 * time.Millisecond},
		{name: "deferred check", now: 250 * time.Millisecond, fired: true},
		{name: "write after deferred", now: 300 * time.Millisecond, wait: 200 * time.Millisecond},
		{name: "deferred check 2", now: 500 * time.Millisecond, fired: true},
		{name: "write after quiet", now: 900 * time.Millisecond, checkNow: true},
		{name: "write exactly one interval later", now: 1150 * time.Millisecond, checkNow: true},
	}
	for _, s := range steps {
		if s.fired {
			g.fired(at(s.now))
			continue
		}
		checkNow, wait := g.modified(at(s.now), iv)
		if checkNow != s.checkNow || wait != s.wait {
			t.Errorf("%s: modified = (%v, %v), want (%v, %v)", s.name, checkNow, wait, s.checkNow, s.wait)
		}
	}
}

func TestRotateShiftsAndDropsOldest(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	r, err := NewRotator(state, Limits{MaxSize: 100, MaxFiles: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// The writer keeps its descriptor across rotations, as a child does.
	f, err := OpenForChild(state, "web")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	live := Path(state, "web")

	write := func(s string) {
		t.Helper()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	rotate := func(want bool) {
		t.Helper()
		rotated, err := r.RotateIfNeeded("web")
		if err != nil || rotated != want {
			t.Fatalf("RotateIfNeeded = %v, %v; want %v", rotated, err, want)
		}
	}

	write(numbered("a", 1, 10)) // exactly MaxSize: not over it
	rotate(false)
	write(numbered("a", 11, 11))
	rotate(true)
	if got, want := readFile(t, rotatedPath(live, 1)), numbered("a", 1, 11); got != want {
		t.Fatalf(".1 = %q, want %q", got, want)
	}
	if got := readFile(t, live); got != "" {
		t.Fatalf("live after rotation = %q, want empty", got)
	}

	write(numbered("b", 1, 11)) // lands at offset 0 of the truncated file
	rotate(true)
	write(numbered("c", 1, 11))
	rotate(true)
	write(numbered("d", 1, 2))
	rotate(false)

	for path, want := range map[string]string{
		live:                 numbered("d", 1, 2),
		rotatedPath(live, 1): numbered("c", 1, 11),
		rotatedPath(live, 2): numbered("b", 1, 11),
	} {
		if got := readFile(t, path); got != want {
			t.Errorf("%s = %q, want %q", filepath.Base(path), got, want)
		}
	}
	if _, err := os.Stat(rotatedPath(live, 3)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf(".3 exists (err %v): the oldest file was not dropped", err)
	}
	fi, err := os.Lstat(rotatedPath(live, 1))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != 0o600 {
		t.Errorf(".1 mode = %v, want -rw-------", fi.Mode())
	}

	if rotated, err := r.RotateIfNeeded("missing"); rotated || err != nil {
		t.Errorf("RotateIfNeeded(missing) = %v, %v; want false, nil", rotated, err)
	}
}

func TestRotateSplitsBurst(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	f, err := OpenForChild(state, "web")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	live := Path(state, "web")
	if err := os.WriteFile(rotatedPath(live, 1), []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(numbered("x", 1, 35)); err != nil { // 350 bytes
		t.Fatal(err)
	}
	rotated, err := rotate(live, Limits{MaxSize: 100, MaxFiles: 3})
	if err != nil || !rotated {
		t.Fatalf("rotate = %v, %v", rotated, err)
	}
	for k, want := range map[int]string{
		1: numbered("x", 26, 35),
		2: numbered("x", 16, 25),
		3: numbered("x", 6, 15), // 1–5 do not fit and are dropped, as is "old"
	} {
		if got := readFile(t, rotatedPath(live, k)); got != want {
			t.Errorf(".%d = %q, want %q", k, got, want)
		}
	}
}

func TestPlanSpans(t *testing.T) {
	t.Parallel()
	lines := numbered("x", 1, 100) // 10-byte lines
	oneLine := strings.Repeat("y", 1000) + "\n"
	tests := []struct {
		name    string
		content string
		size    int64
		lim     Limits
		want    []span
	}{
		{"just over: one file", lines, 110, Limits{100, 3}, []span{{0, 110}}},
		{"excess at tolerance stays", lines, 130, Limits{100, 3}, []span{{0, 130}}},
		{"excess over tolerance splits", lines, 140, Limits{100, 3}, []span{{40, 140}, {0, 40}}},
		{"cut moves to a line start", lines, 145, Limits{100, 3}, []span{{50, 145}, {0, 50}}},
		{"burst capped at MaxFiles", lines, 1000, Limits{100, 2}, []span{{900, 1000}, {800, 900}}},
		{"one long line is cut anywhere", oneLine, 1001, Limits{300, 2}, []span{{701, 1001}, {401, 701}}},
		{"one file takes up to 2×MaxSize", lines, 200, Limits{100, 1}, []span{{0, 200}}},
		{"one file, more is dropped", lines, 250, Limits{100, 1}, []span{{150, 250}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "f")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := planSpans(f, tt.size, tt.lim)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("planSpans = %v, want %v", got, tt.want)
			}
			for _, s := range got {
				if s.end-s.off > tt.lim.MaxSize+tt.lim.MaxSize/int64(tt.lim.MaxFiles) {
					t.Errorf("span %v is over MaxSize plus tolerance", s)
				}
			}
		})
	}
}

// TestRotatorBoundsRealChild has a real child write through the inherited
// descriptor, far more than the limits keep, while the rotator rotates.
func TestRotatorBoundsRealChild(t *testing.T) {
	t.Parallel()
	const (
		maxSize  = 2 << 20
		maxFiles = 2
		lines    = 1_000_000 // about 12 MB of "line N"
	)
	state := t.TempDir()
	// A shorter check interval than production's keeps the test short: the
	// live file's overshoot is what the child writes in one interval.
	r, err := newRotator(state, Limits{MaxSize: maxSize, MaxFiles: maxFiles}, 10*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	out, err := OpenForChild(state, "web")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Watch("web"); err != nil {
		t.Fatal(err)
	}
	if err := r.Watch("web"); err != nil {
		t.Fatalf("second Watch: %v", err)
	}
	cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf(`for i in $(seq 1 %d); do echo line $i; done`, lines))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	const bound = (maxFiles+1)*maxSize + maxSize // the limit plus one MaxSize of slack
	logs := filepath.Join(state, "logs")
	var peak int64
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(60 * time.Second)
sample:
	for {
		peak = max(peak, dirSize(t, logs))
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("child: %v", err)
			}
			break sample
		case <-deadline:
			t.Fatal("child did not finish")
		case <-tick.C:
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	peak = max(peak, dirSize(t, logs))
	t.Logf("peak %d bytes on disk, bound %d", peak, bound)
	if peak > bound {
		t.Errorf("logs took %d bytes, over the bound %d", peak, bound)
	}

	// Newest output last: every file's numbers are above the older file's,
	// the live file (unless a rotation just emptied it) ends with the last line.
	live := Path(state, "web")
	files := []string{rotatedPath(live, 2), rotatedPath(live, 1), live}
	prev := 0
	for _, path := range files {
		nums := lineNumbers(t, readFile(t, path))
		if len(nums) == 0 {
			continue
		}
		if nums[0] <= prev {
			t.Errorf("%s starts at line %d, not after %d", filepath.Base(path), nums[0], prev)
		}
		prev = nums[len(nums)-1]
	}
	if prev != lines {
		t.Errorf("newest line is %d, want %d", prev, lines)
	}
	if got := lineNumbers(t, readFile(t, live)); len(got) > 0 && got[len(got)-1] != lines {
		t.Errorf("live file ends with line %d, want %d", got[len(got)-1], lines)
	}
	if _, err := os.Stat(rotatedPath(live, 3)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf(".3 exists (err %v)", err)
	}
}

// dirSize is the total size of the files in dir.
func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range entries {
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) { // renamed or removed meanwhile
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// lineNumbers parses "line N" lines, skipping the rare one torn by the
// copy-truncate window, and checks they increase.
func lineNumbers(t *testing.T, content string) []int {
	t.Helper()
	var nums []int
	for l := range strings.Lines(content) {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(l, "line "), "\n"))
		if err != nil || !strings.HasSuffix(l, "\n") {
			continue
		}
		if len(nums) > 0 && n <= nums[len(nums)-1] {
			t.Fatalf("line %d after line %d", n, nums[len(nums)-1])
		}
		nums = append(nums, n)
	}
	return nums
}

func TestRotatorChecksAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	checks := make(chan time.Time, 100)
	r, err := newRotator(state, Limits{}, checkInterval, func(service string, at time.Time) {
		if service == "web" {
			checks <- at
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f, err := OpenForChild(state, "web")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := r.Watch("web"); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() { // as chatty as it can be
		for {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			if _, err := f.WriteString("chatter\n"); err != nil {
				writerDone <- err
				return
			}
		}
	}()
	var times []time.Time
	deadline := time.After(10 * time.Second)
	for len(times) < 4 {
		select {
		case at := <-checks:
			times = append(times, at)
		case <-deadline:
			t.Fatalf("only %d checks", len(times))
		}
	}
	close(stop)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(times); i++ {
		if d := times[i].Sub(times[i-1]); d < checkInterval {
			t.Errorf("checks %d and %d only %v apart", i-1, i, d)
		}
	}
	// Once the writes stop, at most the one deferred check is left: nothing
	// keeps checking an idle file.
	quiet := time.After(3 * checkInterval)
	late := 0
	for waiting := true; waiting; {
		select {
		case <-checks:
			late++
		case <-quiet:
			waiting = false
		}
	}
	if late > 1 {
		t.Errorf("%d checks after the writes stopped, want at most 1", late)
	}
}

func TestRotatorFollowsReplacedFile(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	r, err := newRotator(state, Limits{MaxSize: 100, MaxFiles: 1}, 10*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f, err := OpenForChild(state, "web")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := r.Watch("web"); err != nil {
		t.Fatal(err)
	}
	live := Path(state, "web")
	if err := os.Remove(live); err != nil {
		t.Fatal(err)
	}
	f, err = OpenForChild(state, "web")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := r.Watch("web"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(numbered("n", 1, 20)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "rotation of the new file", func() bool {
		b, err := os.ReadFile(rotatedPath(live, 1))
		return err == nil && string(b) == numbered("n", 1, 20)
	})

	if err := r.Watch("missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Watch(missing): err = %v, want ErrNotExist", err)
	}
	r.Unwatch("web")
	r.Unwatch("web")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Watch("web"); !errors.Is(err, ErrClosed) {
		t.Errorf("Watch after Close: err = %v, want ErrClosed", err)
	}
}
