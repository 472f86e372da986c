package node

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/view"
	"github.com/starling-orchestrator/starling/test/harness"
)

// returnArrival follows, at every other node, when it counts returning
// node f alive again and when it holds a record of f newer than the one
// f published before it went down (old: that record's version, as the
// stayers held it), for limit after back. A peer that still holds the
// old record when f counts again gives f back the replicas its old
// record lists as running (placement.Keep keeps the oldest running copy).
// It returns a line for the report.
func (c *simCluster) returnArrival(f *simNode, old string, back time.Time, limit time.Duration) string {
	alive, fresh := map[string]time.Duration{}, map[string]time.Duration{}
	published := time.Duration(-1)
	var peers []*simNode
	for _, o := range c.nodes {
		if o != f && !o.down {
			peers = append(peers, o)
		}
	}
	for time.Since(back) < limit && (len(alive) < len(peers) || len(fresh) < len(peers)) {
		if published < 0 {
			if rec, ok, _ := f.store.Get(view.StatusKey(f.name)); ok && rec.Version.String() != old {
				published = time.Since(back)
			}
		}
		for _, o := range peers {
			if _, ok := alive[o.name]; !ok {
				if m, known := o.agent.mem.cluster.Member(f.name); known && m.State.Up() {
					alive[o.name] = time.Since(back)
				}
			}
			if _, ok := fresh[o.name]; !ok {
				if rec, ok, _ := o.store.Get(view.StatusKey(f.name)); ok && rec.Version.String() != old {
					fresh[o.name] = time.Since(back)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	line := func(what string, at map[string]time.Duration) string {
		var ds []time.Duration
		for _, d := range at {
			ds = append(ds, d)
		}
		missing := len(peers) - len(ds)
		var slow []string
		if missing > 0 {
			for _, o := range peers {
				if _, ok := at[o.name]; !ok && len(slow) < 3 {
					slow = append(slow, o.name)
				}
			}
		}
		return fmt.Sprintf("%s at %d of %d peers: median %v, p90 %v, max %v after the return; missing at %d %v",
			what, len(ds), len(peers), percentile(ds, 50).Round(time.Millisecond), percentile(ds, 90).Round(time.Millisecond),
			percentile(ds, 100).Round(time.Millisecond), missing, slow)
	}
	// Records the peers refused, by reason (all writers).
	refused := map[string]float64{}
	for _, o := range peers {
		ms := make(chan prometheus.Metric, 64)
		go func() { o.agent.metrics.rejectedRecords.Collect(ms); close(ms) }()
		for m := range ms {
			var d dto.Metric
			if m.Write(&d) == nil && d.Counter != nil && len(d.Label) > 0 {
				refused[d.Label[0].GetValue()] += d.Counter.GetValue()
			}
		}
	}
	return strings.Join([]string{fmt.Sprintf("published its first record %v after the return", published.Round(time.Millisecond)),
		line("alive", alive), line("new record", fresh), fmt.Sprintf("records refused by its peers since they started, by reason: %v", refused)}, "; ")
}
func simDeployment(name string, replicas int) manifest.Object {
	o, err := parseOne(harness.App{Name: name, Replicas: int32(replicas), Container: "c", Image: "sim:v1"}.Deployment())
	if err != nil {
		panic(err)
	}
	return o
}
