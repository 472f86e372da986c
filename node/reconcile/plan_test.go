package reconcile

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func rep(workload, hash string, ordinal int) Replica {
	return NewReplica("default", workload, hash, "", ordinal, Spec{Image: "echo:" + hash})
}

func running(r Replica) Container {
	return Container{ID: r.ID, Name: r.Name, Namespace: r.Namespace, Workload: r.Workload, Ordinal: r.Ordinal,
		SpecHash: r.SpecHash, State: StateRunning, PodIP: "10.22.1.2", StartedAt: t0.Add(-time.Hour)}
}

func with(c Container, f func(*Container)) Container { f(&c); return c }

// summary renders actions as "type:id" for compact expectations.
func summary(as []Action) string {
	var parts []string
	for _, a := range as {
		parts = append(parts, string(a.Type)+":"+strings.Join(a.IDs(), ">"))
	}
	return strings.Join(parts, " ")
}

func TestPlan(t *testing.T) {
	a0, a1, a2 := rep("hello", "aaaaaaaa", 0), rep("hello", "aaaaaaaa", 1), rep("hello", "aaaaaaaa", 2)
	b0, b1 := rep("hello", "bbbbbbbb", 0), rep("hello", "bbbbbbbb", 1)
	cases := []struct {
		name     string
		desired  []Replica
		observed []Container
		want     string
		requeue  time.Duration
	}{
		{name: "fresh node creates every replica", desired: []Replica{a0, a1, a2},
			want: "create:default_hello-aaaaaaaa-0 create:default_hello-aaaaaaaa-1 create:default_hello-aaaaaaaa-2"},
		{name: "steady state does nothing", desired: []Replica{a0, a1}, observed: []Container{running(a0), running(a1)}},
		{name: "agent restart with healthy containers touches nothing", desired: []Replica{a1, a0},
			observed: []Container{running(a1), running(a0)}},
		{name: "first crash restarts at once", desired: []Replica{a0},
			observed: []Container{with(running(a0), func(c *Container) { c.State = StateExited; c.ExitedAt = t0 })},
			want:     "start:default_hello-aaaaaaaa-0"},
		{name: "second crash waits out 10s backoff", desired: []Replica{a0},
			observed: []Container{with(running(a0), func(c *Container) {
				c.State, c.ExitedAt, c.StartedAt, c.BackoffStep = StateExited, t0.Add(-4*time.Second), t0.Add(-5*time.Second), 1
			})},
			requeue: 6 * time.Second},
		{name: "backoff over restarts", desired: []Replica{a0},
			observed: []Container{with(running(a0), func(c *Container) {
				c.State, c.ExitedAt, c.StartedAt, c.BackoffStep = StateExited, t0.Add(-21*time.Second), t0.Add(-30*time.Second), 2
			})},
			want: "start:default_hello-aaaaaaaa-0"},
		{name: "long run resets backoff", desired: []Replica{a0},
			observed: []Container{with(running(a0), func(c *Container) {
				c.State, c.ExitedAt, c.StartedAt, c.BackoffStep = StateExited, t0, t0.Add(-11*time.Minute), 9
			})},
			want: "start:default_hello-aaaaaaaa-0"},
		{name: "never started container is started", desired: []Replica{a0},
			observed: []Container{with(running(a0), func(c *Container) { c.State = StateCreated })},
			want:     "start:default_hello-aaaaaaaa-0"},
		{name: "half-built sandbox is rebuilt", desired: []Replica{a0},
			observed: []Container{with(running(a0), func(c *Container) { c.State, c.PodIP = StateCreated, "" })},
			want:     "replace:default_hello-aaaaaaaa-0"},
		{name: "a running sandbox left on a subnet the node moved from is rebuilt", desired: []Replica{a0, a1},
			observed: []Container{with(running(a0), func(c *Container) { c.OutsideSubnet = true }), running(a1)},
			want:     "replace:default_hello-aaaaaaaa-0"},
		{name: "orphan is removed", desired: []Replica{a0},
			observed: []Container{running(a0), running(rep("gone", "cccccccc", 0))},
			want:     "remove:default_gone-cccccccc-0"},
		{name: "spec change replaces each ordinal", desired: []Replica{b0, b1},
			observed: []Container{running(a0), running(a1)},
			want:     "replace:default_hello-aaaaaaaa-0>default_hello-bbbbbbbb-0 replace:default_hello-aaaaaaaa-1>default_hello-bbbbbbbb-1"},
		{name: "scale up adds only new ordinals", desired: []Replica{a0, a1, a2},
			observed: []Container{running(a0)},
			want:     "create:default_hello-aaaaaaaa-1 create:default_hello-aaaaaaaa-2"},
		{name: "scale down removes only surplus ordinals", desired: []Replica{a0},
			observed: []Container{running(a0), running(a1), running(a2)},
			want:     "remove:default_hello-aaaaaaaa-1 remove:default_hello-aaaaaaaa-2"},
		{name: "failed liveness or startup probe stops the container", desired: []Replica{a0, a1},
			observed: []Container{with(running(a0), func(c *Container) { c.Unhealthy = "liveness probe failed: HTTP 500" }), running(a1)},
			want:     "stop:default_hello-aaaaaaaa-0"},
		{name: "probe-stopped container restarts through the crash backoff", desired: []Replica{a0},
			observed: []Container{with(running(a0), func(c *Container) {
				c.State, c.ExitedAt, c.StartedAt, c.BackoffStep = StateExited, t0.Add(-4*time.Second), t0.Add(-30*time.Second), 1
				c.StopReason = "liveness probe failed: HTTP 500"
			})},
			requeue: 6 * time.Second},
		{name: "unhealthy container that is not desired is removed, not stopped", desired: []Replica{a0},
			observed: []Container{running(a0), with(running(a1), func(c *Container) { c.Unhealthy = "startup probe failed" })},
			want:     "remove:default_hello-aaaaaaaa-1"},
		{name: "unknown state is left alone", desired: []Replica{a0},
			observed: []Container{with(running(a0), func(c *Container) { c.State = StateUnknown })}},
		{name: "delete everything", observed: []Container{running(a0), running(a1)},
			want: "remove:default_hello-aaaaaaaa-0 remove:default_hello-aaaaaaaa-1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := Plan(tc.desired, tc.observed, t0)
			if got := summary(res.Actions); got != tc.want {
				t.Errorf("actions:\n got %q\nwant %q", got, tc.want)
			}
			if res.Requeue != tc.requeue {
				t.Errorf("requeue = %v, want %v", res.Requeue, tc.requeue)
			}
		})
	}
}

