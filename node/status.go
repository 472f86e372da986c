package node

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"
	"github.com/starling-orchestrator/starling/node/volumes"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/member"
	"github.com/starling-orchestrator/starling/node/view"
	"github.com/starling-orchestrator/starling/placement"
)

// self is this node's own record (NodeStatus): what it says about itself
// and its replicas, and the publishing of it. Its lock serialises
// publications (the reconcile loop, the subnet claim, a stopping agent).
type self struct {
	name      string
	advertise string // --advertise, until membership knows the address
	apiListen string // --api-listen
	labels    map[string]string
	insecure  bool
	capacity  placement.Resources
	started   time.Time

	store   Store
	clock   *hlc.Clock
	id      *trust.Identity
	trust   *trust.Trust // nil with --insecure
	members *members
	subnets *subnets
	writer  *writer
	log     *slog.Logger
	writes  prometheus.Counter // starling_node_status_writes_total
	claims  *volumes.Binder    // the claims whose data this node holds

	// local is the list of this node's replicas its last publication
	// held (what get replicas serves for this node).
	local atomic.Pointer[[]api.Replica]
	// diskFull: the store's filesystem is full (diskLoop).
	diskFull atomic.Bool

	mu     sync.Mutex
	last   string    // the record last published
	lastAt time.Time // when
}

// Unpublished is the record this node would publish now, with no
// replica (view.Unpublished: the view shows it until the node's own
// record is held).
func (s *self) Unpublished() view.NodeStatus { return s.status(nil) }

// status is this node's record with the given replica statuses. It says
// only what peers accept (checkStatus): reasons are one line of bounded
// text, and a replica address outside the node's current subnet (left
// from an earlier claim) is not published.
func (s *self) status(replicas []api.Replica) view.NodeStatus {
	claim := s.subnets.current()
	subnet, _ := netip.ParsePrefix(claim.Subnet)
	out := make([]api.Replica, 0, len(replicas))
	for _, r := range replicas {
		r.Reason = api.OneLine(r.Reason)
		if ip, err := netip.ParseAddr(r.PodIP); r.PodIP != "" && (err != nil || !subnet.Contains(ip)) {
			r.PodIP, r.Ready = "", false
		}
		out = append(out, r)
	}
	return view.NodeStatus{
		Name:        s.name,
		Advertise:   s.members.advertiseAddr(s.advertise),
		API:         s.apiURL(),
		PodSubnet:   claim.Subnet,
		SubnetSince: claim.Since,
		SubnetReady: s.subnets.settled.Load(),
		Capacity:    s.capacity,
		Labels:      s.labels,
		Started:     s.started.UTC().Truncate(time.Second),
		Replicas:    out,
		Insecure:    s.insecure,
		MemberSig:   true,
		DiskFull:    s.diskFull.Load(),
		Cert:        s.trust.CertDER(),
		SettleUntil: s.members.SelfUntil().UTC().Truncate(time.Millisecond),
		Volumes:     s.claims.Bindings(),
	}
}

// publishGap is the least time between two publications of this node's
// record by the reconcile loop (publishSoon). A burst of replica changes
// (a node's return moves replicas, each action's end runs a pass) then
// costs the cluster one record of a few KB per node every publishGap,
// where every pass published one: at 20 nodes with 10 replicas each, a
// node's return published 238 records in its first minute.
const publishGap = 250 * time.Millisecond

// publishStatus gossips this node's record when it changed since the last
// publication, or when the stored record is not the one this node wrote
// last: a delete or a write under this node's name by another node (which
// checkRecord refuses on arrival, but which could predate the check, or
// come from "starling node forget" run against a live node) is overwritten
// at once, not at the next change.
func (s *self) publishStatus(local []api.Replica) {
	s.publishSoon(local, time.Time{})
}

// publishSoon is publishStatus for the reconcile loop: a change found
// less than publishGap after the last publication is not published but
// left for a later pass, whose time it returns (0: nothing left to
// publish). A zero now publishes at once.
//
// The record is built under the lock: two callers (the reconcile loop,
// a subnet claim that moved) cannot publish in the opposite order of
// what they read, leaving the record of an earlier claim last.
func (s *self) publishSoon(local []api.Replica, now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.publishLocked(local, now)
}

// republish is publishStatus with the replicas of the last publication,
// read under the same lock (a subnet claim that moved).
func (s *self) republish() {
	s.mu.Lock()
	defer s.mu.Unlock()
	local, _ := s.replicas()
	s.publishLocked(local, time.Time{})
}

// republishOn republishes (republish) each time asked on ask (a subnet
// claim changed: subnets.publish), until ctx ends. With the replicas of
// the last publication: a claim that moves keeps them listed (their
// addresses hidden) until the next pass.
func (s *self) republishOn(ctx context.Context, ask <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ask:
			s.republish()
		}
	}
}

// publishLocked is publishSoon with mu held.
func (s *self) publishLocked(local []api.Replica, now time.Time) time.Duration {
	status := s.status(local)
	b, err := json.Marshal(status)
	if err != nil {
		return 0
	}
	if string(b) == s.last {
		rec, ok, err := s.store.Get(view.StatusKey(s.name))
		own := ok && !rec.Deleted && rec.Origin == s.name && bytes.Equal(rec.Signer, s.id.Public())
		if err != nil || own && string(rec.Value) == s.last {
			return 0
		}
		if ok {
			s.log.Warn("this node's status record was changed by another writer; republishing it", "writer", api.OneLine(rec.Origin),
				"key", member.KeyID(rec.Signer), "deleted", rec.Deleted)
			s.clock.Update(rec.Version)
		}
	} else if wait := s.lastAt.Add(publishGap).Sub(now); !now.IsZero() && wait > 0 {
		return wait
	}
	s.local.Store(&status.Replicas)
	rec := crdt.Record{Key: view.StatusKey(s.name), Value: b, Version: s.clock.Now(), Origin: s.name}
	if err := s.writer.publish(rec); err != nil {
		s.log.Warn("publish node status", "err", err)
		return 0
	}
	s.last, s.lastAt = string(b), time.Now()
	s.writes.Inc()
	return 0
}

// forget makes the next publishStatus write the record even if it did
// not change (SubnetReady changed under it).
func (s *self) forget() {
	s.mu.Lock()
	s.last = ""
	s.mu.Unlock()
}

// replicas is the list of this node's replicas its last publication held
// (ok false before the first).
func (s *self) replicas() ([]api.Replica, bool) {
	p := s.local.Load()
	if p == nil {
		return nil, false
	}
	return *p, true
}

// apiURL is the base URL peers use to reach this node's TCP API, or "".
func (s *self) apiURL() string {
	if s.apiListen == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(s.apiListen)
	if err != nil {
		return ""
	}
	// Peers accept only an address (checkStatus): a host name or an
	// unspecified address is replaced by the address peers know us by.
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = s.members.advertiseHost(s.advertise)
	}
	if net.ParseIP(host) == nil {
		return ""
	}
	scheme := "http://"
	if s.trust != nil {
		scheme = "https://" // the node's certificate (Run)
	}
	return scheme + net.JoinHostPort(host, port)
}

// capacity is what this node offers to replicas: all CPUs and all memory.
func capacity() placement.Resources {
	r := placement.Resources{MilliCPU: int64(runtime.NumCPU()) * 1000}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				r.MemoryBytes = kb * 1024
			}
		}
	}
	return r
}
