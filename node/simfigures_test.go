package node

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/testnet"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
)

// cpuTime is the process's CPU time so far (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// up returns the nodes not crashed.
func (c *simCluster) up() []*simNode {
	var out []*simNode
	for _, n := range c.nodes {
		if !n.down {
			out = append(out, n)
		}
	}
	return out
}

// bytes is what the transports of all nodes have sent so far.
func (c *simCluster) bytes() (total, packets int64) {
	s := c.sent()
	return s.Total(), s.Packets
}

// sent is what the transports of all nodes have sent so far, those of
// restarted nodes' earlier lives included.
func (c *simCluster) sent() testnet.Counters {
	var s testnet.Counters
	for _, n := range c.nodes {
		cn := n.tr.Counters()
		s.PacketBytes += cn.PacketBytes + n.prior.PacketBytes
		s.Packets += cn.Packets + n.prior.Packets
		s.StreamBytes += cn.StreamBytes + n.prior.StreamBytes
		s.Streams += cn.Streams + n.prior.Streams
	}
	return s
}

// streamKinds is, by memberlist message type, the streams the nodes'
// current transports dialled and their bytes both ways.
func (c *simCluster) streamKinds() map[*testnet.MemTransport][2]map[byte]int64 {
	out := map[*testnet.MemTransport][2]map[byte]int64{}
	for _, n := range c.nodes {
		count, bytes := n.tr.StreamKinds()
		out[n.tr] = [2]map[byte]int64{count, bytes}
	}
	return out
}

// userMessageStream is memberlist's userMsg type, a stream's first byte.
const userMessageStream = 8

// kindBytesSince is the bytes both ways of the streams of kind dialled
// since before (a streamKinds).
func (c *simCluster) kindBytesSince(before map[*testnet.MemTransport][2]map[byte]int64, kind byte) (n int64) {
	for tr, now := range c.streamKinds() {
		n += now[1][kind] - before[tr][1][kind]
	}
	return n
}

// streamKindsSince describes the streams dialled since before (a
// streamKinds), by kind: "push/pull 12 (1.2 MB), user 40 (0.3 MB)".
func (c *simCluster) streamKindsSince(before map[*testnet.MemTransport][2]map[byte]int64) string {
	count, bytes := map[byte]int64{}, map[byte]int64{}
	for tr, now := range c.streamKinds() {
		for k, v := range now[0] {
			count[k] += v - before[tr][0][k]
			bytes[k] += now[1][k] - before[tr][1][k]
		}
	}
	names := map[byte]string{0: "tcp ping", 6: "push/pull", 8: "user message"}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(count)) {
		if count[k] == 0 {
			continue
		}
		name := cmp.Or(names[k], fmt.Sprintf("type %d", k))
		parts = append(parts, fmt.Sprintf("%s %d (%.2f MB)", name, count[k], float64(bytes[k])/1e6))
	}
	return strings.Join(parts, ", ")
}

// statusWrites is how many times the nodes published their own records.
func (c *simCluster) statusWrites() (n float64) {
	for _, o := range c.nodes {
		n += o.priorWrites + testutil.ToFloat64(o.agent.metrics.statusWrites)
	}
	return n
}

// writesBy is how many times each node published its own record.
func (c *simCluster) writesBy() map[string]float64 {
	out := map[string]float64{}
	for _, o := range c.nodes {
		out[o.name] = o.priorWrites + testutil.ToFloat64(o.agent.metrics.statusWrites)
	}
	return out
}

// questions is the sum of every node's quorum questions.
func (c *simCluster) questions() int64 {
	var n int64
	for _, nd := range c.nodes {
		n += nd.agent.work.fence.questions.Load()
	}
	return n
}

// placements is the sum of every up node's placement computations.
func (c *simCluster) placements() float64 {
	sum := 0.0
	for _, n := range c.up() {
		sum += testutil.ToFloat64(n.agent.metrics.placements)
	}
	return sum
}

// wait polls cond every step (virtual) until it holds or limit passes,
// and returns how long it took.
func wait(limit, step time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			return time.Since(start), false
		}
		time.Sleep(step)
	}
	return time.Since(start), true
}

