package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/rollout"
)

type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cols ...string) { fmt.Fprintln(t.tw, strings.Join(cols, "\t")) }
func (t *table) flush() error       { return t.tw.Flush() }

// replicaJSON is the documented `get replicas -o json` item shape.
type replicaJSON struct {
	Name      string    `json:"name"`
	Namespace string    `json:"namespace"`
	Workload  string    `json:"workload"`
	Ordinal   int       `json:"ordinal"`
	Node      string    `json:"node"`
	Phase     api.Phase `json:"phase"`
	Ready     bool      `json:"ready"`
	PodIP     string    `json:"podIP"`
	SpecHash  string    `json:"specHash"`
	Restarts  int       `json:"restarts"`
	Reason    string    `json:"reason,omitempty"`
	// State and LastState in Kubernetes' ContainerStatus shape.
	State     corev1.ContainerState  `json:"state"`
	LastState *corev1.ContainerState `json:"lastState,omitempty"`
	// CreationTimestamp is when the replica's container was created.
	CreationTimestamp metav1.Time `json:"creationTimestamp,omitempty"`
}

// containerState is r's state as Kubernetes' ContainerStatus.state says
// it: running (since Started), terminated (its Exit) or waiting (the
// phase as reason, and Reason).
func containerState(r api.Replica) corev1.ContainerState {
	switch {
	case r.Exit != nil && r.Phase != api.PhaseCrashLoopBackOff:
		return corev1.ContainerState{Terminated: terminated(r.Exit)}
	case r.Phase == api.PhaseRunning:
		return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(r.Started)}}
	default:
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: string(r.Phase), Message: r.Reason}}
	}
}

func terminated(t *api.Termination) *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{ExitCode: int32(t.ExitCode), Signal: int32(t.Signal), Reason: t.Reason,
		StartedAt: metav1.NewTime(t.StartedAt), FinishedAt: metav1.NewTime(t.FinishedAt)}
}

// lastState is kubectl's Last State: the previous run's termination, or
// the current run's when it is waiting to restart.
func lastState(r api.Replica) *api.Termination {
	if r.Phase == api.PhaseCrashLoopBackOff && r.Exit != nil {
		return r.Exit
	}
	return r.LastState
}

// replicaStatus is the STATUS column, as kubectl's: CrashLoopBackOff
// while a restart waits, the reason an exited run ended (Completed,
// Error, OOMKilled), else the phase.
func replicaStatus(r api.Replica) string {
	switch {
	case r.Phase == api.PhaseExited && r.Exit != nil:
		return r.Exit.Reason
	case r.Phase == api.PhaseInit || r.Phase == api.PhaseCrashLoopBackOff && slices.ContainsFunc(r.Containers, waitingInit):
		// kubectl's Init:N/M, Init:CrashLoopBackOff.
		done, all := 0, 0
		for _, c := range r.Containers {
			if c.Init {
				all++
				if c.Sidecar && c.State == api.ContainerRunning || c.State == api.ContainerTerminated && c.Exit != nil && c.Exit.ExitCode == 0 {
					done++
				}
			}
		}
		if r.Phase == api.PhaseCrashLoopBackOff {
			return "Init:CrashLoopBackOff"
		}
		return fmt.Sprintf("Init:%d/%d", done, max(all, 1))
	}
	return string(r.Phase)
}

// waitingInit reports whether c is an init container waiting for its
// restart.
func waitingInit(c api.ContainerStatus) bool {
	return c.Init && c.State == api.ContainerWaiting && c.Reason == string(api.PhaseCrashLoopBackOff)
}

// readyColumn is the READY column: the ready containers of r (its app
// containers and sidecars) over all of them, "1/1" for one.
func readyColumn(r api.Replica) string {
	if len(r.Containers) == 0 {
		if r.Ready {
			return "1/1"
		}
		return "0/1"
	}
	ready, all := 0, 0
	for _, c := range r.Containers {
		if !c.Init || c.Sidecar {
			all++
			if c.Ready {
				ready++
			}
		}
	}
	return fmt.Sprintf("%d/%d", ready, all)
}

// restarts is the RESTARTS column: the count, and how long ago the last
// run ended ("3 (42s ago)"), as kubectl shows it.
func restarts(r api.Replica, now time.Time) string {
	s := strconv.Itoa(r.Restarts)
	if t := lastState(r); t != nil && r.Restarts > 0 && !t.FinishedAt.IsZero() {
		s += " (" + duration.HumanDuration(now.Sub(t.FinishedAt)) + " ago)"
	}
	return s
}

type getOpts struct {
	output        string
	allNamespaces bool
	reveal        bool // a Secret's values
}

func (o getOpts) wants(ns, filter string) bool { return o.allNamespaces || ns == filter }