func TestPlanStopCarriesTheProbeReason(t *testing.T) {
	r := rep("hello", "aaaaaaaa", 0)
	c := with(running(r), func(c *Container) { c.Unhealthy = "startup probe failed: command exited with code 1" })
	res := Plan([]Replica{r}, []Container{c}, t0)
	if len(res.Actions) != 1 || res.Actions[0].Reason != c.Unhealthy || res.Actions[0].Old.StartedAt != c.StartedAt {
		t.Fatalf("actions %+v", res.Actions)
	}
}

func TestBackoffSequence(t *testing.T) {
	want := []time.Duration{0, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 5 * time.Minute, 5 * time.Minute}
	for step, w := range want {
		if got := Backoff(step); got != w {
			t.Errorf("Backoff(%d) = %v, want %v", step, got, w)
		}
	}
}

// TestPlanConverges applies the planned actions to a simulated runtime from
// random starting states and checks that one round reaches a state where
// Plan has nothing left to do and exactly the desired replicas run.
func TestPlanConverges(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for iter := 0; iter < 500; iter++ {
		var desired []Replica
		hash := fmt.Sprintf("%08x", rng.Intn(3))
		for i := 0; i < rng.Intn(6); i++ {
			desired = append(desired, rep("w", hash, i))
		}
		var observed []Container
		for i := 0; i < rng.Intn(6); i++ {
			c := running(rep("w", fmt.Sprintf("%08x", rng.Intn(3)), i))
			switch rng.Intn(5) {
			case 3:
				c.Unhealthy = "liveness probe failed"
			case 0:
				c.State, c.ExitedAt = StateExited, t0.Add(-time.Hour)
			case 1:
				c.State = StateCreated
			case 2:
				c.PodIP = ""
			}
			observed = append(observed, c)
		}
		res := Plan(desired, observed, t0)
		world := map[string]Container{}
		for _, c := range observed {
			world[c.ID] = c
		}
		touched := map[string]bool{}
		for _, a := range res.Actions {
			for _, id := range a.IDs() {
				if touched[id] {
					t.Fatalf("iter %d: container %s touched by two actions: %s", iter, id, summary(res.Actions))
				}
				touched[id] = true
			}
			switch a.Type {
			case Remove:
				delete(world, a.Old.ID)
			case Replace:
				delete(world, a.Old.ID)
				world[a.Replica.ID] = running(a.Replica)
			case Create, Start:
				world[a.Replica.ID] = running(a.Replica)
			case Stop:
				// Stopped, then restarted at once (first restart): a
				// fresh run that no probe has failed yet.
				world[a.Old.ID] = running(a.Replica)
			}
		}
		var after []Container
		for _, c := range world {
			after = append(after, c)
		}
		if again := Plan(desired, after, t0); len(again.Actions) != 0 {
			t.Fatalf("iter %d: not converged after one round: %s", iter, summary(again.Actions))
		}
		if len(world) != len(desired) {
			t.Fatalf("iter %d: %d containers for %d desired", iter, len(world), len(desired))
		}
	}
}

// TestTerminated: the kubelet's reasons: OOMKilled over the exit status,
// Completed for 0, Error otherwise; a status of 128+n is signal n.
func TestTerminated(t *testing.T) {
	for _, tt := range []struct {
		code   uint32
		oom    bool
		reason string
		signal int
	}{{0, false, "Completed", 0}, {3, false, "Error", 0}, {137, true, "OOMKilled", 9}, {143, false, "Error", 15}, {255, false, "Error", 0}} {
		got := Terminated(tt.code, tt.oom, time.Unix(1, 0), time.Unix(2, 0))
		if got.Reason != tt.reason || got.Signal != tt.signal || got.ExitCode != int(tt.code) {
			t.Errorf("Terminated(%d, %v) = %+v, want %s signal %d", tt.code, tt.oom, got, tt.reason, tt.signal)
		}
	}
}
