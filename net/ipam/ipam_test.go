package ipam

import (
	"errors"
	"net"
	"testing"

	"github.com/starling-orchestrator/starling/gossip/hlc"
)

func cidr(s string) *net.IPNet { _, n, _ := net.ParseCIDR(s); return n }

func TestEarlierClaimWinsThenLowerName(t *testing.T) {
	a := Claim{Node: "b", Subnet: "10.22.5.0/24", Since: hlc.Timestamp{Wall: 1}}
	b := Claim{Node: "a", Subnet: "10.22.5.0/24", Since: hlc.Timestamp{Wall: 2}}
	if !a.Beats(b) || b.Beats(a) {
		t.Fatal("the earlier claim must win")
	}
	c := Claim{Node: "a", Subnet: "10.22.5.0/24", Since: hlc.Timestamp{Wall: 1}}
	if !c.Beats(a) || a.Beats(c) {
		t.Fatal("on equal time the lower name must win")
	}
	if who, lost := Lost(a, []Claim{b, c}); !lost || who != "a" {
		t.Fatalf("Lost = %q %v, want a true", who, lost)
	}
	if _, lost := Lost(c, []Claim{a, b}); lost {
		t.Fatal("the winner lost")
	}
	other := Claim{Node: "z", Subnet: "10.22.6.0/24"}
	if _, lost := Lost(other, []Claim{a, b, c}); lost {
		t.Fatal("a claim on another subnet lost")
	}
}

func TestPickSkipsTakenAndReportsFull(t *testing.T) {
	c := cidr("10.22.0.0/22") // 4 subnets, .0 skipped: 3 usable
	taken := map[string]bool{}
	for i := 0; i < 3; i++ {
		sub, err := Pick(c, "node", taken)
		if err != nil {
			t.Fatal(err)
		}
		if sub.String() == "10.22.0.0/24" || taken[sub.String()] || !c.Contains(sub.IP) {
			t.Fatalf("picked %s (taken %v)", sub, taken)
		}
		taken[sub.String()] = true
	}
	if _, err := Pick(c, "node", taken); !errors.Is(err, ErrFull) {
		t.Fatalf("full CIDR: err %v", err)
	}
	if _, err := Pick(cidr("10.22.1.0/24"), "n", nil); err == nil {
		t.Fatal("a /24 cluster CIDR must be refused")
	}
}

func TestPickIsDeterministicAndSpreads(t *testing.T) {
	c := cidr("10.22.0.0/16")
	a1, _ := Pick(c, "node-a", nil)
	a2, _ := Pick(c, "node-a", nil)
	b, _ := Pick(c, "node-b", nil)
	if a1.String() != a2.String() {
		t.Fatal("Pick is not deterministic")
	}
	if a1.String() == b.String() {
		t.Fatalf("two names picked the same first subnet %s", a1)
	}
}

// A claim of a smaller subnet inside another node's conflicts with it: the
// earlier claim wins either way round (a /28 inside a /24 once made every
// node route part of the /24 to the /28's claimant).
func TestOverlappingClaimsConflict(t *testing.T) {
	big := Claim{Node: "a", Subnet: "10.22.5.0/24", Since: hlc.Timestamp{Wall: 1}}
	small := Claim{Node: "evil", Subnet: "10.22.5.0/28", Since: hlc.Timestamp{Wall: 2}}
	if who, lost := Lost(small, []Claim{big}); !lost || who != "a" {
		t.Fatalf("the later /28 inside a's /24: lost=%v to %q", lost, who)
	}
	if _, lost := Lost(big, []Claim{small}); lost {
		t.Fatal("the earlier /24 lost to a later /28 inside it")
	}
	if _, lost := Lost(Claim{Node: "b", Subnet: "10.22.6.0/24", Since: hlc.Timestamp{Wall: 3}}, []Claim{big, small}); lost {
		t.Fatal("a disjoint claim lost")
	}
}

