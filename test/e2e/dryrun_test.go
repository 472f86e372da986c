package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/test/harness"
)

// netState is what an agent could change in its network namespace:
// routes (every table), links, iptables and nftables (without counters)
// and the two sysctls it sets.
func netState(t *testing.T, n *harness.Node) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	counters := regexp.MustCompile(`\[\d+:\d+\]|counter packets \d+ bytes \d+`)
	var b strings.Builder
	for _, cmd := range [][]string{
		{"ip", "-4", "route", "show", "table", "all"}, // IPv6 link-local routes come and go by themselves
		{"ip", "-br", "link"},
		{"iptables-save"},
		{"nft", "list", "ruleset"},
		{"cat", "/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/bridge/bridge-nf-call-iptables"},
	} {
		out, err := n.Exec(ctx, cmd[0], cmd[1:]...)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "== %s\n", strings.Join(cmd, " "))
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "#") {
				continue // iptables-save's dated comments
			}
			if f := strings.Fields(line); strings.Join(cmd, " ") == "ip -br link" && len(f) > 0 {
				line = f[0] // names only
			}
			fmt.Fprintln(&b, counters.ReplaceAllString(line, ""))
		}
	}
	return b.String()
}

// TestDryRunPrintsRoutesAndRulesAndInstallsNothing: an agent started with
// --dry-run next to a real node prints the route to that node's /24 and
// the Service rules with the real node's endpoint, leaves the routes,
// links, iptables and sysctls of its namespace as they were, and gets no
// replica.
func TestDryRunPrintsRoutesAndRulesAndInstallsNothing(t *testing.T) {
	t.Parallel() // long and mostly waiting: runs beside another such test
	c := newCluster(t, 1)
	n1 := c.Nodes[0]
	importEcho(t, n1)
	apply(t, n1, harness.Manifests(deployment("web", 1, "hello"),
		harness.App{Name: "web"}.Service("web", []corev1.ServicePort{harness.ServicePort(80, "8080")})))
	reps, _ := waitRunning(t, n1, "web", 1, 60*time.Second)

	n2, err := c.AddNode("n2", 2)
	if err != nil {
		t.Fatal(err)
	}
	before := netState(t, n2)
	if err := n2.StartAgent("--dry-run"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"pod subnet this node would claim", "\n" + n2.PodSubnet + "\n",
		fmt.Sprintf("ip route replace %s via %s proto 87\n", n1.PodSubnet, n1.IP),
	}
	if _, err := eventually(30*time.Second, func() error {
		log, err := os.ReadFile(n2.AgentLogPath())
		if err != nil {
			return err
		}
		for _, w := range want {
			if !strings.Contains(string(log), w) {
				return fmt.Errorf("dry-run output lacks %q", w)
			}
		}
		// The endpoint, in the rules of the proxy mode a real start
		// would choose.
		if !strings.Contains(string(log), "-j DNAT --to-destination "+reps[0].PodIP+":8080") &&
			!strings.Contains(string(log), " : "+reps[0].PodIP+" . 8080") {
			return fmt.Errorf("dry-run output lacks a DNAT to %s:8080", reps[0].PodIP)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v:\n%s", err, n2.Tail(80))
	}

	// Peers place nothing on it: a second replica also goes to n1.
	if _, err := n1.CLI("scale", "deployment/web", "--replicas", "2"); err != nil {
		t.Fatal(err)
	}
	for _, r := range func() []replica { r, _ := waitRunning(t, n1, "web", 2, 60*time.Second); return r }() {
		if r.Node != "n1" {
			t.Fatalf("replica %s placed on %s, a dry-run node", r.Name, r.Node)
		}
	}
	if after := netState(t, n2); after != before {
		t.Fatalf("dry run changed its network namespace:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	t.Logf("dry-run namespace unchanged:\n%s", before)
}
