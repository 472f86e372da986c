package e2e

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/test/harness"
)

// The agent writes its rules to the iptables backend the host's firewall
// is on, says which, and leaves none in the other (nor in nftables: two
// stacks would both run). Before, with the
// host's rules on iptables-legacy (Docker on an older host, a firewall
// script), it wrote to nft and said nothing: both sets ran, in an order
// nobody chose.
func TestRulesGoWhereTheHostsFirewallIs(t *testing.T) {
	n1 := echoNode(t)
	fw := harness.App{Name: "fw", Replicas: 1, Grace: harness.Seconds(1), Ports: harness.HTTPPort}
	apply(t, n1, harness.Manifests(fw.Deployment(), fw.Service("fw", []corev1.ServicePort{harness.ServicePort(80, "http")})))
	vip := clusterIP(t, n1, "fw")
	starlingChains := func(save string) (int, bool, error) {
		out, err := n1.Exec(t.Context(), save)
		if err != nil {
			return 0, false, err
		}
		return strings.Count(out, ":STARLING-"), strings.Contains(out, "-d "+vip+"/32"), nil
	}
	// No host rules anywhere: nftables (the ip starling table, with the
	// forward accept rules in iptables-nft), or with --proxy-mode
	// iptables, iptables-nft.
	if _, err := eventually(30*time.Second, func() error {
		if _, err := harness.HTTPGet(n1.NetNS, "http://"+vip+"/", time.Second); err != nil {
			return err
		}
		n, svc, err := starlingChains("iptables-nft-save")
		if n1.ProxyMode() == "nftables" {
			rules, nerr := n1.ServiceRules(t.Context())
			if err != nil || nerr != nil || n == 0 || svc || !strings.Contains(rules, vip+" . tcp . 80 : goto service-") {
				return fmt.Errorf("nftables: Service in the table %v; iptables-nft: %d Starling chains, Service rule %v (%v, %v)",
					strings.Contains(rules, vip), n, svc, err, nerr)
			}
			return nil
		}
		if err != nil || n == 0 || !svc {
			return fmt.Errorf("nft: %d Starling chains, Service rule %v, %v", n, svc, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The host's firewall, on legacy (as Docker on iptables-legacy):
	// the restarted agent moves its rules there.
	for _, rule := range [][]string{
		{"-t", "nat", "-A", "POSTROUTING", "-s", "172.17.0.0/16", "!", "-o", "docker0", "-j", "MASQUERADE"},
		{"-A", "INPUT", "-s", "203.0.113.0/24", "-j", "DROP"},
	} {
		if _, err := n1.Exec(t.Context(), "iptables-legacy", rule...); err != nil {
			t.Fatal(err)
		}
	}
	logBefore, _ := os.ReadFile(n1.AgentLogPath())
	n1.KillAgent(syscall.SIGTERM)
	if err := n1.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	if _, err := eventually(30*time.Second, func() error {
		if _, err := harness.HTTPGet(n1.NetNS, "http://"+vip+"/", time.Second); err != nil {
			return err
		}
		n, svc, err := starlingChains("iptables-legacy-save")
		if err != nil || n == 0 || !svc {
			return fmt.Errorf("legacy: %d Starling chains, Service rule %v, %v", n, svc, err)
		}
		if n, _, err := starlingChains("iptables-nft-save"); err != nil || n != 0 {
			return fmt.Errorf("nft still holds %d Starling chains (%v)", n, err)
		}
		if out, err := n1.Exec(t.Context(), "nft", "list", "tables"); err != nil || strings.Contains(out, "ip starling") {
			return fmt.Errorf("the nftables table is still there: %s %v", out, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	logAll, _ := os.ReadFile(n1.AgentLogPath())
	if since := string(logAll[len(logBefore):]); !strings.Contains(since, `msg="iptables backend chosen" backend=iptables-legacy`) ||
		!strings.Contains(since, `msg="service proxy mode chosen" mode=iptables`) {
		t.Fatalf("the agent did not log its choice of iptables-legacy for its Service rules:\n%s", since)
	}
}