// A new claim gives way to a settled one on its subnet even when its own
// time is earlier: peers refuse a new claim on a settled subnet (a
// claim's time is its writer's word), so keeping it would leave the node
// with a subnet no peer accepts. Found by the scale simulation: nodes
// joining at once picked one subnet, and the one whose claim peers
// refused kept it forever.
func TestNewClaimYieldsToASettledOne(t *testing.T) {
	settled := Claim{Node: "b", Subnet: "10.22.5.0/24", Since: hlc.Timestamp{Wall: 2}, Settled: true}
	mine := Claim{Node: "a", Subnet: "10.22.5.0/24", Since: hlc.Timestamp{Wall: 1}}
	if _, lost := Lost(mine, []Claim{settled}); lost {
		t.Fatal("by time alone the earlier claim wins")
	}
	if who, yields := Yields(mine, []Claim{settled}); !yields || who != "b" {
		t.Fatalf("Yields = %q %v, want b true", who, yields)
	}
	unsettled := settled
	unsettled.Settled = false
	if _, yields := Yields(mine, []Claim{unsettled}); yields {
		t.Fatal("an earlier claim yields to a later one that has not settled")
	}
	elsewhere := Claim{Node: "c", Subnet: "10.22.6.0/24", Settled: true}
	if _, yields := Yields(mine, []Claim{elsewhere}); yields {
		t.Fatal("a settled claim on another subnet took mine")
	}
}

// Two settled claims on one subnet: the later one's node moves, to the
// earlier settled one only, and agrees with Winners on who keeps it.
func TestSettledClaimIsDisplacedOnlyByAnEarlierSettledOne(t *testing.T) {
	early := Claim{Node: "y", Subnet: "10.22.5.0/24", Since: hlc.Timestamp{Wall: 1}, Settled: true}
	mine := Claim{Node: "x", Subnet: "10.22.5.0/24", Since: hlc.Timestamp{Wall: 2}, Settled: true}
	if who, moved := Displaced(mine, []Claim{early}); !moved || who != "y" {
		t.Fatalf("Displaced = %q %v, want y true", who, moved)
	}
	if _, moved := Displaced(early, []Claim{mine}); moved {
		t.Fatal("the earlier settled claim was displaced by a later one")
	}
	unsettled := early
	unsettled.Settled = false
	if _, moved := Displaced(mine, []Claim{unsettled}); moved {
		t.Fatal("a claim that has not settled displaced a settled one (it yields itself)")
	}
	inside := Claim{Node: "z", Subnet: "10.22.5.16/28", Since: hlc.Timestamp{Wall: 1}, Settled: true}
	if who, moved := Displaced(mine, []Claim{inside}); !moved || who != "z" {
		t.Fatalf("an overlapping /28: Displaced = %q %v, want z true", who, moved)
	}
	elsewhere := Claim{Node: "w", Subnet: "10.22.6.0/24", Since: hlc.Timestamp{Wall: 1}, Settled: true}
	if _, moved := Displaced(mine, []Claim{elsewhere}); moved {
		t.Fatal("a claim on another subnet displaced mine")
	}
	if w := Winners([]Claim{early, mine}); !w["y"] || w["x"] {
		t.Fatalf("Winners = %v, want y alone: the displaced node is the one Winners passes over", w)
	}
}

// Winners agrees with Lost on every claim, overlaps of different sizes
// included.
func TestWinnersAgreesWithLost(t *testing.T) {
	claims := []Claim{
		{Node: "a", Subnet: "10.22.1.0/24", Since: hlc.Timestamp{Wall: 5}},
		{Node: "b", Subnet: "10.22.1.0/24", Since: hlc.Timestamp{Wall: 3}},
		{Node: "c", Subnet: "10.22.1.16/28", Since: hlc.Timestamp{Wall: 1}},
		{Node: "d", Subnet: "10.22.2.0/24", Since: hlc.Timestamp{Wall: 9}},
		{Node: "e", Subnet: "10.22.2.0/23", Since: hlc.Timestamp{Wall: 8}},
		{Node: "f", Subnet: "10.22.9.0/24", Since: hlc.Timestamp{Wall: 1}},
		{Node: "g", Subnet: "not a subnet", Since: hlc.Timestamp{Wall: 1}},
		{Node: "h", Subnet: "10.22.9.0/24", Since: hlc.Timestamp{Wall: 1}},
	}
	w := Winners(claims)
	for _, c := range claims {
		if c.Node == "g" {
			if w["g"] {
				t.Fatal("a claim that does not parse won")
			}
			continue
		}
		_, lost := Lost(c, claims)
		if w[c.Node] == lost {
			t.Errorf("%s: Winners %v, Lost %v", c.Node, w[c.Node], lost)
		}
	}
}
