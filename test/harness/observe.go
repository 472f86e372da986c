package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/starling-orchestrator/starling/node/api"
)

// Replicas returns every replica the node knows of, in every namespace,
// from its API (no CLI process, so it is cheap enough to poll).
func (n *Node) Replicas() ([]api.Replica, error) {
	return n.API().Replicas(context.Background())
}

// Census is one sample of a workload's copies across nodes, each node
// counting only the containers it runs itself (its live observation, not
// what gossip says about its peers).
type Census struct {
	// Available counts Running and ready copies.
	Available int
	// Existing counts copies that have a container (Terminating included).
	Existing int
	// ByHash and ReadyByHash count copies, and ready copies, by spec hash;
	// ByNode and ReadyByNode by node.
	ByHash, ReadyByHash, ByNode, ReadyByNode map[string]int
	// ReadyIPs are the pod IPs of the ready copies, by node.
	ReadyIPs map[string][]string
	// Names are the replica names counted.
	Names map[string]bool
	// Copies lists the copies counted, as "name node phase" ("+ready"
	// when ready), for reports.
	Copies []string
	// Complete is false when a node did not answer.
	Complete bool
}

// TakeCensus asks every node, in parallel, for the copies of
// namespace/workload it runs.
func TakeCensus(nodes []*Node, namespace, workload string) Census {
	cs := Census{ByHash: map[string]int{}, ReadyByHash: map[string]int{}, ByNode: map[string]int{}, ReadyByNode: map[string]int{},
		ReadyIPs: map[string][]string{}, Names: map[string]bool{}, Complete: true}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			items, err := n.Replicas()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				cs.Complete = false
				return
			}
			for _, r := range items {
				// Pending, CreateBackOff and CreateContainerConfigError copies have no container.
				if r.Node != n.Name || r.Namespace != namespace || r.Workload != workload || !r.Phase.HasContainer() {
					continue
				}
				cs.Existing++
				cs.ByHash[r.SpecHash]++
				cs.ByNode[r.Node]++
				cs.Names[r.Name] = true
				copy := r.Name + " " + r.Node + " " + string(r.Phase)
				if r.Ready {
					copy += "+ready"
				}
				cs.Copies = append(cs.Copies, copy)
				if r.Phase == api.PhaseRunning && r.Ready {
					cs.Available++
					cs.ReadyByHash[r.SpecHash]++
					cs.ReadyByNode[r.Node]++
					cs.ReadyIPs[r.Node] = append(cs.ReadyIPs[r.Node], r.PodIP)
				}
			}
		}()
	}
	wg.Wait()
	sort.Strings(cs.Copies)
	return cs
}

// Sampler takes a Census at a fixed interval until Stop and keeps the
// extremes. Samples in which a node did not answer are not counted.
type Sampler struct {
	stop, done chan struct{}
	// Read these after Stop.
	Samples, MinAvailable, MaxExisting int
	// AvailableSeen counts samples by their Available figure.
	AvailableSeen map[int]int
	// Fewest and Most are the first samples with the fewest available
	// and the most existing copies.
	Fewest, Most Census
}

// Sample starts sampling namespace/workload on nodes every interval.
func Sample(nodes []*Node, namespace, workload string, interval time.Duration) *Sampler {
	s := &Sampler{stop: make(chan struct{}), done: make(chan struct{}), MinAvailable: 1 << 30, AvailableSeen: map[int]int{}}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			cs := TakeCensus(nodes, namespace, workload)
			if !cs.Complete {
				continue
			}
			s.Samples++
			if cs.Available < s.MinAvailable {
				s.MinAvailable, s.Fewest = cs.Available, cs
			}
			if cs.Existing > s.MaxExisting {
				s.MaxExisting, s.Most = cs.Existing, cs
			}
			s.AvailableSeen[cs.Available]++
		}
	}()
	return s
}

// Stop ends sampling and waits for the sampling goroutine.
func (s *Sampler) Stop() { close(s.stop); <-s.done }

// ServiceDestinations returns the set of DNAT destinations ("IP:port")
// of the node's Service rules, whichever the agent's proxy mode: the
// endpoints its rules send to.
func (n *Node) ServiceDestinations(ctx context.Context) (map[string]bool, error) {
	out, err := n.ServiceRules(ctx)
	if err != nil {
		return nil, err
	}
	dest := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "--to-destination" {
				dest[f[i+1]] = true
			}
		}
		// nftables: the elements of the endpoint maps,
		// "... : 10.22.1.5 . 8080".
		for _, m := range nftEndpoint.FindAllStringSubmatch(line, -1) {
			dest[m[1]+":"+m[2]] = true
		}
	}
	return dest, nil
}

// nftEndpoint is the endpoint of an element of the ip starling table's
// endpoint maps, as nft lists it.
var nftEndpoint = regexp.MustCompile(`: (\d+\.\d+\.\d+\.\d+) \. (\d+)\b`)

// ProxyMode is the proxy mode the agent last said it chose
// ("nftables", "iptables"; "" before it said).
func (n *Node) ProxyMode() string {
	b, _ := os.ReadFile(n.AgentLogPath())
	const key = `msg="service proxy mode chosen" mode=`
	i := bytes.LastIndex(b, []byte(key))
	if i < 0 {
		return ""
	}
	rest := b[i+len(key):]
	if j := bytes.IndexAny(rest, " \n"); j >= 0 {
		rest = rest[:j]
	}
	return string(rest)
}

// ServiceRules returns the node's Service rules as text: the nat table
// (iptables-save) in iptables mode, the ip starling table (nft list) in
// nftables mode.
func (n *Node) ServiceRules(ctx context.Context) (string, error) {
	cmd := []string{"iptables-save", "-t", "nat"}
	if n.ProxyMode() == "nftables" {
		cmd = []string{"nft", "list", "table", "ip", "starling"}
	}
	out, err := n.Exec(ctx, cmd[0], cmd[1:]...)
	if err != nil {
		return "", fmt.Errorf("%s on %s: %w", strings.Join(cmd, " "), n.Name, err)
	}
	return out, nil
}

// Poll calls f every interval, at once first, until it returns nil or
// timeout passes (wait.PollUntilContextTimeout), and returns the time
// from the start to f's success, or f's last error wrapped with the
// timeout ("after 30s: ...").
func Poll(ctx context.Context, interval, timeout time.Duration, f func() error) (time.Duration, error) {
	start := time.Now()
	var last error
	err := wait.PollUntilContextTimeout(ctx, interval, timeout, true, func(context.Context) (bool, error) {
		last = f()
		return last == nil, nil
	})
	took := time.Since(start)
	if err == nil {
		return took, nil
	}
	if last == nil {
		last = err // ctx ended before the first call
	}
	return took, fmt.Errorf("after %v: %w", timeout, last)
}
