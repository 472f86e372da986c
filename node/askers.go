package node

import (
	"net/netip"
	"sync"
	"time"
)

// maxAsked bounds the first askers an arbiter remembers (one per subnet
// of the cluster CIDR at most; a /12 has 4,096).
const maxAsked = 4096

// askedClaim is the first node that asked about a subnet, and when.
type askedClaim struct {
	node string
	at   time.Time
}

// askers is an arbiter's memory of the first node that asked it about
// each subnet (claimcheck.go): at most maxAsked entries, each named for
// keep at least.
type askers struct {
	// keep is how long an arbiter names a subnet's first asker at least:
	// the longest a claim check can last (claimCheckRounds rounds of
	// --subnet-settle and claimCheckPeers questions). After that it names
	// it as long as the asker may still claim the subnet
	// (subnets.stillClaims): a record can take minutes to reach every
	// node while a thousand form, and an arbiter that forgot a settled
	// claimant before its record came named the next asker, which settled
	// the subnet a second time.
	keep time.Duration

	mu sync.Mutex
	m  map[netip.Prefix]askedClaim
}

// newAskers returns an empty memory of askers for claims that settle
// after settle.
func newAskers(settle time.Duration) *askers {
	return &askers{keep: claimCheckRounds * (settle + claimCheckPeers*claimAskTimeout), m: map[netip.Prefix]askedClaim{}}
}

// first returns the node that asked about subnet p first and, by still,
// may still claim it, recording node (at now) when none does. still is
// called without the lock held.
func (as *askers) first(p netip.Prefix, node string, now time.Time, still func(askedClaim) bool) string {
	as.mu.Lock()
	a, ok := as.m[p]
	as.mu.Unlock()
	if ok && a.node != node && still(a) {
		return a.node
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	if cur, ok := as.m[p]; ok && cur.node == node {
		return node // keep the time of its first question
	} else if ok && cur != a {
		return cur.node // another asker came first meanwhile
	}
	if len(as.m) >= maxAsked {
		for k, a := range as.m {
			if now.Sub(a.at) >= as.keep {
				delete(as.m, k)
			}
		}
		if len(as.m) >= maxAsked {
			return node // remember nothing more; answer as asked
		}
	}
	as.m[p] = askedClaim{node: node, at: now}
	return node
}
