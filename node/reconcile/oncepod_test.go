package reconcile

import (
	"errors"
	"strings"
	"testing"
)

// TestAReadWriteOncePodClaimHasOneUserAtATime: of two replicas that
// mount a ReadWriteOncePod claim, one is created, the other waits naming
// it; while a container of the first exists the second keeps waiting; a
// ReadWriteOnce claim holds nobody back; a Replace of the user by its
// own new copy goes ahead.
func TestAReadWriteOncePodClaimHasOneUserAtATime(t *testing.T) {
	mount := func(r Replica) Replica {
		r.Spec.Volumes = []Volume{{Name: "data", Claim: "db"}}
		return r
	}
	w0, w1 := mount(rep("web", "aaaaaaaa", 0)), mount(rep("web", "aaaaaaaa", 1))
	claims := func(string, string) (string, error) { return "uid-db", nil }
	decide := func(oncePod map[string]bool, observed ...Container) Output {
		d := decision([]Replica{w0, w1}, nil, observed, Fencing{Quorum: true})
		d.Budget.Strategies["default/web"] = Strategy{Replicas: 2, MaxUnavailable: 2}
		d.Claims, d.OncePod = claims, oncePod
		return Decide(d, t0)
	}
	rwop := map[string]bool{"default/db": true}
	out := decide(rwop)
	if len(out.Actions) != 1 || out.Actions[0].Replica.ID != w0.ID {
		t.Fatalf("actions %s, want w0 created alone", actionsString(out.Actions))
	}
	if err := out.ConfigErrors[w1.ID]; err == nil || !strings.Contains(err.Error(), "ReadWriteOncePod and replica "+w0.Name+" uses it") {
		t.Errorf("w1 waits for: %v", err)
	}
	if wait := new(ClaimWait); !errors.As(out.ConfigErrors[w1.ID], &wait) {
		t.Errorf("w1's wait is a %T, want a *ClaimWait (Pending)", out.ConfigErrors[w1.ID])
	}
	if out := decide(rwop, running(w0)); len(out.Actions) != 0 || out.ConfigErrors[w1.ID] == nil {
		t.Errorf("with w0 running: actions %s, errors %v; want w1 still waiting", actionsString(out.Actions), out.ConfigErrors)
	}
	if out := decide(nil); len(out.Actions) != 2 {
		t.Errorf("a ReadWriteOnce claim: actions %s, want both created", actionsString(out.Actions))
	}
	// A user on its way out (its Deployment deleted: no desired replica)
	// holds the claim until its container is gone, by the claims its
	// container records.
	leaving := running(mount(rep("old", "cccccccc", 0)))
	leaving.Claims = []string{"default/db"}
	if out := decide(rwop, leaving); out.ConfigErrors[w0.ID] == nil || !strings.Contains(out.ConfigErrors[w0.ID].Error(), "replica old-") {
		t.Errorf("with the old user stopping: actions %s, errors %v; want w0 waiting for it", actionsString(out.Actions), out.ConfigErrors)
	}
	// A replace: the copy replaced is the user, the new copy goes ahead.
	next := mount(rep("web", "bbbbbbbb", 0))
	if err := oncePodWait(next, w0.ID, rwop, map[string]Replica{"default/db": w0}); err != nil {
		t.Errorf("the new copy of the user, replacing it: %v", err)
	}
}
