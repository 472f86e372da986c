package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/placement"
)

// Store meta keys.
const (
	metaName     = "node-name"
	metaPeers    = "peers"     // JSON list of "ip:port" of members last seen alive
	metaLastSeen = "last-seen" // RFC 3339 time the node last had the cluster's state
)

// splitHostPort parses "ip:port" or "ip" with a default port.
func splitHostPort(s string, defPort int) (string, int, error) {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return s, defPort, nil
		}
		return "", 0, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", portStr)
	}
	return host, port, nil
}

// checkIdentity binds the data dir to the node name on first start and
// refuses a different name later: a node's identity is what peers and
// placement know it by.
func (a *Agent) checkIdentity() error {
	name, ok, err := a.store.GetMeta(metaName)
	if err != nil {
		return err
	}
	if !ok {
		return a.store.PutMeta(metaName, []byte(a.cfg.Name))
	}
	if string(name) != a.cfg.Name {
		return fmt.Errorf("--data-dir %s belongs to node %q: start with --name %s, or use a fresh --data-dir", a.cfg.DataDir, name, name)
	}
	return nil
}

// staleState reports whether this node was away longer than the tombstone
// TTL: peers may have purged tombstones it never saw.
func (a *Agent) staleState() bool {
	v, ok, err := a.store.GetMeta(metaLastSeen)
	if err != nil || !ok {
		return false
	}
	t, err := time.Parse(time.RFC3339, string(v))
	return err == nil && time.Since(t) > a.cfg.TombstoneTTL
}

func (a *Agent) markSeen() {
	if err := a.store.PutMeta(metaLastSeen, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		a.log.Warn("record last-seen time", "err", err)
	}
}

