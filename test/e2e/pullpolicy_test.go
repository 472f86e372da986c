package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/test/harness"
)

// TestImagePullPolicyIsHonoured: imagePullPolicy as the kubelet honours
// it with containerd. echo:v1 is imported on n1 (the cluster records its
// digest); n2 also holds an image, ghost:latest, that only its own
// containerd has (put there with ctr, as a user who loaded it by hand
// would). On n2:
//   - Never runs only what n2 holds: echo:v1 is refused with a REASON
//     naming the policy (ErrImageNeverPull) and runs once n2 has it;
//   - Always takes echo:v1 from the peer (the digest the cluster
//     recorded), and refuses ghost:latest (":latest" defaults to Always),
//     which no node imported and no registry serves, with a REASON that
//     says it resolves nowhere, where IfNotPresent runs n2's copy.
//
// Before, every policy meant "the node's copy, else a peer's, else the
// registry's": Never fetched from the peer, Always ran the local ghost.
func TestImagePullPolicyIsHonoured(t *testing.T) {
	t.Parallel() // mostly waiting: runs beside another such test
	c := emptyCluster(t)
	for i := 1; i <= 2; i++ {
		n, err := c.AddNode(fmt.Sprintf("n%d", i), i)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.StartAgent("--node-label=zone=" + n.Name); err != nil {
			t.Fatal(err)
		}
	}
	n1, n2 := c.Nodes[0], c.Nodes[1]
	waitReadyNodes(t, n1, 2)
	importEcho(t, n1)
	ctr := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := n2.Exec(ctx, "ctr", append([]string{"--address", n2.ContainerdSocket(), "-n", "starling"}, args...)...); err != nil {
			t.Fatalf("ctr %v: %v %s", args, err, out)
		}
	}
	ctr("images", "import", echoV1Tar)
	ctr("images", "tag", "starling.local/echo:v1", "starling.local/ghost:latest")
	ctr("images", "rm", "starling.local/echo:v1")

	pinned := func(name, image string, policy corev1.PullPolicy, zone string) string {
		return harness.App{Name: name, Replicas: 1, Image: image, Grace: harness.Seconds(2), Ports: harness.Port8080,
			Pod: func(p *corev1.PodSpec) {
				p.NodeSelector = map[string]string{"zone": zone}
				p.Containers[0].ImagePullPolicy = policy
			}}.Deployment()
	}
	running := func(name, node string) func() error {
		return func() error {
			cs := harness.TakeCensus(c.Nodes, "default", name)
			if cs.Available != 1 || cs.ReadyByNode[node] != 1 {
				return fmt.Errorf("%s: want 1 ready on %s: %v", name, node, cs.Copies)
			}
			return nil
		}
	}
	refused := func(name string, want ...string) func() error {
		return func() error {
			out, err := n1.CLI("describe", "deployment", name)
			if err != nil {
				return err
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					return fmt.Errorf("describe %s does not say %q yet:\n%s", name, w, out)
				}
			}
			// A create attempt shows as ContainerCreating; none may run.
			cs := harness.TakeCensus(c.Nodes, "default", name)
			for _, cp := range cs.Copies {
				if strings.Contains(cp, " Running") {
					return fmt.Errorf("%s runs: %v", name, cs.Copies)
				}
			}
			return nil
		}
	}

	apply(t, n1, pinned("never-n1", "starling.local/echo:v1", "Never", "n1"))
	apply(t, n1, pinned("ghost-local", "starling.local/ghost:latest", "IfNotPresent", "n2"))
	waitFor(t, 60*time.Second, running("never-n1", "n1"))
	waitFor(t, 60*time.Second, running("ghost-local", "n2"))
	// (Applied after ghost-local runs: a create that fails slowly, ~13 s
	// of registry DNS timeout each, held n2's other creates back; see the
	// issue note.)
	apply(t, n1, pinned("never-n2", "starling.local/echo:v1", "Never", "n2"))
	apply(t, n1, pinned("ghost-always", "starling.local/ghost:latest", "", "n2"))
	waitFor(t, 60*time.Second, refused("never-n2", "imagePullPolicy is Never", "ErrImageNeverPull"))
	waitFor(t, 60*time.Second, refused("ghost-always", "resolves nowhere and imagePullPolicy is Always", "no node imported"))
	// Still refused a while later: the policy, not a slow fetch, holds them.
	time.Sleep(5 * time.Second)
	waitFor(t, time.Second, refused("never-n2", "imagePullPolicy is Never"))
	waitFor(t, time.Second, refused("ghost-always", "resolves nowhere"))

	// Always on n2 takes echo:v1 from n1, by the digest the cluster
	// recorded; then n2 holds it, and Never runs it there too.
	apply(t, n1, pinned("always-n2", "starling.local/echo:v1", "Always", "n2"))
	waitFor(t, 60*time.Second, running("always-n2", "n2"))
	if l := logOf(t, n2); !strings.Contains(grepLines(l, "image fetched from a peer"), "starling.local/echo:v1") {
		t.Errorf("n2 did not log fetching echo:v1 from a peer:\n%s", grepLines(l, "image"))
	}
	waitFor(t, 90*time.Second, running("never-n2", "n2"))
}