func newGetCmd(g *globals) *cobra.Command {
	var o getOpts
	cmd := &cobra.Command{
		Use:   "get (nodes|deployments|statefulsets|services|ingresses|configmaps|secrets|pvc|replicas) [NAME] [-o wide|json|yaml]",
		Short: "List nodes, Deployments, StatefulSets, Services, Ingresses, ConfigMaps, Secrets, PersistentVolumeClaims or replicas",
		Long: `List one kind of resource for the whole cluster, as the node you talk to sees it:
  nodes         cluster members and their state (alive, suspect, dead, left)
  deployments   Deployments with ready/up-to-date/available counts
  statefulsets  StatefulSets with ready counts
  services      Services
  ingresses     Ingresses: their hosts and the nodes' addresses that serve them (ing)
  configmaps    ConfigMaps and how many keys each holds
  secrets       Secrets, their type and how many keys each holds (values only with
                --reveal and a NAME: 'get secret db -o yaml --reveal')
  pvc           PersistentVolumeClaims: the node that holds each one's data, its size
                and what it holds (persistentvolumeclaims)
  replicas      every replica of every Deployment and StatefulSet, on any node
NAME filters by name (for replicas: a replica or its Deployment's name).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return fmt.Errorf("give a resource type (nodes, deployments, statefulsets, services, ingresses, configmaps, secrets, pvc or replicas) and an optional NAME")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			switch o.output {
			case "", "wide", "json", "yaml":
			default:
				return fmt.Errorf("-o %q: use wide, json or yaml", o.output)
			}
			c, ctx, cancel, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			name := ""
			if len(args) == 2 {
				name = args[1]
			}
			resource := strings.ToLower(args[0])
			if k, err := manifest.KindOf(resource); err == nil {
				resource = strings.ToLower(k)
			}
			switch resource {
			case "nodes", "node", "no":
				var l api.NodeList
				if l.Items, err = c.Nodes(ctx); err != nil {
					return err
				}
				if name != "" {
					var only []api.Node
					for _, n := range l.Items {
						if n.Name == name {
							only = append(only, n)
						}
					}
					if len(only) == 0 {
						return fmt.Errorf("node %q not found", name)
					}
					l.Items = only
				}
				return printNodes(g.stdout, o, l.Items)
			case "replicas", "replica", "pods", "pod", "po":
				var l api.ReplicaList
				if l.Items, err = c.Replicas(ctx); err != nil {
					return err
				}
				var items []api.Replica
				for _, r := range l.Items {
					if o.wants(r.Namespace, g.namespace) && (name == "" || r.Name == name || r.Workload == name) {
						items = append(items, r)
					}
				}
				if name != "" && len(items) == 0 {
					return fmt.Errorf("no replica, Deployment or StatefulSet named %q in namespace %q", name, g.namespace)
				}
				return printReplicas(g.stdout, o, items)
			case "configmap", "secret":
				k, _ := manifest.KindOf(resource)
				return getConfigData(g, cmd, c, o, k, name, o.reveal)
			case "persistentvolumeclaim":
				return getClaims(g, cmd, c, o, name)
			case "ingress":
				return getIngresses(g, cmd, c, o, name)
			case "deployment", "service", "statefulset":
				kind := resource
				var l api.ObjectList
				if l.Items, err = c.List(ctx, kind); err != nil {
					return err
				}
				var objs []manifest.Object
				for _, it := range l.Items {
					obj, err := manifest.Decode(it.Object)
					if err != nil {
						// One bad object never hides the others.
						fmt.Fprintf(cmd.ErrOrStderr(), "warning: skipped a stored %s that does not decode (written by node %s, version %s): %s\n",
							kind, it.Origin, it.Version, strings.Join(strings.Fields(err.Error()), " "))
						continue
					}
					if obj.Service != nil {
						obj.Service.Status = serviceStatus(it.Object)
					}
					if o.wants(obj.Namespace, g.namespace) && (name == "" || obj.Name == name) {
						objs = append(objs, obj)
					}
				}
				if name != "" && len(objs) == 0 {
					return fmt.Errorf("%s %q not found in namespace %q", kind, name, g.namespace)
				}
				var reps api.ReplicaList
				if kind != "service" {
					if reps.Items, err = c.Replicas(ctx); err != nil {
						return err
					}
				}
				if name != "" && (o.output == "json" || o.output == "yaml") {
					// One named object prints as itself, not as a List,
					// a Deployment with its status.
					var v any
					switch kind {
					case "deployment":
						v = deploymentsOf(objs, reps.Items)[0]
					case "service":
						v = objs[0].Service
					case "statefulset":
						v = objs[0].StatefulSet
					}
					_, err := structured(g.stdout, o.output, v)
					return err
				}
				if kind == "service" {
					return printServices(g.stdout, o, objs)
				}
				if kind == "statefulset" {
					return printStatefulSets(g.stdout, o, objs, reps.Items)
				}
				return printDeployments(g.stdout, o, objs, reps.Items)
			}
			return fmt.Errorf("unknown resource %q: use nodes, deployments, statefulsets, services, ingresses, configmaps, secrets, pvc or replicas", args[0])
		},
	}
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: wide, json or yaml")
	cmd.Flags().StringVarP(&g.namespace, "namespace", "n", "default", "namespace to list")
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "list every namespace")
	cmd.Flags().BoolVar(&o.reveal, "reveal", false, "get secret NAME: show the Secret's values (otherwise only their sizes)")
	return cmd
}

// structured prints v as JSON or YAML when the output asks for it.
func structured(w io.Writer, output string, v any) (bool, error) {
	switch output {
	case "json":
		return true, printJSON(w, v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = w.Write(b)
		return true, err
	}
	return false, nil
}

func printNodes(w io.Writer, o getOpts, nodes []api.Node) error {
	if ok, err := structured(w, o.output, api.NodeList{Items: nodes}); ok {
		return err
	}
	header := []string{"NAME", "STATE", "ADDRESS", "POD-SUBNET", "REPLICAS", "AGE"}
	if o.output == "wide" {
		header = append(header, "API", "RTT")
	}
	t := newTable(w, header...)
	for _, n := range nodes {
		state := n.State
		if n.Insecure {
			// Gossip in the clear (agent --insecure): say so wherever
			// nodes are listed.
			state += ",insecure"
		}
		if n.Unresponsive {
			// It does not run what placement gives it: left out of
			// placement for a while.
			state += ",unresponsive"
		}
		if n.DiskFull {
			// Its data directory is full: it refuses writes.
			state += ",disk-full"
		}
		row := []string{n.Name, state, n.Address, orNone(n.PodSubnet), strconv.Itoa(n.Replicas), age(nodeAge(n))}
		if o.output == "wide" {
			row = append(row, orNone(n.API), orNone(n.RTT))
		}
		t.row(row...)
	}
	return t.flush()
}

func printReplicas(w io.Writer, o getOpts, items []api.Replica) error {
	out := struct {
		Items []replicaJSON `json:"items"`
	}{Items: []replicaJSON{}}
	for _, r := range items {
		j := replicaJSON{r.Name, r.Namespace, r.Workload, r.Ordinal, r.Node, r.Phase, r.Ready, r.PodIP, r.SpecHash, r.Restarts, r.Reason, containerState(r), nil, metav1.NewTime(replicaCreated(r))}
		if t := lastState(r); t != nil {
			j.LastState = &corev1.ContainerState{Terminated: terminated(t)}
		}
		out.Items = append(out.Items, j)
	}
	if ok, err := structured(w, o.output, out); ok {
		return err
	}
	t := newTable(w, o.cells("NAMESPACE", []string{"NAME", "READY", "STATUS", "RESTARTS", "AGE"}, "IP", "NODE", "SPEC-HASH", "REASON")...)
	for _, r := range items {
		ready := readyColumn(r)
		ip := r.PodIP
		if ip == "" {
			ip = "<none>"
		}
		// The whole reason, last: a cut one hid the hint that says what
		// to do.
		t.row(o.cells(r.Namespace, []string{r.Name, ready, replicaStatus(r), restarts(r, time.Now()), age(replicaCreated(r))},
			ip, orNone(r.Node), r.SpecHash, printable(r.Reason))...)
	}
	return t.flush()
}

// deploymentStatus is d's status as Kubernetes defines it
// (rollout.DeploymentStatus: counts over every copy of its replicas, with
// the conditions Available and Progressing), as get and describe show it.
func deploymentStatus(d *appsv1.Deployment, reps []api.Replica) appsv1.DeploymentStatus {
	return rollout.DeploymentStatus(d, manifest.SpecHash(d), reps, time.Now())
}

func printDeployments(w io.Writer, o getOpts, objs []manifest.Object, reps []api.Replica) error {
	list := map[string]any{"apiVersion": "v1", "kind": "List", "items": deploymentsOf(objs, reps)}
	if ok, err := structured(w, o.output, list); ok {
		return err
	}
	t := newTable(w, o.cells("NAMESPACE", []string{"NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"}, "IMAGE", "SPEC-HASH")...)
	for _, obj := range objs {
		d := obj.Deployment
		st := deploymentStatus(d, reps)
		t.row(o.cells(d.Namespace, []string{d.Name, fmt.Sprintf("%d/%d", st.ReadyReplicas, obj.Replicas()), strconv.Itoa(int(st.UpdatedReplicas)), strconv.Itoa(int(st.AvailableReplicas)), age(d.CreationTimestamp.Time)}, d.Spec.Template.Spec.Containers[0].Image, manifest.SpecHash(d))...)
	}
	return t.flush()
}

// printStatefulSets lists StatefulSets as kubectl does: NAME, READY
// (ready replicas of the current spec / desired), AGE.
func printStatefulSets(w io.Writer, o getOpts, objs []manifest.Object, reps []api.Replica) error {
	items := []*appsv1.StatefulSet{}
	for _, obj := range objs {
		items = append(items, obj.StatefulSet)
	}
	if ok, err := structured(w, o.output, map[string]any{"apiVersion": "v1", "kind": "List", "items": items}); ok {
		return err
	}
	t := newTable(w, o.cells("NAMESPACE", []string{"NAME", "READY", "AGE"}, "IMAGE", "SPEC-HASH")...)
	for _, obj := range objs {
		st := obj.StatefulSet
		hash := manifest.TemplateHash(&st.Spec.Template)
		desired, ready := obj.Replicas(), 0
		for _, r := range reps {
			if r.Namespace == st.Namespace && r.Workload == st.Name && r.Ordinal < desired && r.SpecHash == hash && r.Phase == api.PhaseRunning && r.Ready {
				ready++
			}
		}
		t.row(o.cells(st.Namespace, []string{st.Name, fmt.Sprintf("%d/%d", ready, desired), age(st.CreationTimestamp.Time)}, st.Spec.Template.Spec.Containers[0].Image, hash)...)
	}
	return t.flush()
}

// deploymentsOf returns the Deployments of objs with their status (copies:
// objs are not changed).
func deploymentsOf(objs []manifest.Object, reps []api.Replica) []*appsv1.Deployment {
	out := []*appsv1.Deployment{}
	for _, o := range objs {
		d := o.Deployment.DeepCopy()
		d.Status = deploymentStatus(o.Deployment, reps)
		out = append(out, d)
	}
	return out
}

func servicePorts(s *corev1.Service) string {
	var ports []string
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 {
			ports = append(ports, fmt.Sprintf("%d:%d/%s", p.Port, p.NodePort, p.Protocol))
		} else {
			ports = append(ports, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
		}
	}
	return strings.Join(ports, ",")
}

func printServices(w io.Writer, o getOpts, objs []manifest.Object) error {
	items := []*corev1.Service{}
	for _, obj := range objs {
		items = append(items, obj.Service)
	}
	if ok, err := structured(w, o.output, map[string]any{"apiVersion": "v1", "kind": "List", "items": items}); ok {
		return err
	}
	t := newTable(w, o.cells("NAMESPACE", []string{"NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"}, "SELECTOR")...)
	for _, s := range items {
		ip := s.Spec.ClusterIP
		if ip == "" {
			ip = "<pending>"
		}
		t.row(o.cells(s.Namespace, []string{s.Name, string(s.Spec.Type), ip, externalIP(s), servicePorts(s), age(s.CreationTimestamp.Time)},
			labels.Set(s.Spec.Selector).String())...)
	}
	return t.flush()
}

// externalIP is a Service's EXTERNAL-IP as kubectl shows it: a
// LoadBalancer's addresses, "<pending>" while it has none, "<none>" for
// the other types.
func externalIP(s *corev1.Service) string {
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return "<none>"
	}
	var ips []string
	for _, in := range s.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil {
			ips = append(ips, a.String())
		}
	}
	if len(ips) == 0 {
		return "<pending>"
	}
	return strings.Join(ips, ",")
}

// serviceStatus is the status the API server gave a Service (its
// LoadBalancer address), which decoding it as a manifest drops.
func serviceStatus(raw []byte) corev1.ServiceStatus {
	var s struct {
		Status corev1.ServiceStatus `json:"status"`
	}
	if json.Unmarshal(raw, &s) != nil {
		return corev1.ServiceStatus{}
	}
	return s.Status
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// nodeAge is when n first joined (its AGE, as kubectl's is the Node
// object's), or its current run's start from a node that does not say.
func nodeAge(n api.Node) time.Time {
	if n.Joined.IsZero() {
		return n.Started
	}
	return n.Joined
}

// replicaCreated is when r's container was created, kubectl's AGE of a
// pod (its current run's start from a node that does not say).
func replicaCreated(r api.Replica) time.Time {
	if r.Created.IsZero() {
		return r.Started
	}
	return r.Created
}

// cells is a row of a table (or its header): namespace first with
// --all-namespaces, wide last with -o wide, as kubectl lays them out.
func (o getOpts) cells(namespace string, row []string, wide ...string) []string {
	if o.allNamespaces {
		row = append([]string{namespace}, row...)
	}
	if o.output == "wide" {
		row = append(row, wide...)
	}
	return row
}
