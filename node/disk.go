package node

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// diskCheckInterval is how often the agent checks the free space of its
// store's filesystem (one statfs), so that a full disk shows in get nodes
// and /metrics, and writes resume, without waiting for a write.
const diskCheckInterval = time.Second

// diskLoop checks the store's free space every diskCheckInterval and
// republishes this node's status when the store becomes full or has room
// again (NodeStatus.DiskFull, shown by get nodes).
func (a *Agent) diskLoop(ctx context.Context) {
	t := time.NewTicker(diskCheckInterval)
	defer t.Stop()
	for {
		full := a.store.Space().Full
		if a.own.status.diskFull.Swap(full) != full {
			if full {
				a.log.Error("data directory full: replicas keep running, API writes are refused, peers' records are buffered in memory", "dataDir", a.cfg.DataDir)
			} else {
				a.log.Info("data directory has room again: API writes accepted", "dataDir", a.cfg.DataDir)
			}
			local, _ := a.own.status.replicas()
			a.own.status.forget()
			a.own.status.publishStatus(local)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// storeMetrics are the gauges of the store's filesystem, read at scrape
// time.
func storeMetrics(s Store) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "starling_store_full",
			Help: "1 while the data directory's filesystem is full (below 64 MiB free): API writes are refused and peers' records are buffered in memory."},
			func() float64 {
				if s.Space().Full {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "starling_store_free_bytes",
			Help: "Free space of the data directory's filesystem (statfs f_bavail, bytes)."},
			func() float64 { return float64(s.Space().Free) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "starling_store_buffered_records",
			Help: "Records buffered in memory because the data directory's filesystem is full; written to disk once it has room."},
			func() float64 { return float64(s.Space().Buffered) }),
	}
}
