package gossip

import (
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
)

// IntroduceGap is the least time between two introductions (Introduce),
// whatever the names: one push/pull brings every member its peer knows.
const IntroduceGap = 30 * time.Second

// Introduce runs a push/pull (memberlist Join) with one random live
// member, in the background, to learn of member name, which the layer
// above holds a recent record of (one the member signed) while this
// node holds it down or has never heard of it; it reports whether it
// started one.
//
// memberlist learns of a join, or of a restart after a leave, from the
// member's alive message, which each member retransmits a bounded
// number of times; a node that missed every copy knows nothing of it
// until its next push/pull with a member that does, which memberlist
// spaces out as the cluster grows (180 s at 1,000 nodes). Meanwhile it
// places replicas as if the member did not run. Nearly every member
// holds the missed one, and a push/pull carries all of them.
//
// The peer is one memberlist already lists: no address from a record
// is dialled, so records cannot make nodes connect where their writer
// chooses (a holder of a join token can mint names and write their
// records, never making them members). It does nothing for this node's
// own name, a member this node holds alive or suspect, with no live
// peer, or within IntroduceGap of the last introduction; one runs at a
// time, apart from the anti-entropy syncs'; nothing once Shutdown began.
// A name that turns out not to be a member costs one push/pull per
// IntroduceGap for as long as the caller asks.
func (c *Cluster) Introduce(name string) bool {
	if name == c.cfg.Name {
		return false
	}
	if st, known := c.State(name); known && st.Up() {
		return false
	}
	if !c.gate.enter() {
		return false
	}
	defer c.gate.exit()
	c.introMu.Lock()
	defer c.introMu.Unlock()
	if now := time.Now(); c.introducing || !c.introduced.IsZero() && now.Sub(c.introduced) < IntroduceGap {
		return false
	}
	peers := c.livePeers()
	if len(peers) == 0 {
		return false
	}
	p := peers[rand.IntN(len(peers))]
	c.introducing, c.introduced = true, time.Now()
	c.introductions.Add(1)
	c.spawn(func() {
		defer func() {
			c.introMu.Lock()
			c.introducing = false
			c.introMu.Unlock()
		}()
		c.introduce(name, p)
	})
	return true
}

// introduce runs Introduce's push/pull with p.
func (c *Cluster) introduce(name string, p *memberlist.Node) {
	addr := net.JoinHostPort(p.Addr.String(), strconv.Itoa(int(p.Port)))
	if _, err := c.ml.Join([]string{addr}); err != nil {
		c.log.Debug("push/pull to learn of a member failed", "member", name, "peer", p.Name, "err", err)
		return
	}
	st, _ := c.State(name)
	c.log.Debug("push/pull to learn of a member", "member", name, "peer", p.Name, "state", st)
}
