package cli

import (
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
)

func newDescribeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "describe (deployment|statefulset|service|ingress|configmap|secret|pvc) NAME",
		Short: "Show a Deployment, StatefulSet, Service, Ingress, ConfigMap, Secret or PersistentVolumeClaim in detail (a workload with its replicas, an Ingress with its backends' endpoints, a Secret with its values' sizes only, a claim with its node)",
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, name, err := splitRef(args)
			if err != nil {
				return err
			}
			c, ctx, cancel, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			obj, err := c.Get(ctx, kind, g.namespace, name)
			if err != nil {
				return err
			}
			if k, _ := manifest.KindOf(kind); k == manifest.KindPersistentVolumeClaim {
				users, err := claimUsers(ctx, c, g.namespace, name)
				if err != nil {
					return err
				}
				return describeClaim(g.stdout, obj, users)
			}
			if k, _ := manifest.KindOf(kind); k == manifest.KindIngress {
				return describeIngress(g.stdout, cmd, obj)
			}
			if k, _ := manifest.KindOf(kind); k == manifest.KindConfigMap || k == manifest.KindSecret {
				ci, err := decodeConfigItem(k, obj)
				if err != nil {
					return err
				}
				return describeConfigData(g.stdout, ci)
			}
			o, err := manifest.Decode(obj.Object)
			if err != nil {
				return err
			}
			reps, err := c.Replicas(ctx)
			if err != nil {
				return err
			}
			return describe(g.stdout, o, obj, reps)
		},
	}
	cmd.Flags().StringVarP(&g.namespace, "namespace", "n", "default", "namespace")
	return cmd
}

// labelString is m as kubectl describe prints labels ("a=b,c=d", sorted;
// "<none>" when empty).
func labelString(m map[string]string) string {
	if len(m) == 0 {
		return "<none>"
	}
	return labels.Set(m).String()
}

func describe(w io.Writer, o manifest.Object, meta api.Object, reps []api.Replica) error {
	p := func(k, v string) { fmt.Fprintf(w, "%-22s %s\n", k+":", v) }
	p("Name", o.Name)
	p("Namespace", o.Namespace)
	p("Kind", o.Kind)
	p("Version", meta.Version)
	written := meta.Origin
	if meta.Signer != "" {
		written += " (signed, key " + meta.Signer + ")"
	}
	p("Written by", written)
	if d := o.Deployment; d != nil {
		p("Created", d.CreationTimestamp.String())
		p("Labels", labelString(d.Labels))
		p("Selector", labelString(d.Spec.Selector.MatchLabels))
		st := deploymentStatus(d, reps)
		p("Replicas", fmt.Sprintf("%d desired | %d updated | %d total | %d available | %d unavailable", o.Replicas(), st.UpdatedReplicas, st.Replicas, st.AvailableReplicas, st.UnavailableReplicas))
		for _, c := range st.Conditions {
			p("Condition "+string(c.Type), fmt.Sprintf("%s (%s) %s", c.Status, c.Reason, c.Message))
		}
		p("Strategy", string(d.Spec.Strategy.Type))
		if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil && ru.MaxSurge != nil {
			p("RollingUpdate", fmt.Sprintf("maxUnavailable %s, maxSurge %s", ru.MaxUnavailable.String(), ru.MaxSurge.String()))
		}
		p("Spec hash", manifest.SpecHash(d))
		return describeReplicas(w, p, o, reps)
	}
	if st := o.StatefulSet; st != nil {
		p("Created", st.CreationTimestamp.String())
		p("Labels", labelString(st.Labels))
		p("Selector", labelString(st.Spec.Selector.MatchLabels))
		p("Replicas", fmt.Sprintf("%d desired", o.Replicas()))
		p("Pod management", string(st.Spec.PodManagementPolicy))
		p("Spec hash", manifest.TemplateHash(&st.Spec.Template))
		return describeReplicas(w, p, o, reps)
	}
	s := o.Service
	p("Created", s.CreationTimestamp.String())
	p("Type", string(s.Spec.Type))
	p("Selector", labelString(s.Spec.Selector))
	ip := s.Spec.ClusterIP
	if ip == "" {
		ip = "<pending>"
	}
	p("ClusterIP", ip)
	if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
		st := serviceStatus(meta.Object)
		lb := externalIP(&corev1.Service{Spec: s.Spec, Status: st})
		for _, c := range st.Conditions {
			if c.Type == api.LoadBalancerCondition && c.Status == "False" {
				lb += " (" + c.Message + ")"
			}
		}
		p("LoadBalancer", lb)
	}
	for _, port := range s.Spec.Ports {
		desc := fmt.Sprintf("%d/%s -> %s", port.Port, port.Protocol, port.TargetPort.String())
		if port.Name != "" {
			desc = port.Name + " " + desc
		}
		if port.NodePort != 0 {
			desc += fmt.Sprintf(", nodePort %d", port.NodePort)
		}
		p("Port", desc)
	}
	return nil
}

