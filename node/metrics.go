package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

// metrics are the agent's Prometheus metrics, in their own registry.
type metrics struct {
	reg              *prometheus.Registry
	reconcileSeconds prometheus.Histogram
	replicas         *prometheus.GaugeVec
	restarts         prometheus.Counter
	actionErrors     *prometheus.CounterVec
	probeSeconds     *prometheus.HistogramVec
	probeFailures    *prometheus.CounterVec
	rejectedRecords  *prometheus.CounterVec
	rejectedMembers  *prometheus.CounterVec
	uncertified      prometheus.Gauge
	placements       prometheus.Counter
	statusWrites     prometheus.Counter
	viewBuilds       prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		reconcileSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "starling_reconcile_duration_seconds", Help: "Time of one reconcile pass (observe, plan, dispatch).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "starling_replicas", Help: "Replicas on this node by phase."}, []string{"phase"}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "starling_replica_restarts_total", Help: "Containers restarted after they exited."}),
		actionErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "starling_reconcile_action_errors_total", Help: "Reconcile actions that failed, by action."}, []string{"action"}),
		probeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "starling_probe_duration_seconds", Help: "Time of one container probe, by probe kind and handler.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"probe", "handler"}),
		probeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "starling_probe_failures_total", Help: "Container probes that failed, by probe kind and handler."}, []string{"probe", "handler"}),
		rejectedRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "starling_rejected_records_total", Help: "Records received from peers and refused (not stored, not forwarded), by reason."}, []string{"reason"}),
		rejectedMembers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "starling_rejected_members_total", Help: "Alive messages for a member refused because the key its name is bound to did not sign them (membership, routes and endpoints unchanged), by reason: unsigned, signature, earlier-run."}, []string{"reason"}),
		uncertified: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "starling_uncertified_members", Help: "Members gossip holds up whose name no certified status record binds: a node whose first record has not arrived (for a moment), a --dry-run agent, or a name a holder of the gossip key made up. They count for no StatefulSet quorum and are not listed by get nodes."}),
		placements: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "starling_placement_computations_total", Help: "Placements computed: once per change of their inputs (live eligible nodes, workloads, exclusions), by the view's builder only."}),
		statusWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "starling_node_status_writes_total", Help: "Publications of this node's own record (its status and its replicas' statuses); a burst of replica changes is published at most every 250 ms."}),
		viewBuilds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "starling_view_builds_total", Help: "Snapshots of the cluster built by the view: one per burst of store or membership changes (at most one per 200 ms under a stream of them) and one per API write."}),
	}
	m.reg.MustRegister(m.reconcileSeconds, m.replicas, m.restarts, m.actionErrors, m.probeSeconds, m.probeFailures, m.rejectedRecords, m.rejectedMembers, m.uncertified, m.placements, m.statusWrites, m.viewBuilds,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observe(cs []reconcile.Container) {
	counts := map[reconcile.State]int{reconcile.StateRunning: 0, reconcile.StateExited: 0, reconcile.StateCreated: 0, reconcile.StateUnknown: 0}
	for _, c := range cs {
		counts[c.State]++
	}
	for s, n := range counts {
		m.replicas.WithLabelValues(string(s)).Set(float64(n))
	}
}
