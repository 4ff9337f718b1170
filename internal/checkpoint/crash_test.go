package checkpoint

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/vigil-dev/vigil/internal/fsutil/fstest"
)

// powerLoss runs a workload of Writes on a fstest.Crash and, after every
// operation that changes the file system, takes several post-power-loss
// states and reads each. It returns how many states it read and a
// description of each that broke the promise: a successful Write
// survives, and what is read is exactly what some Write wrote.
func powerLoss(t *testing.T, skipDirSync bool) (states int, violations []string) {
	const (
		writes = 60
		seeds  = 6
	)
	mem := &fstest.Crash{SkipDirSync: skipDirSync}
	if err := mem.MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]string{} // generation → its state's JSON
	var acked uint64            // the last generation whose Write returned nil
	op := 0
	mem.AfterOp = func() {
		op++
		for seed := range seeds {
			states++
			r := rand.New(rand.NewPCG(uint64(op), uint64(seed)))
			l, err := newStore(mem.Crash(r), dir).Read()
			switch {
			case err != nil && acked == 0 && errors.Is(err, ErrNotFound):
			case err != nil:
				violations = append(violations, fmt.Sprintf("op %d seed %d (acked %d): %v", op, seed, acked, err))
			case l.Generation < acked:
				violations = append(violations, fmt.Sprintf("op %d seed %d: read generation %d, but %d was acknowledged", op, seed, l.Generation, acked))
			case stateJSON(t, &l.State) != want[l.Generation]:
				violations = append(violations, fmt.Sprintf("op %d seed %d: generation %d holds another state", op, seed, l.Generation))
			}
		}
	}
	s := newStore(mem, dir)
	for g := uint64(1); g <= writes; g++ {
		st := testState(int(g*7%13), int(g)) // sizes go up and down
		want[g] = stateJSON(t, st)
		info, err := s.Write(st)
		if err != nil || info.Generation != g {
			t.Fatalf("write %d: %+v, %v", g, info, err)
		}
		acked = g
	}
	return states, violations
}

func TestPowerLoss(t *testing.T) {
	t.Parallel()
	states, violations := powerLoss(t, false)
	t.Logf("%d crash states", states)
	if states < 2000 {
		t.Errorf("only %d crash states", states)
	}
	for i, v := range violations {
		if i == 10 {
			t.Errorf("... %d violations in all", len(violations))
			break
		}
		t.Error(v)
	}
}

// TestPowerLossSeesMissingDirSync proves the harness can see the bug
// class it exists for: with directory fsyncs ignored, renames are not
// durable and some power loss must lose an acknowledged checkpoint.
func TestPowerLossSeesMissingDirSync(t *testing.T) {
	t.Parallel()
	states, violations := powerLoss(t, true)
	if len(violations) == 0 {
		t.Fatalf("no violation in %d crash states without directory fsync", states)
	}
	t.Logf("%d of %d crash states violate, e.g. %s", len(violations), states, violations[0])
}
