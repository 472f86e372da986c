package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/starling-orchestrator/starling/net/ipam"
	"github.com/starling-orchestrator/starling/net/podnet"
	"github.com/starling-orchestrator/starling/net/route"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/preflight"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// An agent started with --dry-run (Config.DryRun) joins the cluster and
// keeps its replicated state like any node, but claims nothing, runs no
// container and changes nothing in its network namespace: no bridge,
// route, iptables rule or sysctl. Instead it prints to stdout, whenever
// one of them changes, the pod subnet it would claim, the routes to peers'
// pod subnets it would install and the Service rules it would apply, all
// computed by the same functions a real agent applies (ipam.Pick,
// route.Desired, service.Rules) from its live view of the cluster.
//
// It publishes no node record, so peers neither place replicas on it nor
// route to it; `get nodes` shows it as a member without a subnet. If the
// cluster already holds a record of its name (a stopped node's data dir
// reused), it republishes that record as not ready, for the same reason.

// errDryRun is what the runtime of a dry-run agent answers to anything
// that would touch containerd.
var errDryRun = errors.New("this node runs with --dry-run: it runs no containers and stores no images")

// dryRuntime is the Runtime of a dry-run agent: no containers, no images.
type dryRuntime struct{}

func (dryRuntime) List(context.Context) ([]reconcile.Container, error)       { return nil, nil }
func (dryRuntime) Execute(context.Context, reconcile.Action) error           { return errDryRun }
func (dryRuntime) WatchExits(ctx context.Context, _ func())                  { <-ctx.Done() }
func (dryRuntime) LogPath(string) string                                     { return "" }
func (dryRuntime) ImportImages(context.Context, io.Reader) ([]string, error) { return nil, errDryRun }
func (dryRuntime) Images(context.Context) ([]api.Image, error)               { return nil, nil }
func (dryRuntime) WriteBlob(context.Context, digest.Digest, func(int64), io.Writer) error {
	return errDryRun
}
func (dryRuntime) HasImage(context.Context, string) bool               { return false }
func (dryRuntime) ImageProgress(string) string                         { return "" }
func (dryRuntime) CgroupPath(id string) string                         { return "" }
func (dryRuntime) PreviousLogPath(string) string                       { return "" }
func (dryRuntime) ImageDigest(context.Context, string) (string, error) { return "", errDryRun }
func (dryRuntime) Close() error                                        { return nil }
func (dryRuntime) CleanupSandboxes(context.Context, []reconcile.Container, func(string) (func(), bool)) error {
	return nil
}

func (a *Agent) dryRunOut() io.Writer {
	if a.cfg.dryRunOut != nil {
		return a.cfg.dryRunOut
	}
	return os.Stdout
}

// dryRunLoop prints the would-be subnet, routes and Service rules when
// they change: on store and membership changes and every second.
func (a *Agent) dryRunLoop(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-a.synced:
	}
	a.withdrawOwnRecord()
	// Let the records the join brought arrive, so the first print is not
	// of a half-known cluster (and a record of this name that came with
	// them is withdrawn too).
	a.waitForState(ctx)
	a.withdrawOwnRecord()
	var claim ipam.Claim
	var last [3]string
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		changed := a.views.changed()
		var note string
		claim, note = a.dryRunClaim(claim)
		a.subnetMu.Lock()
		a.subnet = claim // in memory only, for desiredRoutes; never published
		a.subnetMu.Unlock()
		sections := [3]string{dryRunSubnet(claim, note, a.cfg.ClusterCIDR), dryRunRoutes(a.desiredRoutes()), a.dryRunRules()}
		var out strings.Builder
		now := time.Now()
		for i, s := range sections {
			if s != last[i] {
				out.WriteString(comment(now, strings.SplitN(s, "\n", 2)[0]))
				out.WriteString(strings.SplitN(s, "\n", 2)[1])
				last[i] = s
			}
		}
		if out.Len() > 0 {
			fmt.Fprint(a.dryRunOut(), out.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-changed:
		}
	}
}

// withdrawOwnRecord republishes an existing record of this node's name as
// not ready and without replicas, so peers stop placing replicas on it
// and routing to it.
func (a *Agent) withdrawOwnRecord() {
	rec, ok, err := a.store.Get(statusKey(a.cfg.Name))
	if err != nil || !ok || rec.Deleted {
		return
	}
	var s NodeStatus
	if json.Unmarshal(rec.Value, &s) != nil || !s.SubnetReady && len(s.Replicas) == 0 {
		return
	}
	a.subnetMu.Lock()
	a.subnet = ipam.Claim{Node: a.cfg.Name, Subnet: s.PodSubnet, Since: s.SubnetSince}
	a.subnetMu.Unlock()
	a.log.Warn("dry run: the cluster holds a ready record of this node's name; republishing it as not ready so peers neither place replicas here nor route here",
		"subnet", s.PodSubnet)
	a.publishStatus(nil)
}

