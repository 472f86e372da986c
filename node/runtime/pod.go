package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

// A replica of several containers, as the kubelet runs a pod: the
// replica's own container (its ID, its sandbox, its labels) is the first
// app container; every other container of the pod (init containers,
// sidecars, the other app containers) is a member: a containerd
// container of its own (reconcile.MemberID), labelled with the replica's
// ID (LabelMemberOf), its name (LabelContainer) and its role (LabelRole),
// in the replica's network namespace with the replica's volumes. Each
// has its own task, log, cgroup, restarts and backoff; reconcile.Plan
// decides when each starts.

// Labels of a replica's members.
const (
	// LabelContainer is the pod template's name of the container (on a
	// replica's own container too).
	LabelContainer = "starling.io/container"
	// LabelMemberOf is the ID of the replica's own container.
	LabelMemberOf = "starling.io/member-of"
	// LabelRole is "init", "sidecar" (an init container with
	// restartPolicy Always) or "" (an app container).
	LabelRole = "starling.io/role"
	// LabelClaims are the claims a replica mounts ("ns/name,..."), so a
	// ReadWriteOncePod claim's user is known while it stops, its replica
	// gone from the view.
	LabelClaims = "starling.io/claims"
	// LabelSharePIDs marks a replica whose containers share a PID
	// namespace (node/pidns): without its holder, its sandbox is broken.
	LabelSharePIDs = "starling.io/share-pids"
)

// addContainer creates container name of rep in the sandbox of rep's own
// container own and starts it, if own is still the copy that was
// observed (not removed, nor replaced under its ID, since).
func (r *Runtime) addContainer(ctx context.Context, rep reconcile.Replica, own reconcile.Container, name string) (err error) {
	ctx = r.ctx(ctx)
	spec, role, ok := memberSpec(rep.Spec, name)
	if !ok {
		return fmt.Errorf("replica %s has no container %q", rep.Name, name)
	}
	if own.PodIP == "" || !r.net.Ready(own.ID) {
		return fmt.Errorf("add container %s to replica %s: its sandbox is not ready", name, rep.Name)
	}
	c, err := r.client.LoadContainer(ctx, own.ID)
	if err != nil {
		return fmt.Errorf("add container %s to replica %s: %w", name, rep.Name, err)
	}
	if labels, err := c.Labels(ctx); err != nil || labels[LabelPodIP] != own.PodIP || labels[LabelSpecHash] != own.SpecHash {
		return fmt.Errorf("add container %s to replica %s: the replica changed since it was observed", name, rep.Name)
	}
	id := reconcile.MemberID(own.ID, name)
	img, ic, err := r.containerImage(ctx, rep, spec)
	if err != nil {
		return fmt.Errorf("add container %s to replica %s: %w", name, rep.Name, err)
	}
	c, err = r.newContainer(ctx, id, rep, spec, img, ic, own.PodIP, map[string]string{LabelMemberOf: own.ID, LabelRole: role})
	if err != nil {
		return fmt.Errorf("add container %s to replica %s: %w", name, rep.Name, err)
	}
	if err := r.startTask(ctx, c, 0, 0); err != nil {
		if derr := c.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup); derr != nil {
			r.log.Warn("container cleanup after a failed start", "container", id, "err", derr)
		}
		return fmt.Errorf("add container %s to replica %s: %w", name, rep.Name, err)
	}
	return nil
}

// memberOwner is the ID of the replica container that member container
// id (of container name) belongs to (reconcile.MemberID; an ID cut for
// length gives itself, and locks alone).
func memberOwner(id, name string) string {
	if own, ok := strings.CutSuffix(id, "."+name); ok {
		return own
	}
	return id
}

// podLocks are locks by replica container ID, each made when first
// taken and dropped when its last holder lets it go.
type podLocks struct {
	mu    sync.Mutex
	locks map[string]*podLock
}

type podLock struct {
	sync.Mutex
	holders int
}

// lock takes the lock of id and returns what lets it go.
func (p *podLocks) lock(id string) (unlock func()) {
	p.mu.Lock()
	if p.locks == nil {
		p.locks = map[string]*podLock{}
	}
	l := p.locks[id]
	if l == nil {
		l = &podLock{}
		p.locks[id] = l
	}
	l.holders++
	p.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		p.mu.Lock()
		if l.holders--; l.holders == 0 {
			delete(p.locks, id)
		}
		p.mu.Unlock()
	}
}

