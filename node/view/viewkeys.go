package view

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/placement"
	"k8s.io/apimachinery/pkg/labels"
)

// The keys by which the view tells whether a rebuild's inputs changed
// (snapshot.go): equal keys, equal inputs.

// recordsKey identifies a set of records by keys, versions, origins and
// a hash of their values.
func recordsKey(recs []crdt.Record) string {
	var b strings.Builder
	for _, r := range recs {
		h := fnv.New64a()
		h.Write(r.Value)
		fmt.Fprintf(&b, "%s@%d.%d.%s.%t.%x;", r.Key, r.Version.Wall, r.Version.Logical, r.Origin, r.Deleted, h.Sum64())
	}
	return b.String()
}

// nodesKey identifies placement's node input.
func nodesKey(nodes []placement.Node) string {
	// Appended, not formatted: it runs on every rebuild, over every node.
	var b []byte
	for _, n := range nodes {
		b = append(b, n.Name...)
		b = append(b, '/')
		b = strconv.AppendInt(b, n.Allocatable.MilliCPU, 10)
		b = append(b, '/')
		b = strconv.AppendInt(b, n.Allocatable.MemoryBytes, 10)
		b = append(b, '/')
		b = append(b, labels.Set(n.Labels).String()...) // sorted by key
		b = append(b, ';')
	}
	return string(b)
}

func setKey(s map[string]bool) string {
	keys := make([]string, 0, len(s))
	for k, in := range s {
		if in {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

// workloadsKey identifies placement's workload input (workloadsOf) and
// the replicas' IDs it maps (DesiredReplicas): keys, replica counts,
// requests, node selectors, spec hashes and UIDs.
func workloadsKey(objs []manifest.Object) string {
	var b strings.Builder
	for _, w := range workloadsOf(objs) {
		fmt.Fprintf(&b, "%s/%d/%d/%d/", w.Key, w.Replicas, w.Requests.MilliCPU, w.Requests.MemoryBytes)
		b.WriteString(labels.Set(w.NodeSelector).String())
		b.WriteByte(';')
	}
	for _, o := range objs {
		if o.IsWorkload() {
			b.WriteString(specHashOf(o))
			if o.Deployment != nil {
				b.WriteString(string(o.Deployment.UID))
			}
			b.WriteByte(';')
		}
	}
	return b.String()
}