// describeReplicas prints a workload's container and its replicas.
func describeReplicas(w io.Writer, p func(k, v string), o manifest.Object, reps []api.Replica) error {
	c := o.PodTemplate().Spec.Containers[0]
	fmt.Fprintf(w, "Container %s:\n", c.Name)
	p("  Image", c.Image)
	if len(c.Command) > 0 {
		p("  Command", strings.Join(c.Command, " "))
	}
	if len(c.Args) > 0 {
		p("  Args", strings.Join(c.Args, " "))
	}
	for _, port := range c.Ports {
		p("  Port", fmt.Sprintf("%d/%s %s", port.ContainerPort, port.Protocol, port.Name))
	}
	for _, e := range c.Env {
		p("  Env", e.Name+"="+e.Value)
	}
	if len(c.Resources.Limits) > 0 || len(c.Resources.Requests) > 0 {
		p("  Limits", fmt.Sprintf("cpu %s, memory %s", c.Resources.Limits.Cpu(), c.Resources.Limits.Memory()))
		p("  Requests", fmt.Sprintf("cpu %s, memory %s", c.Resources.Requests.Cpu(), c.Resources.Requests.Memory()))
	}
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
	}{{"  Startup", c.StartupProbe}, {"  Liveness", c.LivenessProbe}, {"  Readiness", c.ReadinessProbe}} {
		if pr.probe != nil {
			p(pr.name, probeString(pr.probe))
		}
	}
	fmt.Fprintln(w, "Replicas:")
	var mine []api.Replica
	for _, r := range reps {
		if r.Namespace == o.Namespace && r.Workload == o.Name {
			mine = append(mine, r)
		}
	}
	if err := printReplicas(w, getOpts{output: "wide"}, mine); err != nil {
		return err
	}
	// The table cuts reasons at 80 characters; describe gives them whole.
	var long []api.Replica
	for _, r := range mine {
		if len(r.Reason) > 80 {
			long = append(long, r)
		}
	}
	if len(long) > 0 {
		fmt.Fprintln(w, "Reasons:")
		for _, r := range long {
			fmt.Fprintf(w, "  %s: %s\n", r.Name, printable(r.Reason))
		}
	}
	// kubectl describe pod's Last State, per replica that has one.
	first := true
	for _, r := range mine {
		t := lastState(r)
		if t == nil {
			continue
		}
		if first {
			fmt.Fprintln(w, "Last State:")
			first = false
		}
		sig := ""
		if t.Signal != 0 {
			sig = fmt.Sprintf(", Signal: %d", t.Signal)
		}
		fmt.Fprintf(w, "  %s: Terminated (Reason: %s, Exit Code: %d%s, Started: %s, Finished: %s)\n", r.Name, printable(t.Reason), t.ExitCode, sig,
			t.StartedAt.Format(time.RFC1123Z), t.FinishedAt.Format(time.RFC1123Z))
	}
	return nil
}

// probeString is a probe as kubectl describe prints it.
func probeString(pr *corev1.Probe) string {
	var h string
	switch {
	case pr.HTTPGet != nil:
		h = fmt.Sprintf("http-get %s:%s%s", strings.ToLower(string(pr.HTTPGet.Scheme)), pr.HTTPGet.Port.String(), pr.HTTPGet.Path)
	case pr.TCPSocket != nil:
		h = "tcp-socket :" + pr.TCPSocket.Port.String()
	case pr.Exec != nil:
		h = "exec " + strings.Join(pr.Exec.Command, " ")
	}
	return fmt.Sprintf("%s delay=%ds timeout=%ds period=%ds #success=%d #failure=%d", h,
		pr.InitialDelaySeconds, pr.TimeoutSeconds, pr.PeriodSeconds, pr.SuccessThreshold, pr.FailureThreshold)
}

// printable replaces control characters (line breaks, terminal escapes)
// in text that came from a node with spaces.
func printable(s string) string {
	return strings.Map(func(c rune) rune {
		if unicode.IsControl(c) {
			return ' '
		}
		return c
	}, s)
}
