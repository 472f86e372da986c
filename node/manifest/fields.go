package manifest

import (
	"encoding/json"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// notSupportedYet is the detail of every error about a field Starling does
// not implement.
const notSupportedYet = "not supported by Starling yet"

// fieldTree is a set of JSON field paths. A path ending at a leaf allows the
// whole subtree below it (maps of labels, resource lists, int-or-strings).
// "[]" stands for every element of a list.
type fieldTree struct {
	leaf     bool
	children map[string]*fieldTree
}

// newFieldTree builds a tree from dotted paths such as
// "spec.template.spec.containers[].ports[].containerPort". A path ending in
// "{}" names an object that may only be empty: its set fields are reported
// one by one, at their own paths.
func newFieldTree(groups ...[]string) *fieldTree {
	root := &fieldTree{}
	for _, paths := range groups {
		for _, p := range paths {
			p, onlyEmpty := strings.CutSuffix(p, "{}")
			t := root
			for _, seg := range strings.Split(strings.ReplaceAll(p, "[]", ".[]"), ".") {
				if t.children == nil {
					t.children = make(map[string]*fieldTree)
				}
				next := t.children[seg]
				if next == nil {
					next = &fieldTree{}
					t.children[seg] = next
				}
				t = next
			}
			t.leaf = !onlyEmpty
		}
	}
	return root
}

// prefixed returns paths with prefix prepended.
func prefixed(prefix string, paths ...string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = prefix + p
	}
	return out
}

// serverOwnedMeta is the server-owned metadata: accepted so output of `kubectl get -o yaml` can be
// applied, and cleared by defaulting.
var serverOwnedMeta = []string{
	"metadata.uid", "metadata.resourceVersion", "metadata.creationTimestamp",
	"metadata.generation", "metadata.managedFields", "metadata.selfLink",
	"status",
}

var commonFields = []string{
	"apiVersion", "kind",
	"metadata.name", "metadata.namespace", "metadata.labels", "metadata.annotations",
}

var probeFields = []string{
	"exec.command",
	"httpGet.path", "httpGet.port", "httpGet.scheme", "httpGet.httpHeaders",
	"tcpSocket.port",
	"initialDelaySeconds", "timeoutSeconds", "periodSeconds",
	"successThreshold", "failureThreshold",
}

// hookFields are the lifecycle handler fields Starling runs (tcpSocket,
// which the kubelet no longer runs either, is refused).
var hookFields = []string{
	"exec.command",
	"httpGet.path", "httpGet.port", "httpGet.host", "httpGet.scheme", "httpGet.httpHeaders",
	"sleep.seconds",
}

var containerFields = concat(
	[]string{
		"name", "image", "command", "args", "workingDir",
		"env[].name", "env[].value", "env[].valueFrom.fieldRef.fieldPath", "env[].valueFrom.fieldRef.apiVersion",
		"ports[].name", "ports[].containerPort", "ports[].protocol",
		"resources.requests", "resources.limits",
		"imagePullPolicy",
		// Harmless: where the runtime looks for a termination message.
		"terminationMessagePath", "terminationMessagePolicy",
		"securityContext.runAsUser", "securityContext.runAsGroup", "securityContext.runAsNonRoot",
		"securityContext.readOnlyRootFilesystem", "securityContext.allowPrivilegeEscalation",
		"securityContext.capabilities.add", "securityContext.capabilities.drop",
		"securityContext.seccompProfile.type",
		// false is what kubectl prints; true is refused (validateContainerSecurity).
		"securityContext.privileged",
	},
	prefixed("lifecycle.postStart.", hookFields...),
	prefixed("lifecycle.preStop.", hookFields...),
	prefixed("readinessProbe.", probeFields...),
	prefixed("livenessProbe.", probeFields...),
	prefixed("startupProbe.", probeFields...),
)

// deploymentFields are the Deployment fields Starling implements or that
// cannot change behaviour. Any other field that is set is rejected, so a
// field added to k8s.io/api is refused until someone implements it.
var deploymentFields = newFieldTree(
	commonFields,
	serverOwnedMeta,
	[]string{
		"spec.replicas", "spec.selector.matchLabels",
		"spec.revisionHistoryLimit", "spec.progressDeadlineSeconds",
		"spec.minReadySeconds", "spec.paused",
		"spec.strategy.type",
		"spec.strategy.rollingUpdate.maxUnavailable", "spec.strategy.rollingUpdate.maxSurge",
	},
	podTemplateFields,
)

