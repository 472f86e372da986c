package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// TestNodeBackAtANewAddress: n3 crashes (agent SIGKILLed; its containers
// keep running, as after an agent crash) and comes back at another LAN
// address, as a home host does after a reboot with a new DHCP lease:
// first 2 s later, before its peers find it dead, then again once they
// have found it dead and replaced its copies. Sampled every 0.2 s: n1
// and n2 route n3's pod subnet to its new address within failure
// detection + 2 s of the return; back before detection, no copy runs
// twice; after a return, copies run twice only for a handover (at most
// 6 s in a row): n3 stops the copies its peers replaced until they count
// it again (askSettle); the logs name a return at a new address ("member returned
// at a new address" member=n3 addr=<new> was=<old>), never a second node
// or a name in use. Before issue 39 the return took 52-61 s to be seen
// (memberlist's DeadNodeReclaimTime unset) while both sides ran copies,
// and n1 logged n3's own earlier run as "a second node".
func TestNodeBackAtANewAddress(t *testing.T) {
	t.Parallel() // mostly waiting for failure detection: runs beside another such test
	c := newCluster(t, 3)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	importEcho(t, n1)
	waitReadyNodes(t, n1, 3)
	apply(t, n1, deployment("homeapp", 6, "homeapp"))
	waitFor(t, 90*time.Second, func() error {
		cs := harness.TakeCensus(c.Nodes, "default", "homeapp")
		if cs.Available != 6 || cs.Existing != 6 || cs.ByNode["n3"] == 0 {
			return fmt.Errorf("want 6 copies, some on n3: %v", cs.Copies)
		}
		return nil
	})
	// Containers per copy (a sandbox and the app), from the live count.
	tasks := func() int {
		total := 0
		for _, n := range c.Nodes {
			total += len(n.TaskPIDs())
		}
		return total
	}
	perCopy := tasks() / 6
	if perCopy < 1 {
		t.Fatalf("no container of homeapp runs: %d tasks", tasks())
	}

	// First back before failure detection (the peers still hold n3 alive
	// at its old address), then after it (they hold n3 dead and replaced
	// its copies).
	returnAt(t, c, tasks, perCopy, 9, false)
	returnAt(t, c, tasks, perCopy, 8, true)
	for _, n := range c.Nodes {
		b, err := os.ReadFile(n.AgentLogPath())
		if err != nil {
			t.Fatal(err)
		}
		log := string(b)
		for _, bad := range []string{"second node", "another --name", "already uses this name", "malformed message"} {
			if strings.Contains(log, bad) {
				t.Errorf("%s's log says %q about n3's return:\n%s", n.Name, bad, grepLines(log, bad))
			}
		}
	}
	if !strings.Contains(logOf(t, n1)+logOf(t, n2), "returned at a new address") {
		t.Errorf("no honest node logged n3's return at a new address")
	}
	for _, n := range []*harness.Node{n1, n2} {
		l := logOf(t, n)
		if strings.Contains(l, "returned at a new address") && !strings.Contains(grepLines(l, "returned at a new address"), "addr="+n3.IP) {
			t.Errorf("%s logs the return without the new address %s:\n%s", n.Name, n3.IP, grepLines(l, "returned at a new address"))
		}
	}
}

