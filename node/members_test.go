package node

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/starling-orchestrator/starling/gossip"
)

// A (re)joining node exchanges state with a few targets, not with every
// peer it remembers: batches of joinFanout, in order, until one reaches a
// member; a name conflict ends it at once.
func TestJoinAsksAFewTargetsAtATime(t *testing.T) {
	var targets []string
	for i := range 300 {
		targets = append(targets, fmt.Sprintf("10.0.%d.%d:7946", i/250, i%250))
	}
	var asked [][]string
	join := func(reach map[string]bool, fail error) func([]string) (int, error) {
		return func(addrs []string) (int, error) {
			asked = append(asked, slices.Clone(addrs))
			n := 0
			for _, a := range addrs {
				if reach[a] {
					n++
				}
			}
			if n == 0 {
				return 0, fail
			}
			return n, nil
		}
	}
	dead := errors.New("no answer")
	n, err := joinSome(join(map[string]bool{targets[4]: true, targets[5]: true}, dead), targets)
	if n != 2 || err != nil || len(asked) != 2 || len(asked[0]) != joinFanout || asked[1][0] != targets[3] {
		t.Fatalf("joinSome = %d, %v after asking %v; want 2 members reached by the second batch of %d", n, err, asked, joinFanout)
	}
	asked = nil
	if n, err := joinSome(join(nil, dead), targets); n != 0 || !errors.Is(err, dead) || len(asked) != 100 {
		t.Fatalf("nobody answers: joinSome = %d, %v after %d batches; want 0, the errors, 100 batches", n, err, len(asked))
	}
	asked = nil
	if _, err := joinSome(join(nil, gossip.ErrNameTaken), targets); !errors.Is(err, gossip.ErrNameTaken) || len(asked) != 1 {
		t.Fatalf("name taken: joinSome asked %d batches, returned %v; want one batch and the error", len(asked), err)
	}
	// A key mismatch in one batch (a stale or foreign target) does not
	// stop the join: a later batch reaches a member.
	asked = nil
	mismatch := func(addrs []string) (int, error) {
		asked = append(asked, addrs)
		if len(asked) == 1 {
			return 0, gossip.ErrKeyMismatch
		}
		return 1, nil
	}
	if n, err := joinSome(mismatch, targets); n != 1 || err != nil || len(asked) != 2 {
		t.Fatalf("key mismatch in the first batch: joinSome = %d, %v after %d batches; want the second batch to join", n, err, len(asked))
	}
}
