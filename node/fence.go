package node

import (
	"context"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// fencing builds reconcile.Fence's input from this node's view.
//
// Quorum: the known nodes are every node with a status record (a node is
// known until `starling node forget`; one that left cleanly still counts)
// and every live member (a node still joining; a --dry-run agent, which
// publishes no record, counts only while it is up). Seen are this node
// and the members memberlist reports alive that answered one of this
// node's direct pings (quorumLoop, once a second) within --fence-timeout;
// a member back from dead, or one that answered no ping for longer than
// --fence-timeout (memberlist may keep a cut-off member suspect for the
// whole cut), counts only after --rejoin-settle of answers, time in
// which this node takes the state the two sides wrote apart (peerAcks). So the minority side of a partition loses its
// majority --fence-timeout after the cut, whatever memberlist's failure
// detector (one probe per interval, slowed down by Lifeguard on an
// unhealthy node) makes of it, and well before the majority side has
// declared it dead and waited --failover-timeout.
//
// Held ordinals: copies reported by a node memberlist calls alive or
// suspect, and those of a node down (dead or left) for less than
// --failover-timeout, counted from when this agent first saw it down (a
// member whose going down this agent has not recorded yet counts as down
// since now; a node memberlist does not know at all, since this agent
// started).
func (a *Agent) fencing(v *view, observed []reconcile.Container, now time.Time) (reconcile.Fencing, int, int) {
	known := map[string]bool{a.cfg.Name: true}
	for name := range v.statuses {
		known[name] = true
	}
	up, member := map[string]bool{}, map[string]bool{}
	seen := 1
	members := a.cluster.Members()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range members {
		if m.Name == a.cfg.Name {
			continue
		}
		member[m.Name] = true
		if m.State.Up() {
			up[m.Name] = true
			known[m.Name] = true
		}
		_, settling := a.memberBack[m.Name]
		if m.State == gossip.StateAlive && !settling && a.peerAcks.counts(m.Name, now, a.cfg.FenceTimeout, a.cfg.RejoinSettle) {
			seen++
		}
	}
	f := reconcile.Fencing{Quorum: reconcile.Majority(seen, len(known)), Held: map[string]map[int]bool{}, Observed: observed}
	select {
	case <-a.pinged:
	default:
		f.Unknown = true // the first round of pings after joining has not run yet
	}
	a.checkLeaseLapse(now)
	if !a.selfBack.IsZero() && now.Sub(a.selfBack) < a.cfg.RejoinSettle {
		f.Unknown = true // back from being cut off: the view is not the majority's yet
	}
	for name, s := range v.statuses {
		if name == a.cfg.Name {
			continue
		}
		if !up[name] {
			since, ok := a.memberDown[name]
			switch {
			case ok:
			case member[name]:
				since = now // went down after this view was read
			default:
				since = a.started
			}
			if now.Sub(since) >= a.cfg.FailoverTimeout {
				continue
			}
		}
		for _, r := range s.Replicas {
			if r.Phase == api.PhasePending || r.Phase == api.PhaseCreateBackOff {
				continue // no container
			}
			key := reconcile.WorkloadKey(r.Namespace, r.Workload)
			if f.Held[key] == nil {
				f.Held[key] = map[int]bool{}
			}
			f.Held[key][r.Ordinal] = true
		}
	}
	return f, seen, len(known)
}

// noteQuorum records whether this node has a quorum (f, once known) and
// logs its changes.
func (a *Agent) noteQuorum(f reconcile.Fencing, seen, known int) {
	if f.Unknown {
		return
	}
	a.mu.Lock()
	changed := f.Quorum != a.quorum
	// A quorum regained after a partition needs no settling of its own:
	// the peers it sees again count only after --rejoin-settle
	// (memberBack, peerAcks), time in which this node takes their state.
	a.quorum = f.Quorum
	a.mu.Unlock()
	if changed && f.Quorum {
		a.log.Info("quorum: this node sees a majority; StatefulSet replicas may run here", "seen", seen, "known", known)
	} else if changed {
		a.log.Warn("quorum lost: this node sees no majority; killing its StatefulSet replicas", "seen", seen, "known", known)
	}
}

// quorumLoop pings every live member once a second and records the acks
// (see fencing); it asks for a reconcile when a member's answers start or
// stop counting. It starts once the node has joined and synced, and its
// first round decides whether the quorum is known.
func (a *Agent) quorumLoop(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-a.synced:
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	fresh := map[string]bool{}
	last := time.Now()
	for first := true; ; first = false {
		if gap := time.Since(last); gap > a.cfg.FenceTimeout+time.Second {
			// This loop did not run: the agent was stopped or starved, and
			// its peers may have started its StatefulSet replicas since.
			a.mu.Lock()
			a.noteBack(time.Now())
			a.mu.Unlock()
			a.log.Warn("this agent did not run for a while (stopped or starved): StatefulSet replicas start again only once the cluster's state is back (--rejoin-settle)", "gap", gap.Round(time.Millisecond))
		}
		last = time.Now()
		var wg sync.WaitGroup
		for _, m := range a.cluster.Members() {
			if m.Name == a.cfg.Name || !m.State.Up() {
				continue
			}
			wg.Add(1)
			go func(name string) {
				defer wg.Done()
				if _, err := a.cluster.Ping(name); err == nil {
					a.mu.Lock()
					// A member first heard of while this node has no
					// quorum may be the majority it was cut off from
					// (an agent restarted inside a partition).
					if a.peerAcks.ack(name, time.Now(), a.cfg.FenceTimeout, !first && !a.quorum) {
						time.AfterFunc(a.cfg.RejoinSettle+10*time.Millisecond, a.requestReconcile)
					}
					a.mu.Unlock()
				}
			}(m.Name)
		}
		wg.Wait()
		if first {
			close(a.pinged)
		}
		now := time.Now()
		changed := false
		a.mu.Lock()
		for name, at := range a.peerAcks.last {
			if f := now.Sub(at) < a.cfg.FenceTimeout; f != fresh[name] {
				fresh[name], changed = f, true
			}
		}
		a.mu.Unlock()
		if changed || first {
			a.requestReconcile()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// peerAcks are the answers of peers to this node's quorum pings. A peer
// that did not answer for longer than the fence timeout was cut off from
// this node (or this node from it): what either side wrote meanwhile has
// not reached the other, so it counts again only once it has answered
// for the settle time (--rejoin-settle), as a member back from dead does.
// Not safe for concurrent use (the agent's mu guards it).
type peerAcks struct {
	last map[string]time.Time // last answer
	back map[string]time.Time // when answers resumed after a silence
}

func newPeerAcks() peerAcks {
	return peerAcks{last: map[string]time.Time{}, back: map[string]time.Time{}}
}

// ack records an answer of name at now and reports whether it ends a
// silence longer than timeout; an answer from a peer never heard before
// ends one when unheardIsSilence is set.
func (p *peerAcks) ack(name string, now time.Time, timeout time.Duration, unheardIsSilence bool) bool {
	prev, ok := p.last[name]
	p.last[name] = now
	if ok && now.Sub(prev) > timeout || !ok && unheardIsSilence {
		p.back[name] = now
		return true
	}
	return false
}

// counts reports whether name counts as seen at now: it answered within
// timeout and, if its answers resumed after a silence, has answered for
// settle since.
func (p *peerAcks) counts(name string, now time.Time, timeout, settle time.Duration) bool {
	if now.Sub(p.last[name]) >= timeout {
		return false
	}
	if back, ok := p.back[name]; ok {
		if now.Sub(back) < settle {
			return false
		}
		delete(p.back, name)
	}
	return true
}

// statefulWorkloads is the set of StatefulSet workload keys in v.
func statefulWorkloads(v *view) map[string]bool {
	out := map[string]bool{}
	for _, o := range v.workloads {
		if o.Kind == manifest.KindStatefulSet {
			out[reconcile.WorkloadKey(o.Namespace, o.Name)] = true
		}
	}
	return out
}

// statefulGrace bounds the grace period of a StatefulSet replica's stop:
// a stop that began before a partition must still end before the majority
// side starts a replacement, which is at least --failover-timeout after
// failure detection. It leaves --fence-timeout, --drain-delay and 2 s of
// margin out of --failover-timeout.
func (a *Agent) statefulGrace() time.Duration {
	return max(0, a.cfg.FailoverTimeout-a.cfg.FenceTimeout-a.cfg.DrainDelay-2*time.Second)
}

// stopStatefulReplicas stops this node's StatefulSet replicas on a clean
// shutdown, all at once, and publishes the node's status without them.
// Other containers keep running for the restarted agent to adopt, but a
// StatefulSet replica of a node that left starts elsewhere after
// --failover-timeout, and a stopped agent cannot fence: stopping it now
// keeps "at most one" through upgrades and restarts that take longer.
func (a *Agent) stopStatefulReplicas() {
	a.wg.Wait() // actions in flight end first
	v := a.view()
	listCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	observed, err := a.rt.List(listCtx)
	cancel()
	if err != nil {
		a.log.Warn("stop StatefulSet replicas: list containers", "err", err)
		return
	}
	stateful := statefulWorkloads(v)
	var wg sync.WaitGroup
	for _, c := range observed {
		if !stateful[reconcile.WorkloadKey(c.Namespace, c.Workload)] {
			continue
		}
		c.GracePeriod = min(c.GracePeriod, a.statefulGrace())
		wg.Add(1)
		go func(c reconcile.Container) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), c.GracePeriod+10*time.Second)
			defer cancel()
			act := reconcile.Action{Type: reconcile.Remove, Old: c, Reason: "agent stopping: a StatefulSet replica must not outlive its fencing"}
			if err := a.rt.Execute(ctx, act); err != nil {
				a.log.Warn("stop StatefulSet replica", "replica", c.Name, "err", err)
				return
			}
			a.log.Info("stopped StatefulSet replica before leaving", "replica", c.Name)
		}(c)
	}
	wg.Wait()
	listCtx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if left, err := a.rt.List(listCtx); err == nil {
		a.publishStatus(a.localReplicas(left, nil, a.probeSpecs(v, left)))
	}
}

// noteBack records that this node came back to the cluster at now (see
// selfBack) and asks for a reconcile when the settling ends, so what
// waited for it starts then. Called with a.mu held.
func (a *Agent) noteBack(now time.Time) {
	a.selfBack = now
	time.AfterFunc(a.cfg.RejoinSettle+10*time.Millisecond, a.requestReconcile)
}

// checkLeaseLapse notes this node as back (noteBack) when its last fence
// lease ran out while it held the quorum (so a renewal was due): the agent was stopped or starved
// that long, its watchdog may have killed its StatefulSet replicas and
// its peers may have started them. Whoever looks first after such a gap
// (a reconcile, or the renewal) sees it, before anything is started on a
// view from before the gap. Called with a.mu held.
func (a *Agent) checkLeaseLapse(now time.Time) {
	if !a.leaseDeadline.IsZero() && now.After(a.leaseDeadline) {
		a.leaseDeadline = time.Time{}
		if !a.quorum {
			return // fenced: no renewal was due; regaining the quorum settles
		}
		a.noteBack(now)
		a.log.Warn("this node's fence lease ran out before it was renewed (the agent was stopped or starved): StatefulSet replicas start again only after --rejoin-settle")
	}
}