// returnAt kills n3's agent, moves n3 to LAN address i and restarts it,
// 2 s later or, with afterDetection, once n1 holds n3 dead and 5 s
// later. It samples (every 0.2 s) the honest nodes' routes to n3's
// subnet and the copies of homeapp running on every node, and checks the
// bounds of TestNodeBackAtANewAddress.
func returnAt(t *testing.T, c *harness.Cluster, tasks func() int, perCopy, i int, afterDetection bool) {
	t.Helper()
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	oldIP := n3.IP
	var mu sync.Mutex
	routed := map[string]time.Time{} // by honest node: first time it routes n3's subnet to the new address
	var returned time.Time
	sawDead := false // n1 held n3 dead (before its return is meant to be before that)
	// maxCopies: the most copies running at once on all nodes; after the
	// return, doubledSince starts each stretch of samples with more than
	// 6 copies and longestDoubled is the longest stretch.
	maxCopies, most := 0, ""
	var doubledSince time.Time
	var longestDoubled time.Duration
	stop := every(200*time.Millisecond, func() {
		byNode := map[string]int{}
		for _, n := range c.Nodes {
			byNode[n.Name] = len(n.TaskPIDs())
		}
		if !afterDetection {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			nodes, err := n1.API().Nodes(ctx)
			cancel()
			for _, m := range nodes {
				if err == nil && m.Name == "n3" && m.State == "dead" {
					mu.Lock()
					sawDead = true
					mu.Unlock()
				}
			}
		}
		copies := (byNode["n1"] + byNode["n2"] + byNode["n3"]) / perCopy
		mu.Lock()
		newIP, ret := n3.IP, returned
		mu.Unlock()
		for _, n := range []*harness.Node{n1, n2} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			out, err := n.Exec(ctx, "ip", "route", "show", n3.PodSubnet)
			cancel()
			mu.Lock()
			if err == nil && !ret.IsZero() && strings.Contains(out, "via "+newIP+" ") && routed[n.Name].IsZero() {
				routed[n.Name] = time.Now()
			}
			mu.Unlock()
		}
		mu.Lock()
		if copies > maxCopies {
			maxCopies, most = copies, fmt.Sprintf("containers by node %v at %s", byNode, time.Now().Format("15:04:05.0"))
		}
		switch {
		case ret.IsZero():
		case copies > 6 && doubledSince.IsZero():
			doubledSince = time.Now()
		case copies > 6:
			longestDoubled = max(longestDoubled, time.Since(doubledSince))
		default:
			doubledSince = time.Time{}
		}
		mu.Unlock()
	})
	defer stop() // also when a wait below fails

	n3.KillAgent(syscall.SIGKILL)
	if err := n3.MoveTo(i); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if afterDetection {
		waitHeld(t, 30*time.Second, []*harness.Node{n1}, "n3", "dead", "")
		time.Sleep(5 * time.Second)
	}
	if err := n3.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	returned = time.Now()
	mu.Unlock()
	t.Logf("n3 back at %s (was %s; after detection: %v)", n3.IP, oldIP, afterDetection)

	// Every honest node holds n3 alive at its new address.
	waitHeld(t, 30*time.Second, []*harness.Node{n1, n2}, "n3", "alive", n3.IP)
	waitFor(t, 45*time.Second, func() error {
		cs := harness.TakeCensus(c.Nodes, "default", "homeapp")
		if cs.Available != 6 || cs.Existing != 6 || len(cs.Names) != 6 {
			return fmt.Errorf("want 6 distinct ready copies: %v", cs.Copies)
		}
		return nil
	})
	// Sample on until 32 s after the return (the "none twice" window).
	if d := time.Until(returned.Add(32 * time.Second)); d > 0 {
		time.Sleep(d)
	}
	stop()

	// Failure detection here: memberlist's suspicion of a dead address, at
	// most ~6 s for 3 nodes with the agent's gossip timing.
	const detection = 6 * time.Second
	for _, n := range []*harness.Node{n1, n2} {
		at := routed[n.Name]
		if at.IsZero() {
			t.Errorf("%s never routed n3's subnet %s to its new address %s", n.Name, n3.PodSubnet, n3.IP)
			continue
		}
		took := at.Sub(returned)
		t.Logf("%s routed n3's subnet to %s %v after the return", n.Name, n3.IP, took.Round(100*time.Millisecond))
		if took > detection+2*time.Second {
			t.Errorf("%s took %v to route n3's subnet to its new address, want at most detection + 2 s (%v)", n.Name, took, detection+2*time.Second)
		}
	}
	t.Logf("most copies at once: %d (6 replicas, %d containers each): %s", maxCopies, perCopy, most)
	if !afterDetection && sawDead {
		// A machine too busy to restart the agent within failure
		// detection: n3's peers replaced its copies, the case the
		// second return tests.
		t.Logf("n1 found n3 dead before it was back: no check that nothing ran twice")
	}
	if !afterDetection && !sawDead && maxCopies > 6 {
		t.Errorf("up to %d copies of homeapp ran at once while n3 was back before its peers found it dead, want 6 (nothing to replace)", maxCopies)
	}
	// A copy runs twice only for a handover: the new copy starts, the old
	// one stops once it is ready (grace period 3 s). Before, n3's copies
	// ran beside their replacements until its peers counted it again
	// (--rejoin-settle 10 s) and then handed them back: 13 s.
	t.Logf("longest stretch with copies running twice after the return: %v", longestDoubled.Round(100*time.Millisecond))
	if longestDoubled > 6*time.Second {
		t.Errorf("copies of homeapp ran twice for %v in a row after n3's return, want only handovers (at most 6 s); membership as each node logged it:\n%s",
			longestDoubled, membershipLines(t, c.Nodes))
	}
}

// membershipLines returns, node by node, the log lines that tell how it
// held n3 (dead, suspect, back, settling): what a failure of the
// handover bound is read from when the full logs are cut.
func membershipLines(t *testing.T, nodes []*harness.Node) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "== %s\n", n.Name)
		for _, l := range strings.Split(logOf(t, n), "\n") {
			for _, k := range []string{"member=n3", "new address", "out of placement", "counts itself", "joined cluster"} {
				if strings.Contains(l, k) {
					b.WriteString(l + "\n")
					break
				}
			}
		}
	}
	return b.String()
}

func logOf(t *testing.T, n *harness.Node) string {
	b, err := os.ReadFile(n.AgentLogPath())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
