package reconcile

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// decision builds a Decide input for node "a" owning all of all (unless
// owner says otherwise), with containers observed and the given quorum.
func decision(all []Replica, owner map[string]string, observed []Container, f Fencing) Decision {
	own := map[string]string{}
	for _, r := range all {
		own[r.ID] = "a"
	}
	for id, n := range owner {
		own[id] = n
	}
	return Decision{
		Ownership: Ownership{Self: "a", All: all, Owner: ownerOf(own), Observed: observed, Now: t0, Timeout: time.Minute},
		Budget: Budget{Ready: func(string) bool { return true }, Strategies: map[string]Strategy{
			"default/db": {Replicas: 2, MaxUnavailable: 1, Reverse: true}, "default/web": {Replicas: 1, MaxUnavailable: 1}}},
		Fencing:       f,
		Stateful:      map[string]bool{"default/db": true},
		StatefulGrace: 8 * time.Second,
	}
}

// One pass, composed: the cases where the steps meet.
func TestDecideComposesOwnershipRolloutFencingAndPlan(t *testing.T) {
	db0, db1 := stateful("aaaaaaaa", 0), stateful("aaaaaaaa", 1)
	web := rep("web", "aaaaaaaa", 0)
	slow := running(db0)
	slow.GracePeriod = 30 * time.Second
	for _, tc := range []struct {
		name    string
		d       Decision
		mine    string
		actions string
		fenced  bool
		requeue time.Duration
	}{
		{"quorum: everything owned is created", decision([]Replica{db0, web}, nil, nil, Fencing{Quorum: true}),
			"db-0 web-aaaaaaaa-0", "create db-0; create web-aaaaaaaa-0", false, 0},
		{"fenced: the StatefulSet replica is killed at once, the Deployment keeps running",
			decision([]Replica{db0, web}, nil, []Container{slow, running(web)}, Fencing{}),
			"web-aaaaaaaa-0", "remove db-0 grace 0s (fenced: no quorum)", true, 0},
		{"not owned any more, quorum: its stop is bounded by the StatefulSet grace",
			decision([]Replica{db0}, map[string]string{db0.ID: "b"}, []Container{slow}, Fencing{Quorum: true, Occupied: map[string]map[int]bool{}}),
			"", "remove db-0 grace 8s (container is not desired)", false, 0},
		{"quorum unknown: what runs stays, nothing starts",
			decision([]Replica{db0, db1}, nil, []Container{running(db1)}, Fencing{Unknown: true}),
			"db-1", "", false, 0},
		{"handing a Deployment replica off: kept until the new owner's copy is ready, watched every second",
			decision([]Replica{web}, map[string]string{web.ID: "b"}, []Container{running(web)}, Fencing{Quorum: true}),
			"web-aaaaaaaa-0", "", false, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := Decide(tc.d, t0)
			if got := names(out.Mine); got != tc.mine {
				t.Errorf("mine %q, want %q", got, tc.mine)
			}
			if got := actionsString(out.Actions); got != tc.actions {
				t.Errorf("actions %q, want %q", got, tc.actions)
			}
			if out.Fenced != tc.fenced || out.Requeue != tc.requeue {
				t.Errorf("fenced %v requeue %v, want %v %v", out.Fenced, out.Requeue, tc.fenced, tc.requeue)
			}
		})
	}
}

func actionsString(acts []Action) string {
	var s string
	for i, a := range acts {
		if i > 0 {
			s += "; "
		}
		name := a.Replica.Name
		if name == "" {
			name = a.Old.Name
		}
		s += string(a.Type) + " " + name
		if a.Type == Remove || a.Type == Stop || a.Type == Replace {
			s += fmt.Sprintf(" grace %v (%s)", a.Old.GracePeriod, a.Reason)
		}
	}
	return s
}

