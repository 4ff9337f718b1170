package policy

import (
	"math"
	"time"
)

// Backoff is the delay schedule for consecutive automatic restarts.
type Backoff struct {
	// Initial is the delay before the first restart; 0 (or less) makes every
	// delay 0.
	Initial time.Duration
	// Max caps every delay; a Max below Initial is taken as Initial.
	Max time.Duration
	// Multiplier is the growth per consecutive restart; below 1 (including the
	// zero value) it is taken as 1, a constant delay.
	Multiplier float64
	// Jitter is the largest fraction by which a delay is shortened at random,
	// clamped to [0,1]; 0 disables it.
	Jitter float64
	// ResetAfter is the uptime after which an instance counts as stable and
	// the consecutive-restart count starts again from 0. With 0 every
	// instance counts as stable.
	ResetAfter time.Duration
}

// Delay returns the wait before the n-th consecutive restart (n from 0):
// Initial × Multiplier^n capped at Max, then multiplied by 1 - Jitter×u.
// u is a uniform random number in [0,1) supplied by the caller (clamped to
// [0,1], NaN taken as 0). Jitter only shortens, so the result always lies in
// [0, max(Max, Initial)]; huge n cannot overflow.
func (b Backoff) Delay(n int, u float64) time.Duration {
	if b.Initial <= 0 {
		return 0
	}
	ceiling := max(b.Max, b.Initial)
	mult := b.Multiplier
	if !(mult >= 1) {
		mult = 1
	}
	// Pow returns +Inf on overflow, which min caps like any large schedule.
	schedule := min(float64(b.Initial)*math.Pow(mult, float64(max(n, 0))), float64(ceiling))
	d := schedule * (1 - clampUnit(b.Jitter)*clampUnit(u))
	if d >= float64(ceiling) {
		// float64 rounds a ceiling near MaxInt64 up to 2^63, which would not
		// convert back to a Duration.
		return ceiling
	}
	return time.Duration(d)
}

// clampUnit clamps x to [0,1], taking NaN as 0.
func clampUnit(x float64) float64 {
	if !(x > 0) {
		return 0
	}
	return min(x, 1)
}
