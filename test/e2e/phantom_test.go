package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// TestPhantomMembersCountForNothing (issue 39): a holder of the gossip
// key (a compromised node's files) gossips two members under free names,
// which memberlist takes (no record binds those names, so no key is
// checked). They must count for nothing: no StatefulSet quorum counts
// them (before, 2 honest nodes and 2 phantoms that answer no quorum
// question made 2 of 4 known nodes: no majority, and both nodes killed
// their StatefulSet replicas), no subnet claim asks them, and `get nodes`
// does not list them; starling_uncertified_members shows them.
func TestPhantomMembersCountForNothing(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	honest := []*harness.Node{n1, n2} // c.Nodes grows with the phantoms' hosts
	importEcho(t, n1)
	waitReadyNodes(t, n1, 2)
	apply(t, n1, harness.App{Name: "db", Namespace: "phantoms", Replicas: 1, Grace: harness.Seconds(2),
		Ports: harness.Port8080}.StatefulSet("db"))
	const id = "phantoms_db-0"
	var on []string
	waitFor(t, 90*time.Second, func() error {
		on = runningCopies(c.Nodes, id)[id]
		if len(on) != 1 {
			return fmt.Errorf("%s runs on %v, want one node", id, on)
		}
		return nil
	})
	pids := func() string {
		var out []string
		for _, n := range honest {
			for rid, p := range n.TaskPIDs() {
				if strings.HasPrefix(rid, id) {
					out = append(out, fmt.Sprint(p))
				}
			}
		}
		slices.Sort(out)
		return strings.Join(out, ",")
	}
	// The replica's processes once it has settled (its first samples
	// can hold a process of its start).
	var before string
	waitFor(t, 30*time.Second, func() error {
		before = pids()
		time.Sleep(2 * time.Second)
		if now := pids(); now != before || before == "" {
			return fmt.Errorf("the replica's processes change: %q then %q", before, now)
		}
		return nil
	})

	// Both honest nodes hold the quorum when the phantoms come; a quorum
	// lost while the cluster formed under load is not their doing, so
	// only what is logged after this counts.
	logged := map[string]int{}
	for _, n := range honest {
		waitFor(t, 30*time.Second, func() error {
			l := logOf(t, n)
			if strings.LastIndex(l, "sees a majority") < strings.LastIndex(l, "quorum lost") || !strings.Contains(l, "sees a majority") {
				return fmt.Errorf("%s does not hold the quorum:\n%s", n.Name, grepLines(l, "quorum"))
			}
			logged[n.Name] = len(l)
			return nil
		})
	}
	for i, name := range []string{"ghost-a", "ghost-b"} {
		h, err := c.AddHost(name, 8+i)
		if err != nil {
			t.Fatal(err)
		}
		nsenter(t, "phantom "+name, "--net=/run/netns/"+h.NetNS, hostile, "--impostor", name, "--with", "gossip-key",
			"--secrets-from", n2.DataDir, "--bind", h.IP, "--join", n1.IP)
	}
	// Both honest nodes hold the phantoms as members (the attack is on).
	for _, n := range honest {
		waitFor(t, 30*time.Second, func() error {
			m, err := metrics(n)
			if err != nil {
				return err
			}
			if got := m["starling_uncertified_members"]; got != 2 {
				return fmt.Errorf("%s: starling_uncertified_members %v, want the 2 phantoms", n.Name, got)
			}
			return nil
		})
	}
	// Well past --fence-timeout (3 s) and a round: a quorum that
	// counted the phantoms would be lost by now.
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if now := pids(); now != before {
			t.Fatalf("the StatefulSet replica changed with phantoms in gossip: pids %q, before %q", now, before)
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, n := range honest {
		if l := logOf(t, n)[logged[n.Name]:]; strings.Contains(l, "quorum lost") {
			t.Errorf("%s lost its quorum to phantoms:\n%s", n.Name, grepLines(l, "quorum"))
		}
		out, err := n.CLI("get", "nodes")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "ghost-") {
			t.Errorf("%s lists a phantom in get nodes:\n%s", n.Name, out)
		}
	}
}
