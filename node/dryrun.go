package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/ipam"
	"github.com/starling-orchestrator/starling/net/podnet"
	"github.com/starling-orchestrator/starling/net/route"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/net/xtables"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/dataplane"
	"github.com/starling-orchestrator/starling/node/preflight"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
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

func (dryRuntime) List(context.Context) ([]reconcile.Container, error) { return nil, nil }
func (dryRuntime) Execute(context.Context, reconcile.Action) error     { return errDryRun }
func (dryRuntime) UpdateVolume(string, reconcile.Volume, []reconcile.File) (bool, error) {
	return false, nil
}
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

// printer writes the dry run's sections (a header line, then a body) to
// out, each only when it differs from what it printed last of that kind.
// The route and rule syncers of a dry-run agent are printers: the same
// loops that apply routes and rules on a real node print them here.
type printer struct {
	out  io.Writer
	nft  bool // print the Service rules as the nftables table
	mu   sync.Mutex
	last map[string]string
}

func newPrinter(out io.Writer) *printer {
	if out == nil {
		out = os.Stdout
	}
	return &printer{out: out, last: map[string]string{}}
}

// print writes section (header line, body) of kind when it changed.
func (p *printer) print(kind, section string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last[kind] == section {
		return
	}
	p.last[kind] = section
	header, body, _ := strings.Cut(section, "\n")
	fmt.Fprint(p.out, comment(time.Now(), header)+body)
}

// routes is the route applier of a dry run: it prints the routes.
func (p *printer) routes(rs []route.Route) (route.Change, error) {
	p.print("routes", dryRunRoutes(rs))
	return route.Change{}, nil
}

// Sync is the rule syncer of a dry run: it prints the rules.
func (p *printer) Sync(_ context.Context, ports []service.Port, cfg service.Config) (bool, error) {
	if p.nft {
		p.print("rules", fmt.Sprintf("Service rules this node would apply (%d service ports), over netlink as this nftables table (nft -f syntax):\n%s",
			len(ports), service.NFTText(ports, cfg)))
		return false, nil
	}
	p.print("rules", dryRunRules(ports, cfg))
	return false, nil
}

// SyncServices is Sync over every port: a dry run prints the whole table.
func (p *printer) SyncServices(ctx context.Context, _ map[string][]service.Port, all func() []service.Port, cfg service.Config) (bool, error) {
	return p.Sync(ctx, all(), cfg)
}

// dryRunNFT reports whether a real start with proxy mode would write
// nftables rules (dataplane.ServiceSyncer), asking the host without changing it.
func dryRunNFT(ctx context.Context, mode string) bool {
	switch mode {
	case dataplane.ProxyNftables:
		return true
	case dataplane.ProxyIptables:
		return false
	}
	var nftErr error
	if !service.NFTAvailable() {
		nftErr = errors.New("no answer")
	}
	b, _ := xtables.Detect(ctx)
	mode, _ = dataplane.AutoProxyMode(ctx, b, nftErr)
	return mode == dataplane.ProxyNftables
}

// bridgeNFLoaded reports whether br_netfilter is loaded: where it is, a
// real agent turns bridge-nf-call-iptables on, so only its absence means
// masquerading all Service traffic (the dry run's view of bridgeNFOn).
func bridgeNFLoaded() bool {
	_, err := os.Stat(preflight.BridgeNFCallIPTables)
	return err == nil
}

// dryRun is the loop only a dry-run agent runs: once the node holds the
// cluster's state, it withdraws any ready record of its name, prints the
// pod subnet it would claim whenever that changes, and opens ready for
// the printing route and rule loops.
type dryRun struct {
	self    string
	fixed   string // --pod-subnet
	cluster *net.IPNet
	store   Store
	clock   *hlc.Clock
	members *members
	subnets *subnets
	status  *self
	views   *view.Builder
	print   *printer
	log     *slog.Logger
	ready   chan struct{}
}

func (d *dryRun) loop(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-d.members.synced:
	}
	d.withdrawOwnRecord()
	// Let the records the join brought arrive, so the first print is not
	// of a half-known cluster (and a record of this name that came with
	// them is withdrawn too).
	waitForState(ctx, d.views.Changed, 30*time.Second)
	d.withdrawOwnRecord()
	var claim ipam.Claim
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for first := true; ; first = false {
		changed := d.views.Changed()
		var note string
		claim, note = d.claim(claim)
		d.subnets.set(claim, false) // in memory only, for the routes; never published
		d.print.print("subnet", dryRunSubnet(claim, note, d.cluster.String()))
		if first {
			close(d.ready)
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
func (d *dryRun) withdrawOwnRecord() {
	rec, ok, err := d.store.Get(view.StatusKey(d.self))
	if err != nil || !ok || rec.Deleted {
		return
	}
	var s view.NodeStatus
	if json.Unmarshal(rec.Value, &s) != nil || !s.SubnetReady && len(s.Replicas) == 0 {
		return
	}
	view.CapTimes(&s, rec.Version) // the claim as its peers read it
	d.subnets.set(ipam.Claim{Node: d.self, Subnet: s.PodSubnet, Since: s.SubnetSince}, false)
	d.log.Warn("dry run: the cluster holds a ready record of this node's name; republishing it as not ready so peers neither place replicas here nor route here",
		"subnet", s.PodSubnet)
	d.status.publishStatus(nil)
}

// claim is the subnet claimSubnet would settle on now, given the last
// answer (kept while nobody else claims it), without publishing or
// persisting anything. note explains a conflict.
func (d *dryRun) claim(prev ipam.Claim) (claim ipam.Claim, note string) {
	others := d.subnets.others()
	claim = prev
	if claim.Subnet == "" {
		claim = d.subnets.kept()
	}
	if d.fixed != "" && claim.Subnet != d.fixed {
		claim = ipam.Claim{Node: d.self, Subnet: d.fixed, Since: d.clock.Now()}
	}
	claim.Node = d.self
	who, lost := ipam.Lost(claim, others)
	// A subnet this run picked is only hypothetical: anyone else's claim
	// on it counts, whatever its time.
	taken := ipam.Taken(others)[claim.Subnet] && d.fixed == ""
	switch {
	case claim.Subnet == "" || (lost || taken) && d.fixed == "":
		sub, err := ipam.Pick(d.cluster, d.self, ipam.Taken(others))
		if err != nil {
			return ipam.Claim{}, err.Error()
		}
		return ipam.Claim{Node: d.self, Subnet: sub.String(), Since: d.clock.Now()}, ""
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

// dryRunRules is the Service rules text a real agent would restore.
func dryRunRules(ports []service.Port, cfg service.Config) string {
	text := service.Rules(ports, cfg)
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
