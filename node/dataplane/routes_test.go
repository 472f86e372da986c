package dataplane

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/view"
)

// signedBy accepts the addresses listed for each member name.
type signedBy map[string]string

func (s signedBy) SignedAddr(m gossip.Member, _ view.NodeStatus) bool { return s[m.Name] == m.Addr }

// Routes go to the pod subnet of each live peer whose claim wins and
// whose address it signed: not to a dead one, a loser of its subnet, one
// whose claim has not settled, or an address an impostor put in
// membership.
func TestDesiredRoutesOnlyToSignedLiveWinners(t *testing.T) {
	st := func(name, subnet string, ready bool) view.NodeStatus {
		return view.NodeStatus{Name: name, PodSubnet: subnet, SubnetReady: ready}
	}
	v := &view.View{
		Members: []gossip.Member{
			{Name: "a", Addr: "192.168.1.1", State: gossip.StateAlive},
			{Name: "b", Addr: "192.168.1.2", State: gossip.StateSuspect},
			{Name: "dead", Addr: "192.168.1.3", State: gossip.StateDead},
			{Name: "loser", Addr: "192.168.1.4", State: gossip.StateAlive},
			{Name: "settling", Addr: "192.168.1.5", State: gossip.StateAlive},
			{Name: "victim", Addr: "192.168.1.66", State: gossip.StateAlive}, // an impostor's address
			{Name: "self", Addr: "192.168.1.9", State: gossip.StateAlive},
		},
		Statuses: map[string]view.NodeStatus{
			"a": st("a", "10.22.1.0/24", true), "b": st("b", "10.22.2.0/24", true), "dead": st("dead", "10.22.3.0/24", true),
			"loser": st("loser", "10.22.1.0/24", true), "settling": st("settling", "10.22.5.0/24", false),
			"victim": st("victim", "10.22.6.0/24", true), "self": st("self", "10.22.9.0/24", true),
		},
		Winners: map[string]bool{"a": true, "b": true, "dead": true, "settling": true, "victim": true, "self": true},
	}
	addrs := signedBy{"a": "192.168.1.1", "b": "192.168.1.2", "dead": "192.168.1.3", "loser": "192.168.1.4", "settling": "192.168.1.5", "victim": "192.168.1.6"}
	var got []string
	for _, r := range Desired(v, "self", netip.MustParsePrefix("10.22.9.0/24"), netip.MustParsePrefix("10.22.0.0/16"), addrs) {
		if r.Via != nil {
			got = append(got, r.String())
		}
	}
	slices.Sort(got)
	if want := []string{"10.22.1.0/24 via 192.168.1.1", "10.22.2.0/24 via 192.168.1.2"}; !slices.Equal(got, want) {
		t.Fatalf("routes %q, want %q", got, want)
	}
}