// podTemplateFields are the pod template fields Starling implements, for
// Deployments and StatefulSets alike.
var podTemplateFields = concat(
	[]string{
		"spec.template.metadata.labels", "spec.template.metadata.annotations",
		"spec.template.metadata.creationTimestamp",
		"spec.template.spec.terminationGracePeriodSeconds",
		"spec.template.spec.nodeSelector",
		"spec.template.spec.hostname", "spec.template.spec.subdomain",
		"spec.template.spec.hostAliases[].ip", "spec.template.spec.hostAliases[].hostnames",
		"spec.template.spec.dnsConfig.nameservers", "spec.template.spec.dnsConfig.searches",
		"spec.template.spec.dnsConfig.options[].name", "spec.template.spec.dnsConfig.options[].value",
		"spec.template.spec.restartPolicy",
		"spec.template.spec.dnsPolicy",
		"spec.template.spec.enableServiceLinks",
		// Harmless: Starling has one scheduler and no service accounts.
		"spec.template.spec.schedulerName",
		"spec.template.spec.serviceAccountName", "spec.template.spec.serviceAccount",
		"spec.template.spec.securityContext.runAsUser", "spec.template.spec.securityContext.runAsGroup",
		"spec.template.spec.securityContext.runAsNonRoot", "spec.template.spec.securityContext.seccompProfile.type",
	},
	prefixed("spec.template.spec.containers[].", containerFields...),
)

// serviceFields are the Service fields Starling implements or that cannot
// change behaviour; see deploymentFields.
var serviceFields = newFieldTree(
	commonFields,
	serverOwnedMeta,
	[]string{
		"spec.type", "spec.selector", "spec.clusterIP", "spec.clusterIPs",
		"spec.ipFamilies", "spec.ipFamilyPolicy",
		"spec.internalTrafficPolicy", "spec.externalTrafficPolicy",
		"spec.sessionAffinity",
		"spec.ports[].name", "spec.ports[].protocol", "spec.ports[].port",
		"spec.ports[].targetPort", "spec.ports[].nodePort",
	},
)

func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// unsupportedFields returns a Forbidden error for every non-empty field of
// obj outside allowed, naming its exact path. obj is walked in its JSON form,
// the same shape users write.
func unsupportedFields(allowed *fieldTree, obj any) field.ErrorList {
	js, err := json.Marshal(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	var v any
	if err := json.Unmarshal(js, &v); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	var errs field.ErrorList
	walkFields(allowed, v, nil, &errs)
	return errs
}

func walkFields(t *fieldTree, v any, path *field.Path, errs *field.ErrorList) {
	if t.leaf || isEmpty(v) {
		return
	}
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			var p *field.Path
			if path == nil {
				p = field.NewPath(k)
			} else {
				p = path.Child(k)
			}
			visit(t.children[k], v[k], p, errs)
		}
	case []any:
		for i, e := range v {
			visit(t.children["[]"], e, path.Index(i), errs)
		}
	}
	// A scalar where the tree expects structure cannot come out of the typed
	// objects; nothing to report.
}

func visit(t *fieldTree, v any, path *field.Path, errs *field.ErrorList) {
	if t == nil {
		if !isEmpty(v) {
			*errs = append(*errs, field.Forbidden(path, notSupportedYet))
		}
		return
	}
	walkFields(t, v, path, errs)
}

// isEmpty reports whether a JSON value says nothing: null, an empty list,
// or an object holding only empty values. `securityContext: {}` is empty; `false`
// and `0` are not, since for pointer fields they are explicit choices.
func isEmpty(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case map[string]any:
		for _, e := range v {
			if !isEmpty(e) {
				return false
			}
		}
		return true
	case []any:
		// A list element is an explicit entry even when all its fields are
		// empty (`tolerations: [{}]` tolerates everything).
		return len(v) == 0
	default:
		return false
	}
}
