package announce

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/starling-orchestrator/starling/node/view"
)

// Views is the view the Announcer reads, and a channel closed when the
// next one is stored (view.Builder).
type Views interface {
	View() *view.View
	Changed() <-chan struct{}
}

// Quorum says whether this node counts a strict majority of the known
// nodes of v at now (the agent's fence).
type Quorum interface {
	Majority(v *view.View, now time.Time) bool
}

// Link is the LAN interface the addresses go on: LAN on a real node, a
// fake in tests. Held lists the addresses this agent put on it that are
// on it (never one the host held already); Add puts one on it (an error
// wrapping ErrExists for one the interface holds already: not this
// agent's, so never listed nor taken off), Remove takes one of its own
// off (no error for one already gone); Announce sends gratuitous ARP for
// one.
type Link interface {
	Held() ([]netip.Addr, error)
	Add(a netip.Addr) error
	Remove(a netip.Addr) error
	Announce(a netip.Addr) error
}

// Config is what an Announcer is made of; every field is required but
// Interval, Period and Now (defaults below).
type Config struct {
	Self   string
	Views  Views
	Quorum Quorum
	Link   Link
	// Synced is closed when this node holds the cluster's state: until
	// then its view may hold it alone as live, and it announces nothing.
	Synced <-chan struct{}
	// Interval is the time between gratuitous ARPs for an address after
	// its Burst (what MetalLB calls --gratuitous-arp-interval); default
	// 30 s.
	Interval time.Duration
	// Period is how often the Announcer looks again without a new view
	// (the quorum changes without one, and ARPs fall due); default
	// 200 ms.
	Period time.Duration
	// MaxSettle is --rejoin-settle: a record's SettleUntil counts at
	// most that long after the record was written (view.SettleEnd), for
	// this node as for its peers.
	MaxSettle time.Duration
	// LeaseFile is the fence lease the watchdog reads (node/fencewatch;
	// "": none). Past its lbDeadline the watchdog takes this node's
	// addresses off, so the Announcer holds none either: a half-hung
	// agent whose Announcer still runs must not put them back.
	LeaseFile string
	Now       func() time.Time
	Log       *slog.Logger
}

// Announcer keeps this node's LoadBalancer addresses on its LAN
// interface: those Mine gives, and no other. It owns its state (Run's
// goroutine alone uses it).
type Announcer struct {
	cfg  Config
	held map[netip.Addr]*announced
	// failed is the last error adding each address gave: logged once,
	// not every pass.
	failed map[netip.Addr]string
	// lapsed: the lease had lapsed at the last pass (logged once).
	lapsed bool
}

// announced is an address this node announces: since when, how many
// gratuitous ARPs went out, when the next one is due.
type announced struct {
	since time.Time
	sent  int
	next  time.Time
}

// LeaseFor is how long a renewal of the fence lease, renewed every
// renew, answers for this node's LoadBalancer addresses (the watchdog
// takes them off after): about when its peers declare it dead and take
// them over. That is memberlist's failure detection: a probe interval to
// miss an ack, the probe's timeout, then the suspicion timeout,
// SuspicionMult * max(1, log10(n)) * probeInterval
// (suspicionTimeout, memberlist util.go), here for n < 10 nodes (peers
// of a larger cluster take a little longer: a short gap, never two
// owners); but at least three renewals, so that one late renewal does
// not take the addresses off a live node. Zero values are memberlist's
// DefaultLANConfig (1 s, 500 ms, 4): 5.5 s. Shorter, an agent stalled
// for longer (a GC pause, a slow disk) would drop its addresses while
// its peers still see it as their owner.
func LeaseFor(probeInterval, probeTimeout time.Duration, suspicionMult int, renew time.Duration) time.Duration {
	if probeInterval <= 0 {
		probeInterval = time.Second
	}
	if probeTimeout <= 0 {
		probeTimeout = 500 * time.Millisecond
	}
	if suspicionMult <= 0 {
		suspicionMult = 4
	}
	return max(probeInterval+probeTimeout+time.Duration(suspicionMult)*probeInterval, 3*renew)
}

// New returns the Announcer of c, with its defaults filled in.
func New(c Config) *Announcer {
	if c.Interval <= 0 {
		c.Interval = 30 * time.Second
	}
	if c.Period <= 0 {
		c.Period = 200 * time.Millisecond
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Announcer{cfg: c, held: map[netip.Addr]*announced{}, failed: map[netip.Addr]string{}}
}

// Run announces this node's addresses after each view and every Period,
// until ctx ends; then it takes them all off the LAN interface, so a node
// that stops answers no ARP for them (its peers take over once they see
// it leave).
func (a *Announcer) Run(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-a.cfg.Synced:
	}
	defer a.release()
	tick := time.NewTicker(a.cfg.Period)
	defer tick.Stop()
	for {
		changed := a.cfg.Views.Changed()
		a.Pass(a.cfg.Now())
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
		}
	}
}

// SelfSettleMargin is how much longer than its peers a node that
// settles itself out after a return counts itself out: their clocks may
// be behind its own by that much, and while any peer still counts it
// out, that peer's owner of its addresses announces them; so it stays
// quiet a little longer rather than announce beside that owner.
const SelfSettleMargin = time.Second

