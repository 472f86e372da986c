package runtime

import (
	"strings"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

// Environment and $(VAR) expansion as the kubelet builds them
// (pkg/kubelet/kubelet_pods.go makeEnvironmentVariables and
// third_party/forked/golang/expansion). Not imported: that package lives
// in k8s.io/kubernetes, which cannot be required as a module.

// podFields are the values of the downward API fields a container's env
// may name (manifest.EnvFieldPaths).
type podFields struct {
	Name, Namespace, UID, NodeName, PodIP, HostIP string
}

func (f podFields) value(path string) string {
	switch path {
	case "metadata.name":
		return f.Name
	case "metadata.namespace":
		return f.Namespace
	case "metadata.uid":
		return f.UID
	case "status.hostIP", "status.hostIPs":
		return f.HostIP
	case "spec.nodeName":
		return f.NodeName
	case "status.podIP", "status.podIPs":
		return f.PodIP
	}
	return ""
}

// containerEnv returns the container's environment ("NAME=value", in the
// template's order, a later duplicate replacing an earlier one, then the
// Service variables env does not set, in their order) and the same as a
// map for expanding command and args: each value has its $(NAME)
// references expanded against the variables defined before it and the
// Service variables, downward API fields are filled in from f. The
// image's own environment is not in it: the runtime merges it underneath,
// and references never see it (as with the kubelet).
func containerEnv(env, services []reconcile.EnvVar, f podFields) ([]string, map[string]string) {
	svc := make(map[string]string, len(services))
	for _, e := range services {
		svc[e.Name] = e.Value
	}
	vars := make(map[string]string, len(env)+len(services))
	lookup := func(name string) (string, bool) {
		if v, ok := vars[name]; ok {
			return v, true
		}
		v, ok := svc[name]
		return v, ok
	}
	var order []string
	for _, e := range env {
		v := e.Value
		if e.FieldPath != "" {
			v = f.value(e.FieldPath)
		} else if v != "" && !e.Literal {
			v = expandWith(v, lookup)
		}
		if _, seen := vars[e.Name]; !seen {
			order = append(order, e.Name)
		}
		vars[e.Name] = v
	}
	for _, e := range services {
		if _, set := vars[e.Name]; !set {
			order = append(order, e.Name)
			vars[e.Name] = e.Value
		}
	}
	out := make([]string, len(order))
	for i, name := range order {
		out[i] = name + "=" + vars[name]
	}
	return out, vars
}

// expandAll expands $(NAME) references in each of args against vars.
func expandAll(args []string, vars map[string]string) []string {
	if args == nil {
		return nil
	}
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = expand(a, vars)
	}
	return out
}

// expand replaces each $(NAME) in s by vars[NAME], by the kubelet's rules:
// "$$" is an escaped "$" (so "$$(NAME)" gives "$(NAME)"), a reference to
// a variable not in vars stays as written, and a "$" followed by anything
// else, or a "$(" never closed, is kept as it is.
func expand(s string, vars map[string]string) string {
	return expandWith(s, func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	})
}

// expandWith is expand with the variables looked up by lookup.
func expandWith(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}
