package reconcile

import (
	"slices"
	"sort"
	"time"
)

// Restart backoff, as kubelet does for CrashLoopBackOff: the first restart
// is immediate, then 10 s doubling up to 5 min; a container that ran for
// 10 min before exiting starts again from the beginning.
const (
	BackoffInitial = 10 * time.Second
	BackoffMax     = 5 * time.Minute
	BackoffReset   = 10 * time.Minute
)

// Backoff returns the wait before restart number step+1 of a crashing
// container: 0 for step 0, then BackoffInitial doubling to BackoffMax.
func Backoff(step int) time.Duration {
	if step <= 0 {
		return 0
	}
	d := BackoffInitial
	for i := 1; i < step; i++ {
		d *= 2
		if d >= BackoffMax {
			return BackoffMax
		}
	}
	return d
}

// ActionType names what an Action does.
type ActionType string

// Actions the runtime executes.
const (
	// Create sets up the replica's sandbox (network namespace, address),
	// creates its container and starts it.
	Create ActionType = "create"
	// Start starts a container that exists but has no running task: a
	// first start after an interrupted create, or a restart after an exit.
	Start ActionType = "start"
	// Remove stops (SIGTERM, SIGKILL after the grace period) and deletes a
	// container and its sandbox.
	Remove ActionType = "remove"
	// Replace removes Old and then creates Replica: the spec changed, or
	// the old container's sandbox was never finished.
	Replace ActionType = "replace"
	// AddContainer creates container Member of Replica in the sandbox of
	// its replica's container Old and starts it: an init container whose
	// turn came, or an app container after the first.
	AddContainer ActionType = "add-container"
	// Stop ends Old's running task (SIGTERM, SIGKILL after the grace
	// period) and keeps the container and its sandbox, so Plan restarts it
	// like a crashed one, through the crash backoff (kubelet's restart of
	// a container that failed its liveness or startup probe). Reason is
	// recorded with the container. The runtime does nothing when Old has
	// restarted since it was observed (another StartedAt).
	Stop ActionType = "stop"
)

// Action is one step for the runtime.
type Action struct {
	Type ActionType
	// Replica is the desired replica (Create, Start, Replace).
	Replica Replica
	// Old is the container to stop (Remove, Replace) or start (Start).
	Old Container
	// BackoffStep is the value to record on a Start (the new consecutive
	// crash count).
	BackoffStep int
	// Reason says why, for logs and events.
	Reason string
	// Member is the container an AddContainer adds, or the name of
	// Old's container when Old is one of a replica's Members (Start,
	// Stop).
	Member string
}

// IDs returns the container IDs the action touches.
func (a Action) IDs() []string {
	switch a.Type {
	case Create:
		return []string{a.Replica.ID}
	case AddContainer:
		return []string{MemberID(a.Old.ID, a.Member)}
	case Remove, Start, Stop:
		return []string{a.Old.ID}
	default:
		if a.Old.ID == a.Replica.ID {
			return []string{a.Old.ID}
		}
		return []string{a.Old.ID, a.Replica.ID}
	}
}

// Result is what Plan decided.
type Result struct {
	Actions []Action
	// Requeue, when non-zero, is the longest the caller may wait before
	// planning again (a restart is waiting out its backoff).
	Requeue time.Duration
}

