package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// census is one sample of a Deployment's copies, each node counting only
// the containers it runs itself (its own observation, not what gossip told
// it about the others).
type census struct {
	ready       int                 // copies Running and ready
	existing    int                 // copies with a container or being created (Terminating included)
	readyByNode map[string]int      // ready copies by node
	byNode      map[string]int      // existing copies by node
	byHash      map[string]int      // existing copies by spec hash
	readyByHash map[string]int      // ready copies by spec hash
	readyIPs    map[string][]string // pod IPs of ready copies by node
}

// takeCensus asks every node in nodes, over its API socket and in
// parallel, for the copies of workload (namespace default) it runs. It
// fails when a node does not answer: its copies would go uncounted.
func takeCensus(nodes []*harness.Node, workload string) (census, error) {
	cs := census{readyByNode: map[string]int{}, byNode: map[string]int{}, byHash: map[string]int{},
		readyByHash: map[string]int{}, readyIPs: map[string][]string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var l api.ReplicaList
			err := n.APIGet("/v1/replicas", &l)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("census of %s on %s: %w", workload, n.Name, err))
				return
			}
			for _, r := range l.Items {
				if r.Node == n.Name && r.Namespace == "default" && r.Workload == workload {
					cs.add(r)
				}
			}
		}()
	}
	wg.Wait()
	return cs, errors.Join(errs...)
}

// add counts one copy a node reported about itself. Pending and
// CreateBackOff copies have no container and are not counted.
func (cs *census) add(r api.Replica) {
	if r.Phase == "Pending" || r.Phase == "CreateBackOff" {
		return
	}
	cs.existing++
	cs.byNode[r.Node]++
	cs.byHash[r.SpecHash]++
	if r.Phase == "Running" && r.Ready {
		cs.ready++
		cs.readyByNode[r.Node]++
		cs.readyByHash[r.SpecHash]++
		cs.readyIPs[r.Node] = append(cs.readyIPs[r.Node], r.PodIP)
	}
}

// natRules returns `iptables-save -t nat` of node n, run in its network
// namespace.
func natRules(ctx context.Context, n *harness.Node) (string, error) {
	out, err := n.Exec(ctx, "iptables-save", "-t", "nat")
	if err != nil {
		return "", fmt.Errorf("nat rules of %s: %w", n.Name, err)
	}
	return out, nil
}

// endpointsInRules reports, for every node, which of the endpoints
// (IP:port) its nat rules send traffic to (DNAT targets).
func endpointsInRules(ctx context.Context, nodes []*harness.Node, endpoints []string) (map[string][]string, error) {
	found := map[string][]string{}
	for _, n := range nodes {
		rules, err := natRules(ctx, n)
		if err != nil {
			return nil, err
		}
		for _, ep := range endpoints {
			if strings.Contains(rules, "--to-destination "+ep+"\n") || strings.Contains(rules, "--to-destination "+ep+" ") {
				found[n.Name] = append(found[n.Name], ep)
			}
		}
	}
	return found, nil
}

// pollInterval is how often the figures are sampled; a figure is the time
// at which the first sample meeting its condition finished, so it
// overstates by at most one interval plus one sample's duration.
const pollInterval = 50 * time.Millisecond

// waitUntil calls check every pollInterval until it returns true, and
// returns the time from start to the end of that check. It gives up when
// ctx ends or timeout (counted from start) passes, with check's last
// error or reason.
func waitUntil(ctx context.Context, start time.Time, timeout time.Duration, what string, check func() (bool, error)) (time.Duration, error) {
	var last error
	for {
		ok, err := check()
		took := time.Since(start)
		if ok {
			return took, nil
		}
		if err != nil {
			last = err
		}
		if took > timeout {
			return took, fmt.Errorf("%s: not reached within %v (last: %v)", what, timeout, last)
		}
		select {
		case <-ctx.Done():
			return took, fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}
