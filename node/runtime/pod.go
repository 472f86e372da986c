package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

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
)

// addContainer creates container name of rep in the sandbox of rep's own
// container own and starts it.
func (r *Runtime) addContainer(ctx context.Context, rep reconcile.Replica, own reconcile.Container, name string) (err error) {
	ctx = r.ctx(ctx)
	spec, role, ok := memberSpec(rep.Spec, name)
	if !ok {
		return fmt.Errorf("replica %s has no container %q", rep.Name, name)
	}
	if own.PodIP == "" || !r.net.Ready(own.ID) {
		return fmt.Errorf("add container %s to replica %s: its sandbox is not ready", name, rep.Name)
	}
	id := reconcile.MemberID(own.ID, name)
	img, ic, err := r.containerImage(ctx, rep, spec)
	if err != nil {
		return fmt.Errorf("add container %s to replica %s: %w", name, rep.Name, err)
	}
	c, err := r.newContainer(ctx, id, rep, spec, img, ic, own.PodIP, map[string]string{LabelMemberOf: own.ID, LabelRole: role})
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

// removeMembers removes (remove: stop, then delete) the replica's own
// container id and its members, in the kubelet's order: the app
// containers, id's among them, at once, each with its preStop and
// grace; then the sidecars, the last one first. The members' logs go
// with them.
func (r *Runtime) removeMembers(ctx context.Context, id string, remove func(containerd.Container) error) error {
	members, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q==%q", LabelMemberOf, id))
	if err != nil {
		return fmt.Errorf("list the containers of %s: %w", id, err)
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
	own, err := r.client.LoadContainer(ctx, id)
	if err == nil {
		apps = append(apps, own)
	} else if !errdefs.IsNotFound(err) {
		return err
	}
	errs := make([]error, len(apps))
	var wg sync.WaitGroup
	for i, c := range apps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = remove(c)
		}()
	}
	wg.Wait()
	// Sidecars stop in the reverse of their order, which is the order
	// they were created in (each is added once the one before runs).
	slices.SortFunc(sidecars, func(a, b containerd.Container) int { return -compareStarts(ctx, a, b) })
	for _, c := range sidecars {
		errs = append(errs, remove(c))
	}
	for _, m := range members {
		r.removeLogs(m.ID())
	}
	return errors.Join(errs...)
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
