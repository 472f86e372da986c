package probe

import (
	"testing"
	"time"
)

func TestThresholdsAndTiming(t *testing.T) {
	p := Spec{Period: 2 * time.Second, InitialDelay: 5 * time.Second, SuccessThreshold: 2, FailureThreshold: 3}
	t0 := time.Unix(1000, 0)
	var s State
	if Due(s, p, t0, t0.Add(4*time.Second)) {
		t.Fatal("due before the initial delay")
	}
	if !Due(s, p, t0, t0.Add(5*time.Second)) {
		t.Fatal("not due after the initial delay")
	}
	s = s.Observe(true, p, t0.Add(5*time.Second))
	if s.Ready {
		t.Fatal("ready after 1 of 2 successes")
	}
	if Due(s, p, t0, t0.Add(6*time.Second)) {
		t.Fatal("due before the period passed")
	}
	s = s.Observe(true, p, t0.Add(7*time.Second))
	if !s.Ready {
		t.Fatal("not ready after 2 successes")
	}
	s = s.Observe(false, p, t0.Add(9*time.Second))
	s = s.Observe(false, p, t0.Add(11*time.Second))
	if !s.Ready {
		t.Fatal("unready after 2 of 3 failures")
	}
	s = s.Observe(false, p, t0.Add(13*time.Second))
	if s.Ready {
		t.Fatal("still ready after 3 failures")
	}
}
