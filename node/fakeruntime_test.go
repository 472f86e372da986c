package node

import (
	"context"
	"io"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/runtime"
)

// fakeRuntime is an in-memory container runtime: actions take effect at once.
type fakeRuntime struct {
	mu         sync.Mutex
	containers map[string]reconcile.Container
	created    int
	// exec answers Exec (nil: every command exits 0).
	exec func(id string, argv []string) (int, string, error)
	// subnet returns the node's pod subnet; containers get addresses in
	// it, as the real pod network gives them (peers accept no other).
	subnet func() string
	// createLag, when set, makes a create two steps, as containerd's
	// are: the container exists (Created, no task) for createLag() before
	// its task runs. listLag delays List's answer after its snapshot (an
	// RPC's latency: the list is older than its arrival).
	createLag func() time.Duration
	listLag   time.Duration
	// launches counts the task starts of each container (create and
	// Start); runningStarts lists Starts that found the task running.
	launches      map[string]int
	runningStarts []string
}

// podIP returns the address of the n-th container created: inside the
// node's subnet, or 10.22.9.9 without one.
func (f *fakeRuntime) podIP(n int) string {
	if f.subnet != nil {
		if p, err := netip.ParsePrefix(f.subnet()); err == nil {
			a := p.Addr().As4()
			a[3] = byte(2 + n%250)
			return netip.AddrFrom4(a).String()
		}
	}
	return "10.22.9.9"
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{containers: map[string]reconcile.Container{}}
}

func (f *fakeRuntime) List(context.Context) ([]reconcile.Container, error) {
	f.mu.Lock()
	out := make([]reconcile.Container, 0, len(f.containers))
	for _, c := range f.containers {
		out = append(out, c)
	}
	lag := f.listLag
	f.mu.Unlock()
	time.Sleep(lag)
	return out, nil
}

func (f *fakeRuntime) UpdateVolume(string, reconcile.Volume, []reconcile.File) (bool, error) {
	return false, nil
}

func (f *fakeRuntime) Execute(_ context.Context, a reconcile.Action) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.launches == nil {
		f.launches = map[string]int{}
	}
	run := func(r reconcile.Replica) {
		f.created++
		c := reconcile.Container{ID: r.ID, Name: r.Name, Namespace: r.Namespace, Workload: r.Workload,
			Ordinal: r.Ordinal, SpecHash: r.SpecHash, State: reconcile.StateRunning, PodIP: f.podIP(f.created), StartedAt: time.Now(), CreatedAt: time.Now()}
		if f.createLag != nil {
			c.State, c.StartedAt = reconcile.StateCreated, time.Time{}
			f.containers[r.ID] = c
			f.mu.Unlock()
			time.Sleep(f.createLag())
			f.mu.Lock()
			c.State, c.StartedAt = reconcile.StateRunning, time.Now()
		}
		f.containers[r.ID] = c
		f.launches[r.ID] = 1
	}
	switch a.Type {
	case reconcile.Create:
		run(a.Replica)
	case reconcile.Start:
		c := f.containers[a.Old.ID]
		if c.State == reconcile.StateRunning {
			f.runningStarts = append(f.runningStarts, a.Old.Name)
			return runtime.ErrTaskRunning
		}
		// As the real runtime: the count comes from what the action saw.
		c.Restarts = a.Old.Restarts + boolInt(a.Old.State == reconcile.StateExited)
		c.State, c.StartedAt, c.BackoffStep, c.StopReason = reconcile.StateRunning, time.Now(), a.BackoffStep, ""
		f.containers[a.Old.ID] = c
		f.launches[a.Old.ID]++
	case reconcile.Stop:
		c, ok := f.containers[a.Old.ID]
		if ok && c.State == reconcile.StateRunning && c.StartedAt.Equal(a.Old.StartedAt) {
			c.State, c.ExitedAt, c.ExitCode, c.StopReason = reconcile.StateExited, time.Now(), 137, a.Reason
			f.containers[a.Old.ID] = c
		}
	case reconcile.Remove:
		delete(f.containers, a.Old.ID)
	case reconcile.Replace:
		delete(f.containers, a.Old.ID)
		run(a.Replica)
	}
	return nil
}

func (f *fakeRuntime) ids() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.containers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// specHashes maps each container's ID to its spec hash (a Deployment
// replica's name holds a hash of the spec hash and the object's UID, not
// the spec hash itself).
func (f *fakeRuntime) specHashes() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for id, c := range f.containers {
		out[id] = c.SpecHash
	}
	return out
}

func (f *fakeRuntime) CleanupSandboxes(context.Context, []reconcile.Container, func(string) (func(), bool)) error {
	return nil
}
func (f *fakeRuntime) Exec(_ context.Context, id string, argv []string, _ time.Duration) (int, string, error) {
	f.mu.Lock()
	c, ok := f.containers[id]
	exec := f.exec
	f.mu.Unlock()
	if !ok || c.State != reconcile.StateRunning {
		return -1, "", runtime.ErrNotRunning
	}
	if exec == nil {
		return 0, "", nil
	}
	return exec(id, argv)
}

func (f *fakeRuntime) WatchExits(ctx context.Context, _ func()) { <-ctx.Done() }
func (f *fakeRuntime) LogPath(id string) string                 { return os.DevNull }
func (f *fakeRuntime) CgroupPath(id string) string              { return "/fake/" + id }
func (f *fakeRuntime) PreviousLogPath(id string) string         { return os.DevNull }
func (f *fakeRuntime) ImageDigest(context.Context, string) (string, error) {
	return "sha256:" + strings.Repeat("ab", 32), nil
}

func (f *fakeRuntime) ImportImages(_ context.Context, r io.Reader) ([]string, error) {
	if _, err := io.Copy(io.Discard, r); err != nil {
		return nil, err
	}
	return []string{"docker.io/library/fake:latest"}, nil
}
func (f *fakeRuntime) Images(context.Context) ([]api.Image, error) { return nil, nil }
func (f *fakeRuntime) WriteBlob(context.Context, digest.Digest, func(int64), io.Writer) error {
	return errdefs.ErrNotFound
}
func (f *fakeRuntime) HasImage(context.Context, string) bool { return false }
func (f *fakeRuntime) ImageProgress(string) string           { return "" }
func (f *fakeRuntime) Close() error                          { return nil }