// joinTargets are the seeds from --join plus the peers last seen alive.
func (a *Agent) joinTargets() []string {
	seen := map[string]bool{}
	var out []string
	add := func(s string) {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	for _, s := range a.cfg.Join {
		add(s)
	}
	if b, ok, err := a.store.GetMeta(metaPeers); err == nil && ok {
		var peers []string
		if json.Unmarshal(b, &peers) == nil {
			for _, p := range peers {
				add(p)
			}
		}
	}
	return out
}

// joinLoop joins the cluster through any target, retrying with backoff
// (1 s doubling to 30 s) until one answers. With no target the node starts
// a cluster of its own. It closes a.synced once the node holds the
// cluster's state (after the first successful join's push/pull, or at
// once when there is nothing to join).
func (a *Agent) joinLoop(ctx context.Context) {
	targets := a.joinTargets()
	if len(targets) == 0 {
		a.log.Info("no seeds to join: starting a new cluster")
		a.markSynced()
		return
	}
	backoff := time.Second
	for {
		n, err := a.cluster.Join(targets)
		if errors.Is(err, gossip.ErrNameTaken) {
			// Another node runs under this name: this one must not
			// claim a subnet, publish a status or run replicas, so it
			// never counts as synced. It retries in case the other was
			// this node's own earlier run at another address, which
			// the cluster declares dead within seconds.
			a.log.Error("a live node already uses this name; not joining (start this agent with another --name, or stop the other node)", "err", err, "retryIn", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		if n > 0 {
			a.log.Info("joined cluster", "contacted", n, "members", a.cluster.NumMembers())
			if a.droppedState {
				a.waitForState(ctx)
			}
			a.markSynced()
			return
		}
		if !a.droppedState {
			// Local state is recent enough to act on: run with it while
			// joining goes on (a node must keep its replicas running when
			// every peer is gone).
			a.markSynced()
		}
		if errors.Is(err, gossip.ErrKeyMismatch) && a.keys != nil {
			// The cluster rotated its key while this node was away.
			if changed, rerr := a.keys.refresh(ctx, targets); changed {
				continue
			} else if rerr != nil {
				a.log.Warn("could not take the current gossip keys from a seed", "err", rerr)
			}
		}
		a.log.Warn("join failed; retrying", "seeds", strings.Join(targets, ","), "err", err, "retryIn", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
		targets = a.joinTargets()
	}
}

// waitForState waits, after a join that follows dropping stale state, until
// the records stop arriving (2 s without a change, at most 30 s): acting
// on a half-received state would stop replicas that are still desired.
func (a *Agent) waitForState(ctx context.Context) {
	deadline := time.After(30 * time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			return
		case <-a.views.changed():
		case <-time.After(2 * time.Second):
			return
		}
	}
}

func (a *Agent) markSynced() {
	a.syncOnce.Do(func() { close(a.synced) })
}

// watchMembership turns membership changes into reconciles and keeps the
// list of live peers (for rejoining without seeds) and the last-seen time.
func (a *Agent) watchMembership(ctx context.Context) {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	purge := time.NewTicker(time.Hour)
	defer purge.Stop()
	var lastPeers string
	changed := a.views.changed()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
			if a.isSynced() {
				a.markSeen()
			}
		case <-purge.C:
			a.purgeTombstones()
		}
		changed = a.views.changed() // before the members are read
		var peers []string
		for _, m := range a.cluster.Members() {
			if m.Name != a.cfg.Name && m.State == gossip.StateAlive {
				peers = append(peers, net.JoinHostPort(m.Addr, strconv.Itoa(int(m.Port))))
			}
		}
		sort.Strings(peers)
		if b, _ := json.Marshal(peers); len(peers) > 0 && string(b) != lastPeers {
			if err := a.store.PutMeta(metaPeers, b); err == nil {
				lastPeers = string(b)
			}
		}
	}
}

func (a *Agent) isSynced() bool {
	select {
	case <-a.synced:
		return true
	default:
		return false
	}
}

// aliveMembers returns the names of members that count for placement:
// alive or suspect ("suspect" alone moves nothing), the local node always.
//
// Flap damping: a member this node saw dead or left, and that is back,
// counts only once it has stayed back for RejoinSettle. A node that was
// declared dead falsely (a busy CPU, a flaky link) then does not pull its
// replicas back and forth; failover itself is never delayed.
func (a *Agent) aliveMembers() map[string]bool {
	now := time.Now()
	alive := map[string]bool{a.cfg.Name: true}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range a.cluster.Members() {
		up := m.State.Up()
		_, wasDown := a.memberDown[m.Name]
		switch {
		case !up && !wasDown:
			a.memberDown[m.Name] = now
			delete(a.memberBack, m.Name)
		case !up:
		case wasDown:
			delete(a.memberDown, m.Name)
			a.memberBack[m.Name] = now
		}
		if !up {
			continue
		}
		if back, ok := a.memberBack[m.Name]; ok {
			if now.Sub(back) < a.cfg.RejoinSettle {
				continue
			}
			delete(a.memberBack, m.Name)
		}
		alive[m.Name] = true
	}
	return alive
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

// apiURL is the base URL peers use to reach this node's TCP API, or "".
func (a *Agent) apiURL() string {
	if a.cfg.APIListen == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(a.cfg.APIListen)
	if err != nil {
		return ""
	}
	// Peers accept only an address (checkStatus): a host name or an
	// unspecified address is replaced by the address peers know us by.
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = a.advertiseHost()
	}
	if net.ParseIP(host) == nil {
		return ""
	}
	scheme := "http://"
	if a.trust != nil {
		scheme = "https://" // the node's certificate (Run)
	}
	return scheme + net.JoinHostPort(host, port)
}

func (a *Agent) advertiseHost() string {
	for _, m := range a.cluster.Members() {
		if m.Name == a.cfg.Name {
			return m.Addr
		}
	}
	return a.cfg.Advertise
}

// purgeTombstones forgets deletes older than the tombstone TTL and tells
// gossip, whose digest index must match the store.
func (a *Agent) purgeTombstones() {
	n, err := a.store.Purge(time.Now(), a.cfg.TombstoneTTL)
	if err != nil {
		a.log.Warn("purge tombstones", "err", err)
	}
	if n > 0 {
		if err := a.cluster.Reindex(); err != nil {
			a.log.Warn("reindex gossip state after purge", "err", err)
		}
		a.log.Info("purged expired tombstones", "count", n, "ttl", a.cfg.TombstoneTTL)
	}
}