// memberSpec finds container name among s's init containers and its app
// containers after the first, with its role (LabelRole).
func memberSpec(s reconcile.Spec, name string) (reconcile.Spec, string, bool) {
	for _, c := range s.Init {
		if c.Name == name {
			if c.Sidecar {
				return c, "sidecar", true
			}
			return c, "init", true
		}
	}
	for _, c := range s.Containers {
		if c.Name == name {
			return c, "", true
		}
	}
	return reconcile.Spec{}, "", false
}

// removePod stops and deletes the replica's own container id and its
// members, as the kubelet stops a pod, within one grace period in all:
// the app containers, id's among them, at once, each with its preStop;
// then the sidecars, the last one first, in what is left of the grace
// period (SIGKILL when none is). The members are deleted, and their
// logs, before id's container, so a removal cut short is done again by
// the next pass (id's container still there).
func (r *Runtime) removePod(ctx context.Context, id string, grace time.Duration) error {
	members, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q==%q", LabelMemberOf, id))
	if err != nil {
		return fmt.Errorf("list the containers of %s: %w", id, err)
	}
	own, err := r.client.LoadContainer(ctx, id)
	if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	var apps, sidecars []containerd.Container
	for _, m := range members {
		labels, err := m.Labels(ctx)
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		if labels[LabelRole] == "sidecar" {
			sidecars = append(sidecars, m)
		} else {
			apps = append(apps, m)
		}
	}
	if own != nil {
		apps = append(apps, own)
	}
	deadline := time.Now().Add(grace)
	errs := make([]error, len(apps))
	var wg sync.WaitGroup
	for i, c := range apps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.stopContainer(ctx, c, grace)
		}()
	}
	wg.Wait()
	// Sidecars stop in the reverse of their order, which is the order
	// they were created in (each is added once the one before runs).
	slices.SortFunc(sidecars, func(a, b containerd.Container) int { return -compareStarts(ctx, a, b) })
	for _, c := range sidecars {
		errs = append(errs, r.stopContainer(ctx, c, max(time.Until(deadline), 0)))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, m := range members {
		if err := r.deleteContainer(ctx, m, 0); err != nil {
			return err
		}
		r.removeLogs(m.ID())
	}
	if own != nil {
		return r.deleteContainer(ctx, own, 0)
	}
	return nil
}

// stopContainer ends c's task: its preStop hook, its stop signal, SIGKILL
// after grace (at once for 0).
func (r *Runtime) stopContainer(ctx context.Context, c containerd.Container, grace time.Duration) error {
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load the task of %s: %w", c.ID(), err)
	}
	if err := stopTask(ctx, c, task, r.preStop(ctx, c, task, grace)); err != nil {
		return fmt.Errorf("stop %s: %w", c.ID(), err)
	}
	return nil
}

// compareStarts orders containers a and b by their creation.
func compareStarts(ctx context.Context, a, b containerd.Container) int {
	ia, errA := a.Info(ctx, containerd.WithoutRefreshedMetadata)
	ib, errB := b.Info(ctx, containerd.WithoutRefreshedMetadata)
	if errA != nil || errB != nil {
		return 0
	}
	return ia.CreatedAt.Compare(ib.CreatedAt)
}

// groupMembers moves each observed member under the replica container
// it belongs to (reconcile.Container.Members); a member whose replica
// container is gone stays on its own, for Plan to remove.
func groupMembers(all []reconcile.Container, memberOf map[string]string) []reconcile.Container {
	index := map[string]int{}
	var out []reconcile.Container
	for _, c := range all {
		if memberOf[c.ID] == "" {
			index[c.ID] = len(out)
			out = append(out, c)
		}
	}
	for _, c := range all {
		own := memberOf[c.ID]
		if own == "" {
			continue
		}
		if i, ok := index[own]; ok {
			out[i].Members = append(out[i].Members, c)
			continue
		}
		out = append(out, c)
	}
	return out
}
