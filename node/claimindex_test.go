package node

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/ipam"
)

// The index's winners are ipam.Winners over the claims it holds, after
// any sequence of claims made, moved and dropped (narrow and wide), and
// near finds every claim that overlaps a subnet.
func TestClaimIndexFollowsIpamWinners(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	subnets := []string{"10.22.1.0/24", "10.22.2.0/24", "10.22.3.0/24", "10.22.2.0/28", "10.22.0.0/23", "10.22.4.0/24"}
	for run := range 50 {
		ix := newClaimIndex()
		held := map[string]NodeStatus{}
		for step := range 60 {
			name := fmt.Sprintf("n%d", rng.IntN(8))
			if rng.IntN(5) == 0 {
				delete(held, name)
				ix.set(name, NodeStatus{}, false)
			} else {
				s := NodeStatus{Name: name, PodSubnet: subnets[rng.IntN(len(subnets))], SubnetSince: hlc.Timestamp{Wall: int64(rng.IntN(4))}}
				if rng.IntN(3) > 0 { // wide claims are rare
					s.PodSubnet = subnets[rng.IntN(3)]
				}
				held[name] = s
				ix.set(name, s, true)
			}
			var claims []ipam.Claim
			for n, s := range held {
				claims = append(claims, ipam.Claim{Node: n, Subnet: s.PodSubnet, Since: s.SubnetSince})
			}
			if want := ipam.Winners(claims); !maps.Equal(want, ix.winners) {
				t.Fatalf("run %d step %d: winners %v, want %v (claims %v)", run, step, ix.winners, want, claims)
			}
			p := netip.MustParsePrefix(subnets[rng.IntN(len(subnets))])
			found := map[string]bool{}
			ix.near(p, func(n string) { found[n] = true })
			for n, s := range held {
				if q, _ := s.prefix(); q.Overlaps(p) && !found[n] {
					t.Fatalf("run %d step %d: near(%v) misses %s (%s)", run, step, p, n, s.PodSubnet)
				}
			}
		}
	}
}
