package view

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
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
				if q, _ := s.Prefix(); q.Overlaps(p) && !found[n] {
					t.Fatalf("run %d step %d: near(%v) misses %s (%s)", run, step, p, n, s.PodSubnet)
				}
			}
		}
	}
}

// A node's claim on a subnet whose earlier claimant is down past
// --subnet-reclaim-after holds it: the claimant let it settle (the
// earlier claim no longer counted), so every node routes to it and
// places on it. An earlier claim that still holds (its node up, or down
// for less than --subnet-reclaim-after) keeps winning.
func TestReclaimedSubnetsNewHolderWins(t *testing.T) {
	now := time.Now()
	vs := NewBuilder(Config{Self: "me", ReclaimAfter: time.Minute})
	v := &View{Statuses: map[string]NodeStatus{}}
	claim := func(name, subnet string, since, wrote time.Time, state gossip.MemberState) {
		s := NodeStatus{Name: name, PodSubnet: subnet, SubnetSince: hlc.Timestamp{Wall: since.UnixNano()}, SubnetReady: true}
		v.Statuses[name] = s
		vs.claims.set(name, s, true)
		vs.statuses[StatusKey(name)] = cachedStatus{from: recordID{version: hlc.Timestamp{Wall: wrote.UnixNano()}}, status: s, ok: true}
		v.Members = append(v.Members, gossip.Member{Name: name, State: state})
	}
	hour := -time.Hour
	claim("gone", "10.22.1.0/24", now.Add(hour), now.Add(-2*time.Minute), gossip.StateDead) // reclaimable
	claim("new", "10.22.1.0/24", now.Add(-time.Minute), now, gossip.StateAlive)
	claim("away", "10.22.2.0/24", now.Add(hour), now.Add(-30*time.Second), gossip.StateDead) // still reserved
	claim("taker", "10.22.2.0/24", now.Add(-time.Minute), now, gossip.StateAlive)
	claim("back", "10.22.3.0/24", now.Add(hour), now.Add(-2*time.Minute), gossip.StateAlive) // up again
	claim("later", "10.22.3.0/24", now.Add(-time.Minute), now, gossip.StateAlive)
	claim("third", "10.22.1.0/24", now.Add(-time.Second), now, gossip.StateAlive) // loses to new
	slices.SortFunc(v.Members, func(a, b gossip.Member) int { return strings.Compare(a.Name, b.Name) })
	v.claimWinners = maps.Clone(vs.claims.winners)
	before := maps.Clone(v.claimWinners)
	got := vs.reclaimedWinners(v)
	want := map[string]bool{"gone": true, "new": true, "away": true, "back": true}
	if !maps.Equal(got, want) {
		t.Fatalf("winners %v, want %v", got, want)
	}
	if !maps.Equal(v.claimWinners, before) {
		t.Fatal("reclaimedWinners wrote the claims' winners")
	}
	// away's reservation beats taker's claim until a minute after its
	// last record: the next rebuild after that derives the winners again,
	// with or without a record changing (before, an idle cluster kept
	// taker out until some record changed).
	if want := now.Add(-30 * time.Second).Add(time.Minute); !v.reclaimAt.Equal(want) {
		t.Fatalf("reclaimAt %v, want %v (away's reservation expires)", v.reclaimAt, want)
	}
	// The builder loop's idle tick rebuilds then (nothing else changed).
	if !vs.timeInputsChanged(v, v.reclaimAt) {
		t.Fatal("the view is not rebuilt when away's reservation expires")
	}
	// The dead node comes back: its claim holds again, and the node that
	// took its subnet no longer wins (it moves: subnetmove.go).
	for i := range v.Members {
		if v.Members[i].Name == "gone" {
			v.Members[i].State = gossip.StateAlive
		}
	}
	v.Winners = got
	if got := vs.reclaimedWinners(v); got["new"] {
		t.Fatalf("winners %v: new still wins the subnet of gone, which is back", got)
	}
}