// Plan compares the desired replicas of this node with the containers the
// runtime holds and returns the actions that make them equal. It is
// level-triggered and idempotent: given the same inputs it returns the same
// actions, and once they are done it returns none.
//
// Rules:
//   - a desired replica with no container is created;
//   - a container whose ID is not desired is removed, except that when a
//     desired replica of the same workload object (UID) and ordinal has no
//     container yet, the two are paired into one Replace (stop old, then
//     start new); a replica of an object applied again after a delete
//     starts at once, beside its predecessor's stopping container;
//   - a container whose sandbox setup never finished (no PodIP), whose
//     address is outside the node's pod subnet (OutsideSubnet), that is
//     evicted (Evicted: an emptyDir over its sizeLimit), or whose
//     spec hash differs from its desired replica's (stable StatefulSet
//     names), is replaced by a fresh one with the same ID;
//   - the init containers run first, one at a time in order, as the
//     kubelet runs them (planPod); then the app containers start;
//   - a container that never started is started;
//   - an exited container is restarted once Backoff(BackoffStep) has
//     passed since it exited (the step resets after BackoffReset of
//     running); Requeue tells when the next restart is due; an init
//     container that exited 0 has completed and is not;
//   - a running container marked Unhealthy (its liveness or startup probe
//     failed) is stopped, and so restarted by the rule above;
//   - any other running container, or one in an unknown state, is left
//     alone.
//
// Actions come sorted by container ID so callers and tests see a stable
// order.
func Plan(desired []Replica, observed []Container, now time.Time) Result {
	var res Result
	byID := make(map[string]Container, len(observed))
	for _, c := range observed {
		byID[c.ID] = c
	}
	wanted := make(map[string]bool, len(desired))
	for _, r := range desired {
		wanted[r.ID] = true
	}
	// Containers that are not desired, indexed by workload slot so a spec
	// change becomes one Replace instead of an unrelated remove and create.
	type slot struct {
		ns, workload, uid string
		ordinal           int
	}
	unwanted := map[slot][]Container{}
	var orphans []Container
	for _, c := range observed {
		if wanted[c.ID] {
			continue
		}
		s := slot{c.Namespace, c.Workload, c.UID, c.Ordinal}
		unwanted[s] = append(unwanted[s], c)
	}

	for _, r := range desired {
		c, ok := byID[r.ID]
		if !ok {
			s := slot{r.Namespace, r.Workload, r.UID, r.Ordinal}
			if olds := unwanted[s]; len(olds) > 0 {
				res.Actions = append(res.Actions, Action{Type: Replace, Replica: r, Old: olds[0], Reason: "spec changed from " + olds[0].SpecHash + " to " + r.SpecHash})
				unwanted[s] = olds[1:]
				continue
			}
			res.Actions = append(res.Actions, Action{Type: Create, Replica: r, Reason: "desired replica has no container"})
			continue
		}
		if c.PodIP == "" {
			res.Actions = append(res.Actions, Action{Type: Replace, Replica: r, Old: c, Reason: "sandbox setup did not finish"})
			continue
		}
		if c.OutsideSubnet {
			res.Actions = append(res.Actions, Action{Type: Replace, Replica: r, Old: c, Reason: "sandbox address " + c.PodIP + " is outside the node's pod subnet, which moved"})
			continue
		}
		if c.Evicted != "" {
			res.Actions = append(res.Actions, Action{Type: Replace, Replica: r, Old: c, Reason: "Evicted: " + c.Evicted})
			continue
		}
		if c.SpecHash != r.SpecHash {
			// A stable name (StatefulSet): the new spec takes the same ID.
			res.Actions = append(res.Actions, Action{Type: Replace, Replica: r, Old: c, Reason: "spec changed from " + c.SpecHash + " to " + r.SpecHash})
			continue
		}
		planPod(r, c, now, &res)
	}
	for _, olds := range unwanted {
		orphans = append(orphans, olds...)
	}
	for _, c := range orphans {
		res.Actions = append(res.Actions, Action{Type: Remove, Old: c, Reason: "container is not desired"})
	}
	sort.SliceStable(res.Actions, func(i, j int) bool { return res.Actions[i].IDs()[0] < res.Actions[j].IDs()[0] })
	return res
}