// InputOf is what Mine decides from in v for self at now, with majority
// this node's quorum count and maxSettle --rejoin-settle: the view's
// LoadBalancer addresses, its known nodes (live: those placement may
// use, this node but while it settles itself out after a return, by
// the rule its peers apply to it, view.SettleEnd, plus SelfSettleMargin),
// the nodes' own addresses.
func InputOf(v *view.View, self string, majority bool, now time.Time, maxSettle time.Duration) Input {
	in := Input{Self: self, Majority: majority, Reserved: v.NodeAddrs()}
	eligible := map[string]bool{}
	for _, n := range v.Eligible {
		eligible[n.Name] = true
	}
	if s, ok := v.Statuses[self]; ok && !s.SettleUntil.IsZero() && view.SettleEnd(s, maxSettle).Add(SelfSettleMargin).After(now) {
		eligible[self] = false
	}
	for name, s := range v.Statuses {
		subnet, _ := netip.ParsePrefix(s.PodSubnet)
		in.Nodes = append(in.Nodes, Node{Name: name, Alive: eligible[name], Subnet: subnet})
	}
	if _, ok := v.Statuses[self]; !ok {
		in.Nodes = append(in.Nodes, Node{Name: self, Alive: eligible[self]})
	}
	for key, addr := range v.Alloc.LoadBalancers {
		ad := Address{Addr: addr, Service: key}
		for _, p := range v.SvcPorts.Get(key) {
			ad.Local = p.Local
			for _, ep := range p.Endpoints {
				ad.Endpoints = append(ad.Endpoints, ep.Addr())
			}
		}
		in.Addresses = append(in.Addresses, ad)
	}
	return in
}

// Pass brings the LAN interface to what Mine gives at now: addresses
// this node put there and no longer owns (or that an earlier run left)
// are taken off first, then its own are put on, and the gratuitous ARPs
// that are due go out. Past the lease's LB deadline (Config.LeaseFile)
// it owns none. An address that was on the interface before this agent
// put it there is never taken off nor announced.
func (a *Announcer) Pass(now time.Time) {
	v := a.cfg.Views.View()
	if v == nil || len(v.Alloc.LoadBalancers) == 0 && len(a.held) == 0 {
		return // nothing to announce or take off (an earlier run's: NewLAN)
	}
	in := InputOf(v, a.cfg.Self, a.cfg.Quorum.Majority(v, now), now, a.cfg.MaxSettle)
	want := map[netip.Addr]bool{}
	if a.leased(now) {
		for _, addr := range Mine(in) {
			want[addr] = true
		}
	}
	lbs := map[netip.Addr]string{}
	for _, ad := range in.Addresses {
		lbs[ad.Addr] = ad.Service
	}
	have, err := a.cfg.Link.Held()
	if err != nil {
		a.cfg.Log.Warn("loadbalancer: cannot list the LAN interface's addresses", "err", err)
		return
	}
	on := map[netip.Addr]bool{}
	for _, addr := range have {
		on[addr] = true
		if want[addr] {
			continue
		}
		if err := a.cfg.Link.Remove(addr); err != nil {
			a.cfg.Log.Warn("loadbalancer: cannot remove an address this node no longer announces", "address", addr, "err", err)
			continue // still on, still listed: tried again next pass
		}
		delete(a.held, addr)
		delete(on, addr)
		a.cfg.Log.Info("loadbalancer: address withdrawn", "address", addr, "service", lbs[addr], "majority", in.Majority)
	}
	for addr := range a.held {
		if !want[addr] && !on[addr] {
			delete(a.held, addr) // gone from the interface and not wanted
		}
	}
	for addr := range want {
		if !on[addr] {
			if err := a.cfg.Link.Add(addr); err != nil {
				if a.failed[addr] != err.Error() {
					a.cfg.Log.Warn("loadbalancer: cannot announce an address", "address", addr, "service", lbs[addr], "err", err,
						"foreign", errors.Is(err, ErrExists))
				}
				a.failed[addr] = err.Error()
				continue
			}
			delete(a.failed, addr)
			a.cfg.Log.Info("loadbalancer: announcing", "address", addr, "service", lbs[addr])
		}
		if a.held[addr] == nil {
			a.held[addr] = &announced{since: now, next: now}
		}
	}
	for addr, s := range a.held {
		if !want[addr] || now.Before(s.next) {
			continue
		}
		if err := a.cfg.Link.Announce(addr); err != nil {
			a.cfg.Log.Warn("loadbalancer: gratuitous ARP failed", "address", addr, "err", err)
		}
		s.sent++
		s.next = NextARP(s.since, s.sent-1, a.cfg.Interval)
	}
}

// leased reports whether the lease in Config.LeaseFile (if any) answers
// for this node's addresses at now: its lbDeadline not passed. A lease
// that cannot be read answers for none.
func (a *Announcer) leased(now time.Time) bool {
	if a.cfg.LeaseFile == "" {
		return true
	}
	var l struct {
		LBDeadline time.Time `json:"lbDeadline"`
	}
	b, err := os.ReadFile(a.cfg.LeaseFile)
	if err == nil {
		err = json.Unmarshal(b, &l)
	}
	ok := err == nil && now.Before(l.LBDeadline)
	if !ok && !a.lapsed {
		a.cfg.Log.Warn("loadbalancer: the fence lease does not cover this node's addresses (not renewed): announcing none", "lease", a.cfg.LeaseFile, "deadline", l.LBDeadline, "err", err)
	}
	a.lapsed = !ok
	return ok
}

// release takes every address this node announces off the interface.
func (a *Announcer) release() {
	for addr := range a.held {
		if err := a.cfg.Link.Remove(addr); err != nil {
			a.cfg.Log.Warn("loadbalancer: cannot remove an address at stop", "address", addr, "err", err)
		}
		delete(a.held, addr)
	}
}
