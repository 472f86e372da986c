package reconcile

import (
	"slices"
	"strconv"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
)

// PodStatus is what the containers of one replica say of it, as the
// kubelet sums a pod's containerStatuses up for kubectl.
type PodStatus struct {
	// Containers are the replica's containers, init containers first in
	// the order they ran, then its own, then the other app containers;
	// Ready and Total count its app containers and sidecars, ready and
	// all (get's READY, "2/2"); Restarts sums their restarts, or, while
	// the pod initializes, its init containers' (kubectl's RESTARTS).
	Containers   []api.ContainerStatus
	Ready, Total int
	Restarts     int
	// Init says init containers run (the app containers wait), of
	// InitTotal; Failed is why the one that runs last failed, in backoff
	// ("" if none).
	Init      bool
	InitTotal int
	Failed    string
}

// StatusOf is the status of replica container c and its members at now:
// spec is its replica's (nil when not known here: a copy being
// stopped), ready says whether a running container is ready, and why
// not.
func StatusOf(c Container, spec *Spec, ready func(Container) (bool, string), now time.Time) PodStatus {
	var st PodStatus
	initRestarts := 0
	inits, apps := []Container{}, []Container{c}
	for _, m := range c.Members {
		if m.Init || m.Sidecar {
			inits = append(inits, m)
		} else {
			apps = append(apps, m)
		}
	}
	byCreation := func(a, b Container) int { return a.CreatedAt.Compare(b.CreatedAt) }
	slices.SortStableFunc(inits, byCreation)
	slices.SortStableFunc(apps[1:], byCreation)
	st.Init = c.State == StateCreated && c.StartedAt.IsZero() && spec != nil && len(spec.Init) > 0
	if spec != nil {
		st.InitTotal, st.Total = len(spec.Init), 1+len(spec.Containers)
		for _, s := range spec.Init {
			if s.Sidecar {
				st.Total++
			}
		}
	}
	for _, m := range inits {
		cs := containerStatus(m, ready, now)
		cs.Init, cs.Sidecar = true, m.Sidecar
		if cs.State == api.ContainerWaiting && cs.Reason == string(api.PhaseCrashLoopBackOff) {
			st.Failed = "init container " + m.ContainerName + ": " + cs.Exit.Reason + " (exit " + strconv.Itoa(cs.Exit.ExitCode) + ")"
		}
		if m.Sidecar {
			st.Restarts += m.Restarts
		} else {
			initRestarts += m.Restarts
		}
		st.Containers = append(st.Containers, cs)
	}
	seen := map[string]bool{}
	for _, m := range inits {
		seen[m.ContainerName] = true
	}
	waiting := func(name string, init, sidecar bool) api.ContainerStatus {
		return api.ContainerStatus{Name: name, Init: init, Sidecar: sidecar, State: api.ContainerWaiting, Reason: "PodInitializing"}
	}
	if spec != nil {
		for _, s := range spec.Init {
			if !seen[s.Name] && st.Init {
				st.Containers = append(st.Containers, waiting(s.Name, true, s.Sidecar))
			}
		}
	}
	for _, m := range apps {
		seen[m.ContainerName] = true
		st.Containers = append(st.Containers, containerStatus(m, ready, now))
		st.Restarts += m.Restarts
	}
	if spec != nil {
		for _, s := range spec.Containers {
			if !seen[s.Name] {
				st.Containers = append(st.Containers, waiting(s.Name, false, false))
			}
		}
	}
	for _, cs := range st.Containers {
		if cs.Ready && (!cs.Init || cs.Sidecar) {
			st.Ready++
		}
	}
	st.Total = max(st.Total, st.Ready)
	if st.Init {
		// kubectl's RESTARTS: the init containers' while the pod
		// initializes, its app containers' and sidecars' after.
		st.Restarts = initRestarts
	}
	if len(st.Containers) <= 1 {
		st.Containers = nil // the replica's own fields say it all
	}
	return st
}

// containerStatus is one container's status at now.
func containerStatus(c Container, ready func(Container) (bool, string), now time.Time) api.ContainerStatus {
	cs := api.ContainerStatus{Name: c.ContainerName, Restarts: c.Restarts, LastState: c.Last.UTC()}
	if !c.StartedAt.IsZero() {
		cs.Started = c.StartedAt.UTC()
	}
	switch c.State {
	case StateRunning:
		cs.State = api.ContainerRunning
		cs.Ready, cs.Reason = ready(c)
	case StateExited:
		t := Terminated(c.ExitCode, c.OOMKilled, c.StartedAt, c.ExitedAt)
		cs.Exit = t.UTC()
		cs.State, cs.Reason = api.ContainerTerminated, t.Reason
		if !(c.Init && c.ExitCode == 0) && now.Sub(c.ExitedAt) < Backoff(c.BackoffStep) {
			cs.State, cs.Reason = api.ContainerWaiting, string(api.PhaseCrashLoopBackOff)
		}
	default:
		cs.State, cs.Reason = api.ContainerWaiting, "ContainerCreating"
	}
	if c.StopReason != "" && cs.State != api.ContainerRunning {
		cs.Reason = c.StopReason
	}
	cs.Reason = api.OneLine(cs.Reason) // a probe's output, as peers accept it
	return cs
}

// Own reports whether c is a replica's own container, not one of its
// members.
func (c Container) Own() bool { return c.ID == ContainerID(c.Namespace, c.Name) }

// Flatten lists every container of observed: each replica's own, then
// its members.
func Flatten(observed []Container) []Container {
	out := make([]Container, 0, len(observed))
	for _, c := range observed {
		out = append(out, c)
		out = append(out, c.Members...)
	}
	return out
}

// Find returns container name ("": its own) of the replica whose own
// container is id, among observed. A container without a recorded name
// (made before replicas had several) answers to any name.
func Find(observed []Container, id, name string) (Container, bool) {
	for _, c := range observed {
		switch {
		case c.ID != id:
			continue
		case name == "" || c.ContainerName == name || c.ContainerName == "" && len(c.Members) == 0:
			// (A container made before they had names is its replica's
			// only one, whatever the name asked.)
			return c, true
		}
		for _, m := range c.Members {
			if m.ContainerName == name {
				return m, true
			}
		}
		break
	}
	return Container{}, false
}

// ContainerIDs are the containerd IDs of every container of r: its own,
// then its members'.
func (r Replica) ContainerIDs() []string {
	ids := []string{r.ID}
	for _, s := range slices.Concat(r.Spec.Init, r.Spec.Containers) {
		ids = append(ids, MemberID(r.ID, s.Name))
	}
	return ids
}
