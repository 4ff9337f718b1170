package clock

import (
	"testing"
	"time"
)

func TestFakeFiresInOrderAndStops(t *testing.T) {
	c := NewFake(time.Unix(1000, 0))
	var got []int
	c.AfterFunc(3*time.Second, func() { got = append(got, 3) })
	c.AfterFunc(1*time.Second, func() { got = append(got, 1) })
	stopped := c.AfterFunc(2*time.Second, func() { got = append(got, 2) })
	if !stopped.Stop() {
		t.Fatal("Stop on a pending timer returned false")
	}
	c.Advance(2 * time.Second)
	if len(got) != 1 || got[0] != 1 {
		t.Fatalf("after 2s fired %v, want [1]", got)
	}
	if c.Pending() != 1 {
		t.Fatalf("Pending = %d, want 1", c.Pending())
	}
	c.Advance(time.Second)
	if len(got) != 2 || got[1] != 3 {
		t.Fatalf("after 3s fired %v, want [1 3]", got)
	}
	if want := time.Unix(1003, 0); !c.Now().Equal(want) {
		t.Fatalf("Now = %v, want %v", c.Now(), want)
	}
}
