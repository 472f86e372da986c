package reconcile

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Decision is everything one reconcile pass of a node decides from: the
// cluster as its snapshot shows it, what runs on the node, what it knows
// of its quorum, and the time. Decide is a pure function of it, driven by
// table and property tests without sockets or root, as etcd's raft is
// driven through Ready.
type Decision struct {
	// Ownership is Owned's input (placement, make-before-break
	// handoffs); its Observed are the node's containers, which every step
	// below sees.
	Ownership Ownership
	// Budget is Gate's input but for Mine and Observed, which Decide
	// fills in (the owned replicas, the containers).
	Budget Budget
	// Fencing is Fence's input but for Observed, which Decide fills in.
	Fencing Fencing
	// Stateful lists the StatefulSet workloads by WorkloadKey; their stops
	// last at most StatefulGrace (a stop begun before a partition must end
	// before the majority starts a replacement), and none when the node
	// is fenced (killed at once).
	Stateful      map[string]bool
	StatefulGrace time.Duration
	// Local is what this node knows of its containers besides containerd's
	// word: Decide marks a copy of the observed containers with it.
	Local Local
	// Backoff holds, by container ID, when an action on that container
	// may be tried again after a failure (zero or past: now). Actions on
	// such a container wait, and Requeue comes when the first may run.
	Backoff map[string]time.Time
	// ServiceEnv returns the Service variables of a namespace (docker
	// links, as the kubelet gives them), for the replicas that a create
	// or replace starts and that want them; nil: none.
	ServiceEnv func(namespace string) []EnvVar
	// Config resolves the ConfigMap and Secret references of the
	// replicas a create or replace starts (ResolveEnv); nil: none held.
	Config ConfigData
	// HostIP is this node's address, for status.hostIP.
	HostIP string
	// Claims resolves a PersistentVolumeClaim a replica mounts to its
	// volume's ID on this node, or a *ClaimWait (nil: no claim is held).
	Claims func(namespace, name string) (string, error)
	// Allocatable is this node's, for the limits a resourceFieldRef
	// names and the container does not set.
	Allocatable Allocatable
	// OncePod are the ReadWriteOncePod claims (namespace/name): one
	// replica at a time mounts each (oncepod.go).
	OncePod map[string]bool
}

// Local is what the node knows of its containers that containerd does
// not say: its pod subnet (settled; invalid while none is), the
// liveness failures of its prober and the evictions of replicas over an
// emptyDir's sizeLimit (volumes.Updater), by container ID.
type Local struct {
	Subnet    netip.Prefix
	Unhealthy map[string]string
	Evicted   map[string]string
}

// Mark returns a copy of observed with OutsideSubnet set on the containers
// whose address lies outside l.Subnet (when valid), Unhealthy on the
// running ones whose liveness failed and Evicted on those evicted;
// observed is not changed.
func (l Local) Mark(observed []Container) []Container {
	out := slices.Clone(observed)
	for i := range out {
		c := &out[i]
		if ip, err := netip.ParseAddr(c.PodIP); err == nil && l.Subnet.IsValid() && !l.Subnet.Contains(ip) {
			c.OutsideSubnet = true
		}
		if why := l.Unhealthy[c.ID]; why != "" && c.State == StateRunning {
			c.Unhealthy = why
		}
		c.Evicted = l.Evicted[c.ID]
		if len(c.Members) > 0 {
			c.Members = slices.Clone(c.Members)
			for j := range c.Members {
				if m := &c.Members[j]; m.State == StateRunning {
					m.Unhealthy = l.Unhealthy[m.ID]
				}
			}
		}
	}
	return out
}

// Output is what Decide decided.
type Output struct {
	// Mine are the replicas this node runs now: owned, held to their
	// rolling-update budget and to at most one copy. Its status record
	// lists them.
	Mine []Replica
	// Handoffs are the make-before-break handoffs to remember for the
	// next pass (Owned).
	Handoffs map[string]time.Time
	// Fenced: the node knows it has no quorum (its StatefulSet replicas
	// are killed).
	Fenced bool
	// Actions and Requeue are Plan's, with StatefulSet stops bounded,
	// Service variables filled in, and actions under a failure's backoff
	// left for later (Requeue).
	Actions []Action
	Requeue time.Duration
	// Observed are the containers as Decide saw them (Local.Mark).
	Observed []Container
	// ConfigErrors are the replicas (by ID) whose create waits for a
	// ConfigMap, Secret or key (a *ConfigError), or for the volume of a
	// PersistentVolumeClaim (a *ClaimWait).
	ConfigErrors map[string]error
}

