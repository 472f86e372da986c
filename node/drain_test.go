package node

import (
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

func TestDrainDelayOnlyForRunningReplicasWithGrace(t *testing.T) {
	delay := DefaultConfig().DrainDelay
	running := reconcile.Container{State: reconcile.StateRunning, GracePeriod: 30 * time.Second}
	exited := reconcile.Container{State: reconcile.StateExited, GracePeriod: 30 * time.Second}
	fenced := reconcile.Container{State: reconcile.StateRunning} // grace 0: fencing kill
	cases := []struct {
		name string
		act  reconcile.Action
		want time.Duration
	}{
		{"remove of a running replica drains", reconcile.Action{Type: reconcile.Remove, Old: running}, time.Second},
		{"replace of a running replica drains", reconcile.Action{Type: reconcile.Replace, Old: running}, time.Second},
		{"an exited container stops at once", reconcile.Action{Type: reconcile.Remove, Old: exited}, 0},
		{"a fenced StatefulSet replica is killed at once", reconcile.Action{Type: reconcile.Remove, Old: fenced}, 0},
		{"a liveness stop does not drain", reconcile.Action{Type: reconcile.Stop, Old: running}, 0},
		{"a create has nothing to drain", reconcile.Action{Type: reconcile.Create}, 0},
	}
	for _, c := range cases {
		if got := c.act.DrainDelay(delay); got != c.want {
			t.Errorf("%s: drainDelay = %v, want %v", c.name, got, c.want)
		}
	}
}
