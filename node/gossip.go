package node

import (
	"fmt"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/member"
)

// startGossip checks the node's identity and the age of its state, then
// starts memberlist (without joining; Run does that). dropped: the state
// was older than --tombstone-ttl and discarded (the node resyncs it).
func (a *Agent) startGossip(tune func(*gossip.Config)) (dropped bool, err error) {
	if err := checkIdentity(a.store, a.cfg.Name, a.cfg.DataDir); err != nil {
		return false, err
	}
	if staleState(a.store, a.cfg.TombstoneTTL) {
		if len(joinTargets(a.cfg.Join, a.store)) == 0 {
			a.log.Warn("state is older than --tombstone-ttl but there is no peer to resync from; keeping it")
		} else {
			a.log.Warn("this node was away longer than --tombstone-ttl: discarding its desired state and resyncing from peers", "ttl", a.cfg.TombstoneTTL)
			if err := a.store.DropRecords(); err != nil {
				return false, err
			}
			dropped = true
		}
	}
	host, port, err := trust.SplitHostPort(a.cfg.BindAddr, 7946)
	if err != nil {
		return false, fmt.Errorf("--bind %q: %w", a.cfg.BindAddr, err)
	}
	gc := gossip.DefaultConfig()
	gc.Name, gc.BindAddr, gc.BindPort = a.cfg.Name, host, port
	since := memberSince(a.store, a.log)
	gc.Meta = member.EncodeMeta(member.Meta{Since: since, Started: a.started.UnixNano()})
	a.guard.auth = newMemberAuth(a.cfg.Name, a.guard.id.Key, since, a.started.UnixNano(), a.store, a.log, a.metrics.rejectedMembers)
	gc.SignMeta, gc.CheckAlive = a.guard.auth.sign, a.guard.auth.check
	if a.cfg.Advertise != "" {
		ahost, aport, err := trust.SplitHostPort(a.cfg.Advertise, port)
		if err != nil {
			return false, fmt.Errorf("--advertise %q: %w", a.cfg.Advertise, err)
		}
		gc.AdvertiseAddr, gc.AdvertisePort = ahost, aport
	}
	if a.guard.trust != nil {
		keys := a.guard.trust.Creds.GossipKeys
		gc.SecretKey, gc.ExtraKeys = keys[0], keys[1:]
	}
	gc.Logger = a.log.With("component", "gossip")
	// Hybrid logical clock: every received version advances the clock, and
	// so does every version already stored (a restarted node, or one whose
	// wall clock is behind, still writes versions that win over what it has
	// seen: a delete after an apply is never older than the apply).
	gc.Clock = a.clock
	gc.Accept = a.guard.rejects.check
	// Peers' questions (quorum counts, claim checks, members up) are answered once
	// the agent is wired (wire).
	gc.Answer = func(from string, q []byte) []byte {
		f := a.mem.answerer.Load()
		switch {
		case f == nil || len(q) == 0:
			return nil
		case q[0] == claimQuestion:
			return a.own.subnets.answerClaim(from, q[1:])
		case q[0] == upQuestion:
			return a.mem.members.answerUp(q[1:])
		case q[0] == settleQuestion && len(q) == 1:
			return a.mem.members.answerSettle(from, time.Now())
		}
		return f.answer(from, q)
	}
	if all, err := a.store.Snapshot(); err == nil {
		for _, r := range all {
			a.clock.Update(r.Version)
		}
	}
	if a.cfg.ProbeInterval > 0 {
		gc.ProbeInterval = a.cfg.ProbeInterval
	}
	if a.cfg.ProbeTimeout > 0 {
		gc.ProbeTimeout = a.cfg.ProbeTimeout
	}
	if a.cfg.SuspicionMult > 0 {
		gc.SuspicionMult = a.cfg.SuspicionMult
	}
	if tune != nil {
		tune(&gc)
	}
	a.mem.cluster, err = gossip.New(gc, a.store)
	if err != nil {
		return false, fmt.Errorf("start gossip on %s: %w", a.cfg.BindAddr, err)
	}
	return dropped, nil
}