// Properties over random clusters: Decide is deterministic; a node that
// knows it has no quorum runs no StatefulSet replica and kills every one
// it has at once; every stop of a StatefulSet container is within its
// grace; nothing is created that the node does not run.
func TestDecideProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var all []Replica
		owner := map[string]string{}
		var observed []Container
		for i := range rapid.IntRange(0, 3).Draw(rt, "stateful") {
			all = append(all, stateful("aaaaaaaa", i))
		}
		for i := range rapid.IntRange(0, 3).Draw(rt, "deployment") {
			all = append(all, rep("web", "aaaaaaaa", i))
		}
		for _, r := range all {
			if rapid.Bool().Draw(rt, "elsewhere "+r.Name) {
				owner[r.ID] = "b"
			}
			if rapid.Bool().Draw(rt, "running "+r.Name) {
				c := running(r)
				c.GracePeriod = time.Duration(rapid.IntRange(0, 60).Draw(rt, "grace "+r.Name)) * time.Second
				observed = append(observed, c)
			}
		}
		f := Fencing{Quorum: rapid.Bool().Draw(rt, "quorum"), Unknown: rapid.Bool().Draw(rt, "unknown")}
		d := decision(all, owner, observed, f)
		out := Decide(d, t0)
		if again := Decide(d, t0); actionsString(again.Actions) != actionsString(out.Actions) || names(again.Mine) != names(out.Mine) {
			rt.Fatalf("not deterministic: %q then %q", actionsString(out.Actions), actionsString(again.Actions))
		}
		mine := map[string]bool{}
		for _, r := range out.Mine {
			mine[r.ID] = true
			if out.Fenced && r.AtMostOne {
				rt.Fatalf("fenced, yet runs %s", r.Name)
			}
		}
		for _, a := range out.Actions {
			if a.Replica.ID != "" && (a.Type == Create || a.Type == Replace) && !mine[a.Replica.ID] {
				rt.Fatalf("%s %s, which it does not run", a.Type, a.Replica.Name)
			}
			if a.Old.ID != "" && d.Stateful[WorkloadKey(a.Old.Namespace, a.Old.Workload)] && (a.Type == Remove || a.Type == Stop || a.Type == Replace) {
				if a.Old.GracePeriod > d.StatefulGrace || out.Fenced && a.Old.GracePeriod != 0 {
					rt.Fatalf("%s of %s with grace %v (fenced %v)", a.Type, a.Old.Name, a.Old.GracePeriod, out.Fenced)
				}
			}
		}
	})
}

// What the node knows beyond containerd, decided in the pass, not edited
// into its list: a container outside the settled subnet is replaced, one
// whose liveness failed is stopped, an action under a failure's backoff
// waits (and the pass comes back when it may run), and a create gets its
// namespace's Service variables unless the pod opts out.
func TestDecideTakesLocalKnowledgeBackoffAndServiceLinks(t *testing.T) {
	web0, web1 := rep("web", "aaaaaaaa", 0), rep("web", "aaaaaaaa", 1)
	quiet := rep("quiet", "aaaaaaaa", 0)
	quiet.Spec.NoServiceLinks = true
	moved, sick := running(web0), running(web1)
	moved.PodIP, sick.PodIP = "10.244.9.5", "10.244.1.6"
	observed := []Container{moved, sick}
	d := decision([]Replica{web0, web1, quiet}, nil, observed, Fencing{Quorum: true})
	d.Budget.Strategies["default/quiet"] = Strategy{Replicas: 1, MaxUnavailable: 1}
	d.Budget.Strategies["default/web"] = Strategy{Replicas: 2, MaxUnavailable: 2}
	d.Local = Local{Subnet: netip.MustParsePrefix("10.244.1.0/24"), Unhealthy: map[string]string{sick.ID: "liveness probe failed: HTTP 500"}}
	d.ServiceEnv = func(ns string) []EnvVar { return []EnvVar{{Name: "WEB_SERVICE_HOST", Value: ns}} }
	out := Decide(d, t0)
	t.Logf("actions: %s", actionsString(out.Actions))
	if observed[0].OutsideSubnet || observed[1].Unhealthy != "" {
		t.Fatalf("Decide edited the observed containers: %+v", observed)
	}
	if !out.Observed[0].OutsideSubnet || out.Observed[1].Unhealthy == "" {
		t.Fatalf("Output.Observed not marked: %+v", out.Observed)
	}
	byName := map[string]Action{}
	for _, a := range out.Actions {
		byName[string(a.Type)+" "+a.Replica.Name+a.Old.Name] = a
	}
	create, ok := byName["create quiet-aaaaaaaa-0"]
	if !ok || len(create.Replica.ServiceEnv) != 0 {
		t.Errorf("quiet (enableServiceLinks: false) created with %v, ok %v; actions %s", create.Replica.ServiceEnv, ok, actionsString(out.Actions))
	}
	if len(out.Actions) < 2 {
		t.Fatalf("want the moved container replaced and the sick one stopped: %s", actionsString(out.Actions))
	}
	for _, a := range out.Actions {
		if a.Type == Replace && len(a.Replica.ServiceEnv) != 1 {
			t.Errorf("replace of %s without its Service variables", a.Replica.Name)
		}
	}

	// The same pass with a failed action on the moved container: it
	// waits 3 s, the rest goes on, and the pass comes back then.
	d.Backoff = map[string]time.Time{moved.ID: t0.Add(3 * time.Second), sick.ID: t0.Add(-time.Second)}
	later := Decide(d, t0)
	if len(later.Actions) != len(out.Actions)-1 {
		t.Errorf("with a backoff on %s: %s, want one action fewer than %s", moved.ID, actionsString(later.Actions), actionsString(out.Actions))
	}
	for _, a := range later.Actions {
		for _, id := range a.IDs() {
			if id == moved.ID {
				t.Errorf("an action on a container under backoff: %s", actionsString(later.Actions))
			}
		}
	}
	if later.Requeue <= 0 || later.Requeue > 3*time.Second {
		t.Errorf("requeue %v, want at most the 3 s backoff", later.Requeue)
	}
}
