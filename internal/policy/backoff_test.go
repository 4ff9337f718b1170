package policy

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// defaultBackoff mirrors the defaults package config applies.
var defaultBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 30 * time.Second, Multiplier: 2, Jitter: 0.2, ResetAfter: time.Minute}

func TestDelayGrowsAndCaps(t *testing.T) {
	t.Parallel()
	want := []time.Duration{
		100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3200 * time.Millisecond, 6400 * time.Millisecond, 12800 * time.Millisecond,
		25600 * time.Millisecond, 30 * time.Second, 30 * time.Second,
	}
	for n, w := range want {
		if got := defaultBackoff.Delay(n, 0); got != w {
			t.Errorf("Delay(%d, 0) = %v, want %v", n, got, w)
		}
	}
}

func TestDelayJitter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		b    Backoff
		n    int
		u    float64
		want time.Duration
	}{
		{defaultBackoff, 0, 0.5, 90 * time.Millisecond},
		{defaultBackoff, 3, 0.25, 760 * time.Millisecond},
		{defaultBackoff, 30, 0.5, 27 * time.Second}, // jitter applies after the cap
		{defaultBackoff, 0, math.NaN(), 100 * time.Millisecond},
		{defaultBackoff, 0, -3, 100 * time.Millisecond},
		{defaultBackoff, 0, 7, 80 * time.Millisecond}, // u clamped to 1
		{Backoff{Initial: time.Second, Max: time.Second, Multiplier: 2, Jitter: 5}, 0, 0.5, 500 * time.Millisecond},
		{Backoff{Initial: time.Second, Max: time.Second, Multiplier: 2, Jitter: -1}, 0, 0.5, time.Second},
		{Backoff{Initial: time.Second, Max: time.Second, Multiplier: 2, Jitter: math.NaN()}, 0, 0.5, time.Second},
	}
	for _, tt := range tests {
		if got := tt.b.Delay(tt.n, tt.u); got != tt.want {
			t.Errorf("%+v.Delay(%d, %v) = %v, want %v", tt.b, tt.n, tt.u, got, tt.want)
		}
	}
}

// TestDelayBounds checks, over many random draws, that jitter only shortens
// (so Max is a true bound), shortens by at most Jitter, and never makes a
// later attempt's un-jittered schedule smaller.
func TestDelayBounds(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		b := Backoff{
			Initial:    time.Duration(rng.Int64N(int64(time.Second))) + 1,
			Multiplier: 1 + rng.Float64()*4,
			Jitter:     rng.Float64(),
		}
		b.Max = b.Initial + time.Duration(rng.Int64N(int64(time.Minute)))
		n, u := rng.IntN(200), rng.Float64()
		d, schedule := b.Delay(n, u), b.Delay(n, 0)
		if d < 0 || d > b.Max || schedule > b.Max {
			t.Fatalf("%+v.Delay(%d, %v) = %v (schedule %v), outside [0, Max]", b, n, u, d, schedule)
		}
		if floor := time.Duration(float64(schedule) * (1 - b.Jitter)); d < floor-1 || d > schedule {
			t.Fatalf("%+v.Delay(%d, %v) = %v, want within [%v, %v]", b, n, u, d, floor, schedule)
		}
		if next := b.Delay(n+1, 0); next < schedule {
			t.Fatalf("%+v: schedule shrank from %v (n=%d) to %v", b, schedule, n, next)
		}
	}
}

func TestDelayZeroInitial(t *testing.T) {
	t.Parallel()
	for _, b := range []Backoff{{}, {Max: time.Minute, Multiplier: 2, Jitter: 0.2}, {Initial: -time.Second, Max: time.Minute, Multiplier: 2}} {
		for _, n := range []int{0, 1, 10, math.MaxInt} {
			if got := b.Delay(n, 0.5); got != 0 {
				t.Errorf("%+v.Delay(%d) = %v, want 0", b, n, got)
			}
		}
	}
}

func TestDelayNoOverflow(t *testing.T) {
	t.Parallel()
	huge := Backoff{Initial: time.Second, Max: time.Duration(math.MaxInt64), Multiplier: 1e300, Jitter: 1}
	for _, n := range []int{64, 1000, 1 << 40, math.MaxInt} {
		if got := defaultBackoff.Delay(n, 0); got != 30*time.Second {
			t.Errorf("default Delay(%d) = %v, want the 30s cap", n, got)
		}
		if got := huge.Delay(n, 0); got != huge.Max {
			t.Errorf("huge Delay(%d) = %v, want Max (%v)", n, got, huge.Max)
		}
		if got, want := huge.Delay(n, 0.5), huge.Max/2; got < want-time.Microsecond || got > want+time.Microsecond {
			t.Errorf("huge Delay(%d, 0.5) = %v, want about %v", n, got, want)
		}
	}
}

func TestDelayOddSettings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		b    Backoff
		n    int
		want time.Duration
	}{
		{"negative n is the first attempt", defaultBackoff, -5, 100 * time.Millisecond},
		{"multiplier 1 is constant", Backoff{Initial: time.Second, Max: time.Minute, Multiplier: 1}, 50, time.Second},
		{"zero multiplier is constant", Backoff{Initial: time.Second, Max: time.Minute}, 50, time.Second},
		{"multiplier below 1 is constant", Backoff{Initial: time.Second, Max: time.Minute, Multiplier: 0.5}, 3, time.Second},
		{"NaN multiplier is constant", Backoff{Initial: time.Second, Max: time.Minute, Multiplier: math.NaN()}, 3, time.Second},
		{"max below initial is initial", Backoff{Initial: time.Second, Multiplier: 2}, 10, time.Second},
	}
	for _, tt := range tests {
		if got := tt.b.Delay(tt.n, 0); got != tt.want {
			t.Errorf("%s: Delay(%d) = %v, want %v", tt.name, tt.n, got, tt.want)
		}
	}
}
