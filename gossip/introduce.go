package gossip

import (
	"net/netip"
	"time"
)

// IntroduceEvery is the least time between two introductions of the
// same name (Introduce): a name whose address does not answer (a node
// that is gone but whose records stay) costs one failed push/pull per
// interval.
const IntroduceEvery = time.Minute

// Introduce runs a push/pull (memberlist Join) with addr, in the
// background, when name is a member this node has never heard of and
// another source (a record the member signed) says it is one, at addr;
// it reports whether it started one.
//
// memberlist learns of a join from the joiner's alive message, which
// each member retransmits a bounded number of times; a node that missed
// every copy knows nothing of the member until its next push/pull with
// one that does, which memberlist spaces out as the cluster grows (180 s
// at 1,000 nodes). Meanwhile it places replicas as if the member did not
// exist. The push/pull with the member itself carries its alive state.
//
// It does nothing for this node's own name, a member already known in
// any state (the failure detector decides about those), an address that
// is not a unicast IP and port, or a name introduced less than
// IntroduceEvery ago; at most maxConcurrentSyncs exchanges run at once,
// shared with rejoinSender.
func (c *Cluster) Introduce(name string, addr netip.AddrPort) bool {
	if name == c.cfg.Name || !addr.IsValid() || addr.Port() == 0 || !addr.Addr().IsGlobalUnicast() && !addr.Addr().IsLoopback() {
		return false
	}
	if _, known := c.State(name); known {
		return false
	}
	now := time.Now()
	c.introMu.Lock()
	if last, ok := c.introduced[name]; ok && now.Sub(last) < IntroduceEvery {
		c.introMu.Unlock()
		return false
	}
	for n, t := range c.introduced {
		if now.Sub(t) >= IntroduceEvery {
			delete(c.introduced, n) // the map holds at most a minute's names
		}
	}
	select {
	case c.syncSem <- struct{}{}:
	default:
		c.introMu.Unlock()
		return false // tried again on the caller's next look
	}
	c.introduced[name] = now
	c.introMu.Unlock()
	c.introductions.Add(1)
	c.spawn(func() {
		defer func() { <-c.syncSem }()
		if _, err := c.ml.Join([]string{addr.String()}); err != nil {
			c.log.Debug("push/pull with a member known only from its records failed", "member", name, "addr", addr, "err", err)
			return
		}
		if _, known := c.State(name); known {
			c.log.Debug("learned of a member from its records, not from gossip", "member", name, "addr", addr)
		}
	})
	return true
}