// Decide composes one pass: Owned (what placement and handoffs give this
// node), Gate (rolling updates within maxSurge/maxUnavailable), Fence (at
// most one copy of a StatefulSet ordinal), then Plan against the
// observed containers at now; StatefulSet stops are bounded by
// StatefulGrace, and immediate when fenced. Requeue is at most 1 s while
// a handoff is under way (the new owner's readiness is watched closely).
func Decide(d Decision, now time.Time) Output {
	observed := d.Local.Mark(d.Ownership.Observed)
	d.Ownership.Observed = observed
	owned, handoffs := Owned(d.Ownership)
	r := d.Budget
	r.Mine, r.Observed = owned, observed
	gated := Gate(r)
	f := d.Fencing
	f.Observed = observed
	out := Output{Mine: Fence(gated, f), Handoffs: handoffs, Fenced: !f.Unknown && !f.Quorum, Observed: observed}
	res := Plan(out.Mine, observed, now)
	out.Requeue = res.Requeue
	var users map[string]Replica // of ReadWriteOncePod claims, made when one is met
	for _, act := range res.Actions {
		if wait := backoff(d.Backoff, act, now); wait > 0 {
			if out.Requeue == 0 || wait < out.Requeue {
				out.Requeue = wait
			}
			continue
		}
		if (act.Type == Remove || act.Type == Replace || act.Type == Stop) && d.Stateful[WorkloadKey(act.Old.Namespace, act.Old.Workload)] {
			act.Old.GracePeriod = min(act.Old.GracePeriod, d.StatefulGrace)
			if out.Fenced {
				act.Old.GracePeriod = 0
				act.Reason = "fenced: no quorum"
			}
		}
		if (act.Type == Create || act.Type == Replace || act.Type == AddContainer) && act.Replica.ID != "" {
			if !act.Replica.Spec.NoServiceLinks && d.ServiceEnv != nil {
				act.Replica.ServiceEnv = d.ServiceEnv(act.Replica.Namespace)
			}
			act.Replica.HostIP = d.HostIP
			err := withConfig(&act.Replica, d.Config, d.Claims, d.Allocatable)
			if err == nil && len(d.OncePod) > 0 && act.Type != AddContainer {
				if users == nil {
					users = claimUsers(observed, d.Ownership.All)
				}
				err = oncePodWait(act.Replica, act.Old.ID, d.OncePod, users)
			}
			if err != nil {
				if out.ConfigErrors == nil {
					out.ConfigErrors = map[string]error{}
				}
				out.ConfigErrors[act.Replica.ID] = err // a replace keeps the old copy
				continue
			}
		}
		out.Actions = append(out.Actions, act)
	}
	if len(handoffs) > 0 && (out.Requeue == 0 || out.Requeue > time.Second) {
		out.Requeue = time.Second
	}
	return out
}

// backoff is how long act must still wait after a failed action on one
// of its containers (Decision.Backoff).
func backoff(until map[string]time.Time, act Action, now time.Time) time.Duration {
	var wait time.Duration
	for _, id := range act.IDs() {
		if u, ok := until[id]; ok && u.After(now) {
			wait = max(wait, u.Sub(now))
		}
	}
	return wait
}

// noConfig holds no ConfigMap and no Secret.
type noConfig struct{}

func (noConfig) ConfigMap(string, string) (map[string]string, map[string][]byte, bool) {
	return nil, nil, false
}
func (noConfig) Secret(string, string) (map[string][]byte, bool) { return nil, false }

// withConfig fills in what r takes from ConfigMaps and Secrets (src;
// nil: none held): its env's references resolved (ResolveEnv) and the
// files of its projected volumes (ProjectVolume), the volume IDs of the
// claims it mounts (claims), and the limits a resourceFieldRef names that
// the container does not set (the node's allocatable, alloc). r's Spec is copied,
// not changed where the view holds it.
func withConfig(r *Replica, src ConfigData, claims func(namespace, name string) (string, error), alloc Allocatable) error {
	if src == nil {
		src = noConfig{}
	}
	r.Files = nil
	r.PullCreds = RegistryCreds(r.Spec.PullSecrets, r.Namespace, src)
	cloned := false
	for i, v := range r.Spec.Volumes {
		if v.Claim == "" {
			continue
		}
		name := v.ClaimName(*r)
		if claims == nil {
			return &ClaimWait{fmt.Sprintf("persistentvolumeclaim %q not found", name)}
		}
		id, err := claims(r.Namespace, name)
		if err != nil {
			return err
		}
		if !cloned {
			r.Spec.Volumes, cloned = slices.Clone(r.Spec.Volumes), true // the view's Spec is shared
		}
		r.Spec.Volumes[i].ClaimID = id
	}
	for _, v := range r.Spec.Volumes {
		if len(v.Sources) == 0 {
			continue
		}
		files, err := ProjectVolume(v, *r, src, alloc)
		if err != nil {
			return err
		}
		if r.Files == nil {
			r.Files = map[string][]File{}
		}
		r.Files[v.Name] = files
	}
	if err := resolveContainer(&r.Spec, r.Namespace, src, alloc); err != nil {
		return err
	}
	for _, list := range []*[]Spec{&r.Spec.Init, &r.Spec.Containers} {
		if len(*list) == 0 {
			continue
		}
		*list = slices.Clone(*list) // the view's Spec is shared
		for i := range *list {
			if err := resolveContainer(&(*list)[i], r.Namespace, src, alloc); err != nil {
				return err
			}
		}
	}
	return nil
}

// resolveContainer fills in the environment of container s of a replica
// in namespace: the limits a resourceFieldRef names that s does not set
// (alloc), then its ConfigMap and Secret references (ResolveEnv). s's
// slices are replaced, not changed.
func resolveContainer(s *Spec, namespace string, src ConfigData, alloc Allocatable) error {
	if i := slices.IndexFunc(s.Env, func(e EnvVar) bool { return e.Resource != "" }); i >= 0 {
		env := slices.Clone(s.Env)
		for j := range env[i:] {
			if e := &env[i+j]; e.Resource != "" {
				e.Value, e.Literal, e.Resource = alloc.value(e.Resource, e.DivisorMilli), true, ""
			}
		}
		s.Env = env
	}
	if !s.UsesConfig() {
		return nil
	}
	env, err := ResolveEnv(*s, namespace, src)
	if err != nil {
		return err
	}
	s.Env, s.EnvFrom = env, nil
	return nil
}

// UsesConfig reports whether s refers to a ConfigMap or Secret through
// env or envFrom.
func (s Spec) UsesConfig() bool {
	return len(s.EnvFrom) > 0 || slices.ContainsFunc(s.Env, func(e EnvVar) bool { return e.ConfigMap != "" || e.Secret != "" })
}