// planPod plans the containers of replica r, whose container c holds a
// finished sandbox of r's spec. Until c has first started, the init
// containers come first, in order: the first that is not done (an init
// container that exited 0, a sidecar that runs) is added, started or
// restarted and the rest wait, app containers included. Once c has
// started, the pod is initialized: its init containers are not run
// again, its sidecars are kept running beside the app containers, and
// every container restarts on its own.
func planPod(r Replica, c Container, now time.Time, res *Result) {
	if c.State == StateUnknown {
		return // whether it started is not known: nothing is decided on it
	}
	members := make(map[string]Container, len(c.Members))
	names := map[string]bool{}
	for _, s := range slices.Concat(r.Spec.Init, r.Spec.Containers) {
		names[s.Name] = true
	}
	for _, m := range c.Members {
		// A member of another spec or sandbox (added by an action that
		// raced a replace), or of no container of the spec, goes.
		if !names[m.ContainerName] || m.SpecHash != c.SpecHash || m.PodIP != c.PodIP || m.CreatedAt.Before(c.CreatedAt) {
			res.Actions = append(res.Actions, Action{Type: Remove, Old: m, Member: m.ContainerName, Reason: "container " + m.ContainerName + " is not of this copy of the replica"})
			continue
		}
		members[m.ContainerName] = m
	}
	initialized := !c.StartedAt.IsZero() || c.State == StateRunning || c.State == StateExited
	for _, s := range r.Spec.Init {
		if initialized && !s.Sidecar {
			continue
		}
		m, ok := members[s.Name]
		if !planMember(r, c, s, m, ok, now, res) && !initialized {
			return
		}
	}
	planContainer(r, c, "", false, now, res)
	for _, s := range r.Spec.Containers {
		m, ok := members[s.Name]
		planMember(r, c, s, m, ok, now, res)
	}
}

// planMember plans container s of replica r (observed as m when ok; c
// is r's container) and reports whether it is done for the containers
// after it to start: it runs (or, an init container that is not a
// sidecar, exited 0).
func planMember(r Replica, c Container, s Spec, m Container, ok bool, now time.Time, res *Result) bool {
	if !ok {
		res.Actions = append(res.Actions, Action{Type: AddContainer, Replica: r, Old: c, Member: s.Name, Reason: "container " + s.Name + " has not run yet"})
		return false
	}
	return planContainer(r, m, s.Name, isInit(r, s.Name) && !s.Sidecar, now, res)
}

// isInit reports whether name is one of r's init containers.
func isInit(r Replica, name string) bool {
	return slices.ContainsFunc(r.Spec.Init, func(s Spec) bool { return s.Name == name })
}

// planContainer plans container c of replica r (its own, member "", or
// its member of that name): start it, restart it after its backoff, or
// stop it when its probe failed. A runToCompletion container (an init
// container) that exited 0 is done; for the others, done is running.
func planContainer(r Replica, c Container, member string, runToCompletion bool, now time.Time, res *Result) (done bool) {
	what := "container"
	if member != "" {
		what = "container " + member
	}
	switch c.State {
	case StateCreated:
		res.Actions = append(res.Actions, Action{Type: Start, Replica: r, Old: c, Member: member, BackoffStep: c.BackoffStep, Reason: what + " was never started"})
	case StateExited:
		if runToCompletion && c.ExitCode == 0 {
			return true
		}
		step := c.BackoffStep
		if !c.StartedAt.IsZero() && c.ExitedAt.Sub(c.StartedAt) >= BackoffReset {
			step = 0
		}
		due := c.ExitedAt.Add(Backoff(step))
		if wait := due.Sub(now); wait > 0 {
			if res.Requeue == 0 || wait < res.Requeue {
				res.Requeue = wait
			}
			return false
		}
		res.Actions = append(res.Actions, Action{Type: Start, Replica: r, Old: c, Member: member, BackoffStep: step + 1, Reason: what + " exited"})
	case StateRunning:
		if c.Unhealthy != "" {
			res.Actions = append(res.Actions, Action{Type: Stop, Replica: r, Old: c, Member: member, Reason: c.Unhealthy})
			return false
		}
		return !runToCompletion
	}
	return false
}

// DrainDelay is how long act waits before stopping a running container:
// delay (--drain-delay) for a remove or replace of a running container
// with a grace period, so every node takes it out of its Service rules
// first; none for a fenced StatefulSet replica (killed at once), a
// liveness stop, or a container that is not running.
func (act Action) DrainDelay(delay time.Duration) time.Duration {
	if (act.Type != Remove && act.Type != Replace) || act.Old.State != StateRunning || act.Old.GracePeriod == 0 {
		return 0
	}
	return delay
}
