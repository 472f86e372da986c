package main

import (
	"context"
	"fmt"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// takeCensus is harness.TakeCensus of a workload in namespace default,
// failing when a node did not answer (its copies would go uncounted).
func takeCensus(nodes []*harness.Node, workload string) (harness.Census, error) {
	cs := harness.TakeCensus(nodes, "default", workload)
	if !cs.Complete {
		return cs, fmt.Errorf("census of %s: a node did not answer", workload)
	}
	return cs, nil
}

// endpointsInRules reports, for every node, which of the endpoints
// (IP:port) its Service rules send traffic to (DNAT targets), in either
// proxy mode.
func endpointsInRules(ctx context.Context, nodes []*harness.Node, endpoints []string) (map[string][]string, error) {
	found := map[string][]string{}
	for _, n := range nodes {
		dest, err := n.ServiceDestinations(ctx)
		if err != nil {
			return nil, err
		}
		for _, ep := range endpoints {
			if dest[ep] {
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
	_, err := harness.Poll(ctx, pollInterval, timeout-time.Since(start), func() error {
		ok, err := check()
		if err != nil {
			last = err
		}
		if !ok {
			return fmt.Errorf("%s: not reached within %v (last: %v)", what, timeout, last)
		}
		return nil
	})
	return time.Since(start), err
}
