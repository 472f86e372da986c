package volumes

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Pods writes a replica's projected volume if it is on the node
// (*runtime.Runtime.UpdateVolume: under the lock its create and remove
// take, so an update never writes a volume being torn down).
type Pods interface {
	UpdateVolume(id string, v reconcile.Volume, files []reconcile.File) (bool, error)
}

// Views gives the cluster view and a channel closed when a newer one is
// built (*view.Builder).
type Views interface {
	View() *view.View
	Changed() <-chan struct{}
}

// recheck bounds how long a replica created from a view older than a
// ConfigMap's change keeps the older files.
const recheck = 10 * time.Second

// Updater rewrites the projected volumes of this node's replicas when
// the ConfigMaps and Secrets they come from change: on the first view
// holding the change (the files change within about a second of the
// write reaching the node), and every recheck, when it also measures
// the emptyDirs on disk that have a sizeLimit (Evicted).
type Updater struct {
	// Self is this node's name (its allocatable fills in the limits a
	// downward API file names and its container does not set).
	Self string
	// PodDir holds one directory per replica (runtime.Config.PodDir).
	PodDir string
	Views  Views
	Pods   Pods
	Log    *slog.Logger
	// over holds the disk emptyDirs over their sizeLimit, by container
	// ID, as the last Sync measured them.
	over atomic.Pointer[map[string]overLimit]
}

// overLimit is an emptyDir found over its sizeLimit.
type overLimit struct {
	dir    string
	limit  int64
	reason string
}

// Evicted returns the replicas (by container ID) with an emptyDir on
// disk over its sizeLimit, with the kubelet's reason
// (reconcile.Local.Evicted): those the last Sync found, measured again
// now, so a replica replaced since (its volumes new) is not evicted
// twice.
func (u *Updater) Evicted() map[string]string {
	m := u.over.Load()
	if m == nil || len(*m) == 0 {
		return nil
	}
	out := map[string]string{}
	for id, o := range *m {
		if Usage(o.dir) > o.limit {
			out[id] = o.reason
		}
	}
	return out
}

// Run syncs until ctx ends.
func (u *Updater) Run(ctx context.Context) {
	tick := time.NewTicker(recheck)
	defer tick.Stop()
	var last *view.ConfigData
	for {
		changed := u.Views.Changed()
		if v := u.Views.View(); v != nil && v.Config != last {
			last = v.Config
			u.Sync(v)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
			if v := u.Views.View(); v != nil {
				u.Sync(v)
			}
		}
	}
}

// Sync writes, for each replica with a directory here, the files its
// projected volumes hold now (Write changes nothing when they are the
// same), and returns how many volumes changed. A volume whose object or
// key is gone keeps its files, as the kubelet keeps them.
func (u *Updater) Sync(v *view.View) int {
	entries, err := os.ReadDir(u.PodDir)
	if err != nil {
		return 0
	}
	n := 0
	alloc := reconcile.Allocatable(v.Statuses[u.Self].Capacity)
	over := map[string]overLimit{}
	defer func() { u.over.Store(&over) }()
	for _, e := range entries {
		i, found := slices.BinarySearchFunc(v.All, e.Name(), func(d view.DesiredReplica, id string) int { return strings.Compare(d.Id, id) })
		if !found {
			continue
		}
		r := v.All[i].Replica()
		for _, vol := range r.Spec.Volumes {
			if vol.EmptyDir && !vol.Memory && vol.SizeLimit > 0 {
				dir := Dir(filepath.Join(u.PodDir, e.Name()), vol.Name)
				if Usage(dir) > vol.SizeLimit {
					over[e.Name()] = overLimit{dir, vol.SizeLimit, fmt.Sprintf("Usage of EmptyDir volume %q exceeds the limit %q.",
						vol.Name, resource.NewQuantity(vol.SizeLimit, resource.BinarySI).String())}
				}
			}
			if len(vol.Sources) == 0 {
				continue
			}
			files, err := reconcile.ProjectVolume(vol, r, v.Config, alloc)
			if err != nil {
				continue
			}
			changed, err := u.Pods.UpdateVolume(e.Name(), vol, files)
			if err != nil {
				u.Log.Warn("update a volume's files", "replica", r.Name, "volume", vol.Name, "err", err)
				continue
			}
			if changed {
				n++
				u.Log.Info("updated a volume's files", "replica", r.Name, "volume", vol.Name)
			}
		}
	}
	return n
}

// Usage is the disk space the files under dir take, in bytes, as du
// counts it (allocated blocks), not following symlinks nor crossing
// into other filesystems.
func Usage(dir string) int64 {
	var root unix.Stat_t
	if unix.Lstat(dir, &root) != nil {
		return 0
	}
	var total int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if st.Dev != root.Dev {
			return filepath.SkipDir
		}
		total += st.Blocks * 512
		return nil
	})
	return total
}
