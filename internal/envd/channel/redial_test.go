package channel

import (
	"testing"
	"time"
)

func TestJitterStaysInTheUpperHalf(t *testing.T) {
	for _, d := range []time.Duration{0, 1, 2, 3, 50 * time.Millisecond, 5 * time.Second} {
		lo, hi := d, time.Duration(0)
		for range 2000 {
			j := jitter(d)
			if j < d/2 || j > d {
				t.Fatalf("jitter(%v) = %v, outside [%v, %v]", d, j, d/2, d)
			}
			lo, hi = min(lo, j), max(hi, j)
		}
		// Guests that lost the node together must spread out, not redial in step.
		if d >= 50*time.Millisecond && hi-lo < d/4 {
			t.Errorf("jitter(%v) spread only over [%v, %v] in 2000 draws", d, lo, hi)
		}
	}
}

func TestRedialDelayIsHalfTheAbsence(t *testing.T) {
	lo, hi := 50*time.Millisecond, 30*time.Second
	for _, c := range []struct{ away, want time.Duration }{
		{0, lo},                     // the node just went: redial soon
		{90 * time.Millisecond, lo}, // the floor holds below 2×lo
		{time.Second, 500 * time.Millisecond},
		{20 * time.Second, 10 * time.Second},
		{59 * time.Second, 29500 * time.Millisecond},
		{60 * time.Second, hi}, // the ceiling from a minute on
		{time.Hour, hi},
	} {
		if got := redialDelay(c.away, lo, hi); got != c.want {
			t.Errorf("redialDelay(%v) = %v, want %v", c.away, got, c.want)
		}
	}
}