// dryRunClaim is the subnet claimSubnet would settle on now, given the
// last answer (kept while nobody else claims it), without publishing or
// persisting anything. note explains a conflict.
func (a *Agent) dryRunClaim(prev ipam.Claim) (claim ipam.Claim, note string) {
	others := a.otherClaims()
	claim = prev
	if claim.Subnet == "" {
		if b, ok, err := a.store.GetMeta(metaSubnet); err == nil && ok {
			json.Unmarshal(b, &claim)
		}
	}
	if a.cfg.PodSubnet != "" && claim.Subnet != a.cfg.PodSubnet {
		claim = ipam.Claim{Node: a.cfg.Name, Subnet: a.cfg.PodSubnet, Since: a.clock.Now()}
	}
	claim.Node = a.cfg.Name
	who, lost := ipam.Lost(claim, others)
	// A subnet this run picked is only hypothetical: anyone else's claim
	// on it counts, whatever its time.
	taken := ipam.Taken(others)[claim.Subnet] && a.cfg.PodSubnet == ""
	switch {
	case claim.Subnet == "" || (lost || taken) && a.cfg.PodSubnet == "":
		_, cluster, _ := net.ParseCIDR(a.cfg.ClusterCIDR)
		sub, err := ipam.Pick(cluster, a.cfg.Name, ipam.Taken(others))
		if err != nil {
			return ipam.Claim{}, err.Error()
		}
		return ipam.Claim{Node: a.cfg.Name, Subnet: sub.String(), Since: a.clock.Now()}, ""
	case lost:
		return claim, fmt.Sprintf("conflict: node %s claimed it earlier; a real start would refuse to run pods on it until --pod-subnet is fixed", who)
	}
	return claim, ""
}

// comment turns text into "# "-prefixed lines stamped with t, so the
// output stays valid iptables-restore and shell input.
func comment(t time.Time, text string) string {
	var b strings.Builder
	for i, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		if i == 0 {
			fmt.Fprintf(&b, "# %s %s\n", t.UTC().Format(time.RFC3339), line)
		} else {
			fmt.Fprintf(&b, "#   %s\n", line)
		}
	}
	return b.String()
}

// The dry-run sections: a header line, then the body.

func dryRunSubnet(c ipam.Claim, note, clusterCIDR string) string {
	if c.Subnet == "" {
		return "pod subnet this node would claim: none (" + note + ")\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pod subnet this node would claim (bridge starling0):\n%s\n", c.Subnet)
	if note != "" {
		fmt.Fprintf(&b, "# %s\n", note)
	}
	fmt.Fprintf(&b, "iptables -t nat -A %s -s %s ! -d %s -m comment --comment %q -j MASQUERADE\n",
		podnet.MasqueradeChain, c.Subnet, clusterCIDR, podnet.MasqueradeComment)
	return b.String()
}

func dryRunRoutes(rs []route.Route) string {
	var b strings.Builder
	fmt.Fprintf(&b, "routes this node would install (%d; every other route is left alone):\n", len(rs))
	for _, r := range rs {
		fmt.Fprintf(&b, "ip route replace %s proto %d\n", r, route.Protocol)
	}
	return b.String()
}

// dryRunRules is the Service rules text a real agent would restore. Where
// br_netfilter is loaded the agent turns bridge-nf-call-iptables on, so
// only its absence means masquerading all Service traffic.
func (a *Agent) dryRunRules() string {
	ports := a.view().ports
	_, statErr := os.Stat(preflight.BridgeNFCallIPTables)
	text := service.Rules(ports, service.Config{ClusterCIDR: a.clusterCIDR, MasqueradeAll: statErr != nil}, nil)
	var b strings.Builder
	fmt.Fprintf(&b, "Service rules this node would apply (%d service ports), with iptables-restore --noflush, after:\n", len(ports))
	for _, j := range service.JumpCommands() {
		fmt.Fprintf(&b, "#   %s\n", j)
	}
	b.Write(text)
	return b.String()
}

func (dryRuntime) Exec(context.Context, string, []string, time.Duration) (int, string, error) {
	return 0, "", errDryRun
}