// singleOwners reports whether, over the up nodes' runtimes, every
// replica of the simulation's Deployments runs exactly once and want of
// them run.
func (c *simCluster) singleOwners(want int) bool {
	seen := map[string]int{}
	for _, n := range c.up() {
		n.rt.mu.Lock()
		for id, ct := range n.rt.containers {
			if ct.State == reconcile.StateRunning && strings.HasPrefix(ct.Workload, "sim-") {
				seen[id]++
			}
		}
		n.rt.mu.Unlock()
	}
	if len(seen) != want {
		return false
	}
	for _, k := range seen {
		if k != 1 {
			return false
		}
	}
	return true
}

// percentile is the p-th percentile (0..100) of ds, sorted in place.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := (len(ds)*p + 99) / 100
	return ds[min(max(i-1, 0), len(ds)-1)]
}

// figures are traffic and CPU over a window.
type figures struct {
	bytesPerNode, packetsPerNode, cpuPerNode float64
	// packetBytesPerNode is the part of bytesPerNode sent in packets
	// (steady); the rest went on streams (push/pulls every few minutes
	// a node: a minute's worth varies by a few MB at 300 nodes).
	packetBytesPerNode float64
	// userStreamBytesPerNode is what went on streams of user messages
	// (digests, sync requests, large records), both ways: steady, unlike
	// push/pulls.
	userStreamBytesPerNode float64
	// questionsPerNode are the quorum questions a node asks a second
	// (each answered: twice the packets).
	questionsPerNode float64
	// packetKinds are the packets of the whole window by kind
	// (packetKindsSince), and window its length.
	packetKinds map[int]testnet.Kind
	window      time.Duration
	up          float64 // nodes up over the window
}

// byKind is f's packets by kind, per node per second, largest first:
// "ping 1200 B/s (14.0 messages), ...": what idle traffic is made of.
func (f figures) byKind() string {
	secs := f.window.Seconds() * f.up
	var parts []string
	for _, k := range slices.SortedFunc(maps.Keys(f.packetKinds), func(a, b int) int {
		return cmp.Compare(f.packetKinds[b].Bytes, f.packetKinds[a].Bytes)
	}) {
		v := f.packetKinds[k]
		if v.Bytes == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.0f B/s (%.1f messages)", cmp.Or(packetKindNames[k], fmt.Sprintf("kind %d", k)), float64(v.Bytes)/secs, float64(v.Messages)/secs))
	}
	return strings.Join(parts, ", ")
}

// settle waits at least 30 s and until, for 10 s, no node has written
// its record (its replicas started and ready) and no node has sent a
// have message (the announcements of records written before, which at
// 1,000 nodes were still spreading at 1,192 B/s a node once no record
// had been written for 10 s), at most 10 minutes. It says how long it
// waited and whether the cluster settled. No node may restart meanwhile
// (a new transport counts from zero).
func (c *simCluster) settle() string {
	haves := func() int64 { return c.packetKindsSince(nil)[kindHave].Messages }
	start, w, h := time.Now(), c.statusWrites(), haves()
	for i := range 60 {
		time.Sleep(10 * time.Second)
		nw, nh := c.statusWrites(), haves()
		if nw == w && nh == h && i >= 2 {
			return fmt.Sprintf("settled after %v", time.Since(start).Round(time.Second))
		}
		w, h = nw, nh
	}
	return fmt.Sprintf("not settled after %v: node records or have messages still sent", time.Since(start).Round(time.Second))
}

// measure sleeps window (virtual) and returns the per node, per second
// traffic and CPU over it.
func (c *simCluster) measure(window time.Duration) figures {
	b0, p0 := c.bytes()
	s0 := c.sent()
	k0 := c.streamKinds()
	q0 := c.questions()
	pk0 := c.packetKinds()
	cpu0 := cpuTime()
	time.Sleep(window)
	b1, p1 := c.bytes()
	s1 := c.sent()
	q1 := c.questions()
	cpu := cpuTime() - cpu0
	up := float64(len(c.up()))
	secs := window.Seconds()
	return figures{bytesPerNode: float64(b1-b0) / up / secs, packetsPerNode: float64(p1-p0) / up / secs,
		cpuPerNode: cpu.Seconds() / up / secs, questionsPerNode: float64(q1-q0) / up / secs,
		packetBytesPerNode:     float64(s1.PacketBytes-s0.PacketBytes) / up / secs,
		userStreamBytesPerNode: float64(c.kindBytesSince(k0, userMessageStream)) / up / secs,
		packetKinds:            c.packetKindsSince(pk0), window: window, up: up}
}

