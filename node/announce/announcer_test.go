package announce

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
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
// and may refuse addresses or fail to remove them. held are the
// addresses the agent put on it, host the host's own (also on it).
type memLink struct {
	held       []netip.Addr
	host       []netip.Addr
	arps       map[netip.Addr]int
	refuse     netip.Addr
	failRemove bool
	removed    []netip.Addr
}

func (l *memLink) Held() ([]netip.Addr, error) { return slices.Clone(l.held), nil }
func (l *memLink) Add(a netip.Addr) error {
	switch {
	case a == l.refuse:
		return errors.New("not in the LAN")
	case slices.Contains(l.host, a):
		return ErrExists
	}
	l.held = append(l.held, a)
	return nil
}
func (l *memLink) Remove(a netip.Addr) error {
	if l.failRemove {
		return errors.New("EBUSY")
	}
	if slices.Contains(l.host, a) {
		panic("took the host's own address off")
	}
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

	left := &memLink{held: []netip.Addr{lbA}, host: []netip.Addr{netip.MustParseAddr("192.168.222.99")}, arps: map[netip.Addr]int{}}
	New(Config{Self: other, Views: &fixedViews{v}, Quorum: fixedQuorum(true), Link: left, Log: log}).Pass(t0)
	if slices.Contains(left.held, lbA) {
		t.Errorf("not the owner: holds %v, want %v off", left.held, lbA)
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

// ownerOf returns the owner of addr among nodes a, b, c, all alive, and
// another node.
func ownerOf(addr netip.Addr) (owner, other string) {
	owner = Owner(Address{Addr: addr}, []Node{{Name: "a", Alive: true}, {Name: "b", Alive: true}, {Name: "c", Alive: true}})
	for _, n := range []string{"a", "b", "c"} {
		if n != owner {
			return owner, n
		}
	}
	return owner, ""
}

// TestPassNeverTouchesTheHostsAddresses: an address the host held before
// (a Service asking for the host's own address, or another node's left
// on it by hand) is neither adopted, announced nor taken off, by its
// owner (whose Add finds it there), by another node, nor at stop.
func TestPassNeverTouchesTheHostsAddresses(t *testing.T) {
	v := threeNodes(lbA)
	owner, other := ownerOf(lbA)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t0 := time.Unix(1000, 0)
	for _, self := range []string{owner, other} {
		link := &memLink{host: []netip.Addr{lbA}, arps: map[netip.Addr]int{}}
		a := New(Config{Self: self, Views: &fixedViews{v}, Quorum: fixedQuorum(true), Link: link, Log: log})
		for d := time.Duration(0); d < 4*time.Second; d += time.Second {
			a.Pass(t0.Add(d)) // Remove panics for a host's address
		}
		a.release()
		if len(link.held) != 0 || len(a.held) != 0 || link.arps[lbA] != 0 {
			t.Errorf("%s: adopted the host's %v: link %v, held %v, %d ARPs", self, lbA, link.held, a.held, link.arps[lbA])
		}
	}
}

// TestPassRetriesAFailedRemove: an address whose removal failed once
// (its Service deleted) comes off at the next pass, and is not
// announced meanwhile.
func TestPassRetriesAFailedRemove(t *testing.T) {
	owner, _ := ownerOf(lbA)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	link := &memLink{arps: map[netip.Addr]int{}}
	fv := &fixedViews{threeNodes(lbA)}
	a := New(Config{Self: owner, Views: fv, Quorum: fixedQuorum(true), Link: link, Log: log})
	t0 := time.Unix(1000, 0)
	a.Pass(t0)
	fv.v = threeNodes() // the Service is deleted
	link.failRemove = true
	a.Pass(t0.Add(time.Second))
	arps := link.arps[lbA]
	link.failRemove = false
	a.Pass(t0.Add(2 * time.Second))
	if slices.Contains(link.held, lbA) {
		t.Errorf("%v kept after one failed Remove: link %v, held %v", lbA, link.held, a.held)
	}
	if link.arps[lbA] != arps {
		t.Errorf("an address no longer wanted was announced again")
	}
}

// TestSelfSettlesOutByThePeersRule: a node back from down counts itself
// out as its peers do, SettleUntil capped at MaxSettle after its record
// was written (a clock far ahead cannot keep it out for an hour while
// its peers make it the owner), plus SelfSettleMargin.
func TestSelfSettlesOutByThePeersRule(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const maxSettle = 10 * time.Second
	v := threeNodes(lbA)
	s := v.Statuses["a"]
	s.SettleUntil = t0.Add(time.Hour) // written by a clock an hour ahead
	s.Version.Wall = t0.UnixNano()
	v.Statuses["a"] = s
	alive := func(now time.Time) bool {
		for _, n := range InputOf(v, "a", true, now, maxSettle).Nodes {
			if n.Name == "a" {
				return n.Alive
			}
		}
		return false
	}
	for _, c := range []struct {
		at   time.Duration
		want bool
	}{
		{maxSettle - time.Second, false},
		{maxSettle + SelfSettleMargin/2, false}, // peers count it; it waits out their skew
		{maxSettle + SelfSettleMargin + time.Second, true},
	} {
		if got := alive(t0.Add(c.at)); got != c.want {
			t.Errorf("at +%v: counts itself %v, want %v", c.at, got, c.want)
		}
	}
}

// TestPassAnnouncesNothingPastTheLease: past the lease's LB deadline
// (when the watchdog takes the addresses off), the owner takes its
// address off and does not put it back, until a renewal.
func TestPassAnnouncesNothingPastTheLease(t *testing.T) {
	owner, _ := ownerOf(lbA)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t0 := time.Unix(1000, 0)
	lease := filepath.Join(t.TempDir(), "fence.lease")
	renew := func(until time.Time) {
		b, _ := json.Marshal(map[string]time.Time{"lbDeadline": until})
		os.WriteFile(lease, b, 0o600)
	}
	link := &memLink{arps: map[netip.Addr]int{}}
	a := New(Config{Self: owner, Views: &fixedViews{threeNodes(lbA)}, Quorum: fixedQuorum(true), Link: link, LeaseFile: lease, Log: log})
	a.Pass(t0)
	if len(link.held) != 0 {
		t.Errorf("no lease yet: holds %v", link.held)
	}
	renew(t0.Add(5 * time.Second))
	a.Pass(t0.Add(time.Second))
	if !slices.Contains(link.held, lbA) {
		t.Errorf("leased: holds %v, want %v", link.held, lbA)
	}
	for d := 6 * time.Second; d < 9*time.Second; d += time.Second {
		a.Pass(t0.Add(d))
		if len(link.held) != 0 {
			t.Errorf("past the lease at +%v: holds %v", d, link.held)
		}
	}
	renew(t0.Add(20 * time.Second))
	a.Pass(t0.Add(10 * time.Second))
	if !slices.Contains(link.held, lbA) {
		t.Errorf("renewed: holds %v, want %v", link.held, lbA)
	}
}

// TestLeaseForFollowsFailureDetection: the lease of the addresses lasts
// as long as peers take to declare the node dead, not a fixed 1.5 s
// (shorter than the default failure detection), and at least three
// renewals.
func TestLeaseForFollowsFailureDetection(t *testing.T) {
	for _, c := range []struct {
		interval, timeout time.Duration
		mult              int
		want              time.Duration
	}{
		{0, 0, 0, 5500 * time.Millisecond},
		{200 * time.Millisecond, 100 * time.Millisecond, 3, 1500 * time.Millisecond}, // 0.9 s detection, 3 renewals
		{2 * time.Second, time.Second, 5, 13 * time.Second},
	} {
		if got := LeaseFor(c.interval, c.timeout, c.mult, 500*time.Millisecond); got != c.want {
			t.Errorf("LeaseFor(%v, %v, %d) = %v, want %v", c.interval, c.timeout, c.mult, got, c.want)
		}
	}
}
