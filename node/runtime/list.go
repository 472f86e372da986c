package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/pidns"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// List observes every Starling replica and the task state of each of
// its containers (a replica's members under its own container).
func (r *Runtime) List(ctx context.Context) ([]reconcile.Container, error) {
	ctx = r.ctx(ctx)
	cs, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q==true", LabelManaged))
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make([]reconcile.Container, 0, len(cs))
	memberOf := map[string]string{}
	for _, c := range cs {
		info, err := c.Info(ctx, containerd.WithoutRefreshedMetadata)
		if err != nil {
			if errdefs.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("container %s: %w", c.ID(), err)
		}
		if info.Labels[LabelNode] != "" && info.Labels[LabelNode] != r.cfg.Node {
			continue // another node's container in a shared containerd
		}
		oc := fromLabels(c.ID(), info.Labels)
		oc.CreatedAt = info.CreatedAt
		if own := info.Labels[LabelMemberOf]; own != "" {
			memberOf[c.ID()] = own // its sandbox is its replica's
		} else if oc.PodIP != "" && r.sandboxGone(c.ID(), info.Labels) {
			// The sandbox is gone (host reboot): Plan rebuilds it.
			oc.PodIP = ""
		}
		oc.State = reconcile.StateCreated
		task, err := c.Task(ctx, nil)
		switch {
		case errdefs.IsNotFound(err):
		case err != nil:
			oc.State = reconcile.StateUnknown
		default:
			st, err := task.Status(ctx)
			switch {
			case err != nil:
				oc.State = reconcile.StateUnknown
			case st.Status == containerd.Running:
				oc.State = reconcile.StateRunning
			case st.Status == containerd.Stopped:
				oc.State = reconcile.StateExited
				oc.ExitedAt = st.ExitTime
				oc.ExitCode = st.ExitStatus
				oc.OOMKilled = r.oomKilled(c.ID(), info.Labels, oc.StartedAt)
			case st.Status == containerd.Created:
				oc.State = reconcile.StateCreated
			default:
				oc.State = reconcile.StateUnknown
			}
		}
		out = append(out, oc)
	}
	return groupMembers(out, memberOf), nil // pod.go
}

// sandboxGone reports whether the sandbox of replica container id
// (labels) is gone: its network namespace, or the holder of its shared
// PID namespace (a host reboot, a killed holder).
func (r *Runtime) sandboxGone(id string, labels map[string]string) bool {
	if !r.net.Ready(id) {
		return true
	}
	_, held := pidns.Find(r.podDir(id))
	return labels[LabelSharePIDs] == "true" && !held
}

func fromLabels(id string, l map[string]string) reconcile.Container {
	c := reconcile.Container{
		ID: id, Name: l[LabelName], Namespace: l[LabelNamespace], Workload: l[LabelWorkload], UID: l[LabelUID],
		SpecHash: l[LabelSpecHash], PodIP: l[LabelPodIP], ContainerName: l[LabelContainer],
		Init: l[LabelRole] == "init", Sidecar: l[LabelRole] == "sidecar",
	}
	if v := l[LabelClaims]; v != "" {
		c.Claims = strings.Split(v, ",")
	}
	c.Ordinal, _ = strconv.Atoi(l[LabelOrdinal])
	c.Restarts, _ = strconv.Atoi(l[LabelRestarts])
	c.BackoffStep, _ = strconv.Atoi(l[LabelBackoffStep])
	c.StartedAt, _ = time.Parse(time.RFC3339Nano, l[LabelStartedAt])
	if g, err := strconv.Atoi(l[LabelGrace]); err == nil {
		c.GracePeriod = time.Duration(g) * time.Second
	}
	if run := l[LabelStoppedRun]; run != "" && run == l[LabelStartedAt] {
		c.StopReason = l[LabelStopReason]
	}
	if b := l[LabelLast]; b != "" {
		var t api.Termination
		if json.Unmarshal([]byte(b), &t) == nil {
			c.Last = &t
		}
	}
	return c
}

// oomKilled reports whether the OOM killer hit the run of container id
// that started at started: containerd's /tasks/oom event recorded in
// LabelOOMAt, or, for an event this agent missed (it was down), the
// container's cgroup counter (the file memory.events on cgroup v2,
// memory.oom_control on v1), readable until the task is deleted.
func (r *Runtime) oomKilled(id string, labels map[string]string, started time.Time) bool {
	if at, err := time.Parse(time.RFC3339Nano, labels[LabelOOMAt]); err == nil && !at.Before(started) {
		return true
	}
	cg := r.CgroupPath(id)
	for _, f := range []string{filepath.Join("/sys/fs/cgroup", cg, "memory.events"), filepath.Join("/sys/fs/cgroup/memory", cg, "memory.oom_control")} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok && strings.TrimSpace(v) != "0" {
				return true
			}
		}
	}
	return false
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// recordOOM stores the time of a /tasks/oom event in its container's
// labels (LabelOOMAt), so the exit that follows reads OOMKilled.
func (r *Runtime) recordOOM(ctx context.Context, e *events.Envelope) {
	v, err := typeurl.UnmarshalAny(e.Event)
	if err != nil {
		return
	}
	oom, ok := v.(*eventstypes.TaskOOM)
	if !ok {
		return
	}
	c, err := r.client.LoadContainer(r.ctx(ctx), oom.ContainerID)
	if err != nil {
		return
	}
	if _, err := c.SetLabels(r.ctx(ctx), map[string]string{LabelOOMAt: e.Timestamp.UTC().Format(time.RFC3339Nano)}); err != nil {
		r.log.Warn("record an OOM kill in labels", "container", oom.ContainerID, "err", err)
	}
}

// WatchExits calls onExit whenever a task in Starling's namespace exits,
// so a crashed replica is restarted at once instead of at the next resync.
// It returns when ctx ends; a broken event stream is re-subscribed every
// second, with one warning per outage (containerd down), not one a
// second.
func (r *Runtime) WatchExits(ctx context.Context, onExit func()) {
	broken := false
	for ctx.Err() == nil {
		events, errs := r.client.Subscribe(r.ctx(ctx), `topic=="/tasks/exit"`, `topic=="/tasks/oom"`)
	recv:
		for {
			select {
			case <-ctx.Done():
				return
			case e := <-events:
				if broken {
					r.log.Info("containerd event stream back")
					broken = false
				}
				if e != nil && e.Topic == "/tasks/oom" {
					r.recordOOM(ctx, e)
				}
				onExit()
			case err := <-errs:
				switch {
				case ctx.Err() != nil:
				case !broken:
					r.log.Warn("containerd event stream broke; resubscribing every second", "err", err)
				default:
					r.log.Debug("containerd event stream still broken", "err", err)
				}
				broken = true
				break recv
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
