package runtime

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
)

// Image transfers in flight, for the REASON of the replicas waiting on
// them (finding: a replica waiting 7 s for a 100 MB image from a peer
// showed ContainerCreating and nothing else).

// transfer is one image being fetched from a peer, or unpacked (peer
// empty).
type transfer struct {
	peer    string
	started time.Time
	bytes   atomic.Int64
}

// transfers maps a normalized image name to its transfer in flight.
type transfers struct{ m sync.Map }

// track records a fetch of ref from peer and returns the counter its
// blobs' bytes go into, and the function that ends the record.
func (t *transfers) track(ref, peer string) (*atomic.Int64, func()) {
	tr := &transfer{peer: peer, started: time.Now()}
	t.m.Store(ref, tr)
	return &tr.bytes, func() { t.m.CompareAndDelete(ref, tr) }
}

// unpacking records that ref is being unpacked into snapshots and
// returns the function that ends the record.
func (t *transfers) unpacking(ref string) func() {
	tr := &transfer{started: time.Now()}
	t.m.Store(ref, tr)
	return func() { t.m.CompareAndDelete(ref, tr) }
}

// describe says how the fetch of ref goes ("" when none is in flight):
// "pulling image nginx:1.22 from n2: 45 MB so far (15 MB/s)".
func (t *transfers) describe(ref string, now time.Time) string {
	v, ok := t.m.Load(NormalizeImage(ref))
	if !ok {
		return ""
	}
	tr := v.(*transfer)
	if tr.peer == "" {
		return fmt.Sprintf("unpacking image %s (%v so far)", ref, now.Sub(tr.started).Round(time.Second))
	}
	n := tr.bytes.Load()
	s := fmt.Sprintf("pulling image %s from %s: %s so far", ref, tr.peer, humanize.Bytes(uint64(n)))
	if d := now.Sub(tr.started); d >= time.Second {
		s += fmt.Sprintf(" (%s/s)", humanize.Bytes(uint64(float64(n)/d.Seconds())))
	}
	return s
}

// ImageProgress says how the fetch of image ref from a peer goes, for a
// replica waiting on it ("" when none is in flight).
func (r *Runtime) ImageProgress(ref string) string { return r.transfers.describe(ref, time.Now()) }
