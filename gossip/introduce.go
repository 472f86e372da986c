package gossip

import (
	"net"
	"strconv"
	"time"
)

// IntroduceGap is the least time between two introductions (Introduce),
// whatever the names: one push/pull brings every member its peer knows.
const IntroduceGap = 30 * time.Second

// Introduce runs a push/pull (memberlist Join) with live member via, in
// the background, to learn of member name, which the layer above holds
// a recent record of (one the member signed) and via says it holds up,
// while this node holds it down or has never heard of it; it reports
// whether it started one.
//
// memberlist learns of a join, or of a restart after a leave, from the
// member's alive message, which each member retransmits a bounded
// number of times; a node that missed every copy knows nothing of it
// until its next push/pull with a member that does, which memberlist
// spaces out as the cluster grows (180 s at 1,000 nodes). Meanwhile it
// places replicas as if the member did not run. A push/pull carries
// every member via knows.
//
// The peer is one memberlist lists alive: no address from a record is
// dialled, so records cannot make nodes connect where their writer
// chooses. It does nothing for this node's own name, a member this node
// holds alive or suspect, a via that is not alive here, or within
// IntroduceGap of the last introduction; one runs at a time, and none
// once Leave or Shutdown began. The push/pull itself takes no slot of
// the anti-entropy syncs (syncSem; a sync it leads to does).
func (c *Cluster) Introduce(name, via string) bool {
	if name == c.cfg.Name || via == c.cfg.Name {
		return false
	}
	if st, known := c.State(name); known && st.Up() {
		return false
	}
	if !c.gate.enter() {
		return false
	}
	defer c.gate.exit()
	if c.ctx.Err() != nil {
		return false
	}
	c.membersMu.Lock()
	p, ok := c.members[via]
	var addr string
	if ok && p.State == StateAlive && p.node != nil {
		addr = net.JoinHostPort(p.Addr, strconv.Itoa(int(p.Port)))
	}
	c.membersMu.Unlock()
	if addr == "" {
		return false
	}
	c.introMu.Lock()
	defer c.introMu.Unlock()
	if now := time.Now(); c.introducing || !c.introduced.IsZero() && now.Sub(c.introduced) < IntroduceGap {
		return false
	}
	c.introducing, c.introduced = true, time.Now()
	c.introductions.Add(1)
	c.spawn(func() {
		defer func() {
			c.introMu.Lock()
			c.introducing = false
			c.introMu.Unlock()
		}()
		if c.ctx.Err() != nil {
			return
		}
		if _, err := c.ml.Join([]string{addr}); err != nil {
			c.log.Debug("push/pull to learn of a member failed", "member", name, "via", via, "err", err)
			return
		}
		st, _ := c.State(name)
		c.log.Debug("push/pull to learn of a member", "member", name, "via", via, "state", st)
	})
	return true
}

// IntroduceWait is how long until Introduce could start a push/pull (0:
// now), so that a caller asks nothing it could not act on.
func (c *Cluster) IntroduceWait() time.Duration {
	c.introMu.Lock()
	defer c.introMu.Unlock()
	if c.introducing {
		return IntroduceGap
	}
	if c.introduced.IsZero() {
		return 0
	}
	return max(0, IntroduceGap-time.Since(c.introduced))
}
