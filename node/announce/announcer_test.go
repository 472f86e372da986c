package announce

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/view"
	"github.com/starling-orchestrator/starling/placement"
)

type fixedViews struct{ v *view.View }

func (f *fixedViews) View() *view.View         { return f.v }
func (f *fixedViews) Changed() <-chan struct{} { return make(chan struct{}) }

type fixedQuorum bool

func (q fixedQuorum) Majority(*view.View, time.Time) bool { return bool(q) }

// memLink is a Link in memory that counts the gratuitous ARPs it sends
// and may refuse addresses.
type memLink struct {
	held    []netip.Addr
	arps    map[netip.Addr]int
	refuse  netip.Addr
	removed []netip.Addr
}

func (l *memLink) Held() ([]netip.Addr, error) { return slices.Clone(l.held), nil }
func (l *memLink) Add(a netip.Addr) error {
	if a == l.refuse {
		return errors.New("not in the LAN")
	}
	l.held = append(l.held, a)
	return nil
}
func (l *memLink) Remove(a netip.Addr) error {
	l.held = slices.DeleteFunc(l.held, func(b netip.Addr) bool { return a == b })
	l.removed = append(l.removed, a)
	return nil
}
func (l *memLink) Announce(a netip.Addr) error { l.arps[a]++; return nil }

// threeNodes is a view of three eligible nodes whose LoadBalancer
// Services hold addrs.
func threeNodes(addrs ...netip.Addr) *view.View {
	v := &view.View{Statuses: map[string]view.NodeStatus{}}
	v.Alloc.LoadBalancers = map[string]netip.Addr{}
	for i, name := range []string{"a", "b", "c"} {
		v.Statuses[name] = view.NodeStatus{Name: name, Advertise: netip.AddrFrom4([4]byte{192, 168, 222, byte(11 + i)}).String() + ":7946"}
		v.Eligible = append(v.Eligible, placement.Node{Name: name})
	}
	for i, a := range addrs {
		v.Alloc.LoadBalancers["ns/s"+string(rune('0'+i))] = a
	}
	return v
}

// TestPassAppliesMineThroughTheLink: the owner adds its address and sends
// the ARP burst on schedule; a node that is not the owner takes off the
// address an earlier run left; an address the link refuses is tried
// again each pass; without a majority, and at stop, everything comes off.
func TestPassAppliesMineThroughTheLink(t *testing.T) {
	v := threeNodes(lbA, lbB)
	ownerA := Owner(Address{Addr: lbA}, []Node{{Name: "a", Alive: true}, {Name: "b", Alive: true}, {Name: "c", Alive: true}})
	var other string
	for _, n := range []string{"a", "b", "c"} {
		if n != ownerA {
			other = n
			break
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t0 := time.Unix(1000, 0)

	link := &memLink{arps: map[netip.Addr]int{}}
	own := New(Config{Self: ownerA, Views: &fixedViews{v}, Quorum: fixedQuorum(true), Link: link, Log: log})
	for d := time.Duration(0); d <= 4*time.Second; d += 200 * time.Millisecond {
		own.Pass(t0.Add(d))
	}
	if !slices.Contains(link.held, lbA) || link.arps[lbA] != len(Burst) {
		t.Errorf("owner of %v: holds %v, %d ARPs in 4 s, want it and %d", lbA, link.held, link.arps[lbA], len(Burst))
	}
	own.Pass(t0.Add(34 * time.Second))
	if link.arps[lbA] != len(Burst)+1 {
		t.Errorf("after the interval: %d ARPs, want %d", link.arps[lbA], len(Burst)+1)
	}

	left := &memLink{held: []netip.Addr{lbA, netip.MustParseAddr("192.168.222.99")}, arps: map[netip.Addr]int{}}
	New(Config{Self: other, Views: &fixedViews{v}, Quorum: fixedQuorum(true), Link: left, Log: log}).Pass(t0)
	if slices.Contains(left.held, lbA) || !slices.Contains(left.held, netip.MustParseAddr("192.168.222.99")) {
		t.Errorf("not the owner: holds %v, want %v off and the host's other address kept", left.held, lbA)
	}

	refusing := &memLink{refuse: lbA, arps: map[netip.Addr]int{}}
	r := New(Config{Self: ownerA, Views: &fixedViews{v}, Quorum: fixedQuorum(true), Link: refusing, Log: log})
	r.Pass(t0)
	refusing.refuse = netip.Addr{}
	r.Pass(t0.Add(200 * time.Millisecond))
	if !slices.Contains(refusing.held, lbA) {
		t.Errorf("an address refused once is not tried again: %v", refusing.held)
	}

	own.release()
	if len(link.held) != 0 {
		t.Errorf("at stop: still holds %v", link.held)
	}
	own.Pass(t0.Add(40 * time.Second))
	own.cfg.Quorum = fixedQuorum(false)
	own.Pass(t0.Add(41 * time.Second))
	if len(link.held) != 0 {
		t.Errorf("no majority: still holds %v", link.held)
	}
}