// packetKinds is, by transport, what the packets each of the nodes'
// current transports sent carried, by kind (testnet's countPacket).
func (c *simCluster) packetKinds() map[*testnet.MemTransport]map[int]testnet.Kind {
	out := map[*testnet.MemTransport]map[int]testnet.Kind{}
	for _, n := range c.nodes {
		out[n.tr] = n.tr.PacketKinds()
	}
	return out
}

// packetKindsSince sums, by kind, the packets sent since before (a
// packetKinds; a transport new since then counts from zero).
func (c *simCluster) packetKindsSince(before map[*testnet.MemTransport]map[int]testnet.Kind) map[int]testnet.Kind {
	out := map[int]testnet.Kind{}
	for tr, now := range c.packetKinds() {
		for k, v := range now {
			o, b := out[k], before[tr][k]
			out[k] = testnet.Kind{Bytes: o.Bytes + v.Bytes - b.Bytes, Messages: o.Messages + v.Messages - b.Messages}
		}
	}
	return out
}

// kindHave is the packetKinds kind of the gossip layer's have messages.
const kindHave = 256 + 7

// packetKindNames names packetKinds' kinds: memberlist's message types,
// then (256 + n) the gossip layer's user messages.
var packetKindNames = map[int]string{0: "ping", 1: "indirect ping", 2: "ack", 3: "suspect", 4: "alive", 5: "dead", 7: "compound headers",
	11: "nack", 12: "crc", 256 + 1: "delta", 256 + 2: "records", 256 + 3: "digest", 256 + 4: "request", 256 + 5: "pull", 256 + 6: "leave",
	kindHave: "have", 256 + 8: "quorum question", 256 + 9: "quorum answer", 256 + 10: "records (compressed)", 256 + 11: "push"}

// packetsOverIdle describes the packets of a minute (since, from
// packetKindsSince) by kind, above a minute at idle's rate, largest
// first: "alive +12.30 MB, +140000 messages of 88 B (idle minute 1.20
// MB), ...".
func packetsOverIdle(since map[int]testnet.Kind, idle figures) string {
	scale := time.Minute.Seconds() / idle.window.Seconds()
	type kind struct {
		name           string
		over, was, per float64
		msgs           float64
	}
	var ks []kind
	for k, v := range since {
		was, wasMsgs := float64(idle.packetKinds[k].Bytes)*scale, float64(idle.packetKinds[k].Messages)*scale
		var per float64
		if v.Messages > 0 {
			per = float64(v.Bytes) / float64(v.Messages)
		}
		ks = append(ks, kind{cmp.Or(packetKindNames[k], fmt.Sprintf("kind %d", k)), float64(v.Bytes) - was, was, per, float64(v.Messages) - wasMsgs})
	}
	slices.SortFunc(ks, func(a, b kind) int { return cmp.Compare(b.over, a.over) })
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%s %+.2f MB, %+.0f messages of %.0f B (idle minute %.2f MB)", k.name, k.over/1e6, k.msgs, k.per, k.was/1e6))
	}
	return strings.Join(parts, ", ")
}

// realNow is the machine's monotonic clock, outside the bubble's.
func realNow() time.Duration {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

func realSince(t0 time.Duration) time.Duration { return realNow() - t0 }

// heldStatus is the node status st holds for name.
func heldStatus(st Store, cluster netip.Prefix, name string) (view.NodeStatus, bool) {
	rec, ok, err := st.Get(view.StatusKey(name))
	if err != nil || !ok {
		return view.NodeStatus{}, false
	}
	s, ok := view.DecodeStatuses([]crdt.Record{rec}, cluster)[name]
	return s, ok
}
