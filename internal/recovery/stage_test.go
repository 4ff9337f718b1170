package recovery

import (
	"errors"
	"slices"
	"testing"
)

// legal is the transition table written out independently of the code:
// every pair not listed here must be rejected.
var legal = map[[2]Stage]bool{
	{Crashed, Detecting}:               true,
	{Detecting, Inventorying}:          true,
	{Inventorying, Restoring}:          true,
	{Restoring, Reconciling}:           true,
	{Reconciling, Live}:                true,
	{Detecting, Detecting}:             true,
	{Inventorying, Inventorying}:       true,
	{Restoring, Restoring}:             true,
	{Reconciling, Reconciling}:         true,
	{Detecting, DetectingFailed}:       true,
	{Inventorying, InventoryingFailed}: true,
	{Restoring, RestoringFailed}:       true,
	{Reconciling, ReconcilingFailed}:   true,
	{DetectingFailed, Detecting}:       true,
	{InventoryingFailed, Inventorying}: true,
	{RestoringFailed, Restoring}:       true,
	{ReconcilingFailed, Reconciling}:   true,
}

func TestTransitionTableExhaustive(t *testing.T) {
	all := append(Stages(), "", "bogus", "live_failed", "crashed_failed")
	if n := len(Stages()); n != 10 {
		t.Fatalf("Stages() has %d stages, want 10", n)
	}
	checked := 0
	for _, from := range all {
		for _, to := range all {
			want := legal[[2]Stage{from, to}]
			err := CheckTransition(from, to)
			if got := err == nil; got != want {
				t.Errorf("CheckTransition(%q, %q) = %v, want legal=%v", from, to, err, want)
			}
			if got := slices.Contains(from.Successors(), to); got != want {
				t.Errorf("%q.Successors() contains %q = %v, want %v", from, to, got, want)
			}
			if err != nil && !errors.Is(err, ErrInvalidTransition) {
				t.Errorf("CheckTransition(%q, %q) = %v, does not wrap ErrInvalidTransition", from, to, err)
			}
			checked++
		}
	}
	if checked != len(all)*len(all) {
		t.Fatal("not every pair was checked")
	}
	err := CheckTransition(Live, Restoring)
	if want := `recovery: invalid transition "live" → "restoring"`; err == nil || err.Error() != want {
		t.Errorf("error = %v, want %s", err, want)
	}
}

func TestStagePredicates(t *testing.T) {
	for _, s := range Stages() {
		working := s == Detecting || s == Inventorying || s == Restoring || s == Reconciling
		if s.Working() != working {
			t.Errorf("%q.Working() = %v", s, s.Working())
		}
		if working {
			if f := s.failure(); !f.Failed() || f.retried() != s || !f.Valid() {
				t.Errorf("%q: failure state %q is not a valid failure state of it", s, f)
			}
		}
		if s.Failed() != (len(s.Successors()) == 1 && s.Successors()[0] == s.retried() && s != Crashed) {
			t.Errorf("%q.Failed() = %v disagrees with its successors", s, s.Failed())
		}
	}
	if Stage("bogus_failed").Failed() || Stage("bogus").Valid() {
		t.Error("an unknown stage is reported as known")
	}
	// The table is not handed out for modification.
	Crashed.Successors()[0] = Live
	if CheckTransition(Crashed, Detecting) != nil {
		t.Error("Successors returned the table itself")
	}
}
