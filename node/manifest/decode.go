package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"github.com/distribution/reference"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// supportedKinds is quoted in errors about unknown apiVersion/kind pairs.
const supportedKinds = "apps/v1 Deployment, apps/v1 StatefulSet, v1 Service, v1 ConfigMap, v1 Secret, v1 PersistentVolumeClaim, networking.k8s.io/v1 Ingress"

// item is one decoded document (or List item) and what was wrong with it.
type item struct {
	obj    Object
	ok     bool // obj was decoded; it may still have validation errors
	report ObjectError
}

// chunk is one YAML or JSON document of an input.
type chunk struct {
	data   []byte
	line   int  // 1-based line of the input where the document starts
	isJSON bool // data is JSON; otherwise YAML
	err    error
}

var utf8BOM = []byte("\xef\xbb\xbf")

// parseInput decodes, defaults and validates every document of one input.
func parseInput(data []byte, source string) []item {
	data = bytes.TrimPrefix(data, utf8BOM)
	var chunks []chunk
	// kubectl sniffs the same way (k8s.io/apimachinery/pkg/util/yaml
	// NewYAMLOrJSONDecoder): input starting with '{' is a JSON stream, since
	// JSON indented with tabs is not valid YAML.
	if trimmed := bytes.TrimLeft(data, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '{' {
		chunks = splitJSON(data)
	} else {
		chunks = splitYAML(data)
	}
	var items []item
	for i, c := range chunks {
		report := ObjectError{Source: source, Document: i + 1, Line: c.line}
		if c.err != nil {
			report.Decoding = append(report.Decoding, c.err)
			items = append(items, item{report: report})
			continue
		}
		js := c.data
		if !c.isJSON {
			var err error
			// Strict: YAML forbids duplicate keys, and silently keeping
			// one of them hides mistakes.
			js, err = yaml.YAMLToJSONStrict(c.data)
			if err != nil {
				report.Decoding = append(report.Decoding, yamlError(err, c.line))
				items = append(items, item{report: report})
				continue
			}
		}
		if isNull(js) {
			continue // empty document
		}
		items = append(items, decodeDocument(js, report, true)...)
	}
	return items
}

// yamlLine matches the line numbers in go-yaml's messages.
var yamlLine = regexp.MustCompile(`\bline (\d+)\b`)

// yamlError rewords a go-yaml error: line numbers are made relative to the
// whole input (go-yaml counts from the document start) and a multi-line
// message ("yaml: unmarshal errors:\n  line 5: ...") is folded into one line.
func yamlError(err error, startLine int) error {
	msg := yamlLine.ReplaceAllStringFunc(err.Error(), func(m string) string {
		n, convErr := strconv.Atoi(strings.TrimPrefix(m, "line "))
		if convErr != nil {
			return m
		}
		return "line " + strconv.Itoa(n+startLine-1)
	})
	msg = strings.ReplaceAll(msg, ":\n  ", ": ")
	msg = strings.ReplaceAll(msg, "\n  ", "; ")
	msg = strings.ReplaceAll(msg, "\n", "; ")
	return errors.New("invalid YAML: " + msg)
}

// isNull reports whether js is the JSON null an empty YAML document becomes.
func isNull(js []byte) bool {
	return bytes.Equal(bytes.TrimSpace(js), []byte("null"))
}

// splitYAML cuts a YAML stream at "---" (and "...") lines, dropping
// documents that hold only blanks and comments.
func splitYAML(data []byte) []chunk {
	var chunks []chunk
	start, startLine := 0, 1
	flush := func(end int) {
		if hasContent(data[start:end]) {
			chunks = append(chunks, chunk{data: data[start:end], line: startLine})
		}
	}
	line := 1
	for pos := 0; pos < len(data); line++ {
		end := bytes.IndexByte(data[pos:], '\n')
		next := len(data)
		if end < 0 {
			end = len(data)
		} else {
			end += pos
			next = end + 1
		}
		if rest, ok := separator(data[pos:end]); ok {
			flush(pos)
			start, startLine = next, line+1
			if len(rest) > 0 && rest[0] != '#' {
				// "--- key: value": the document starts on the marker line.
				start, startLine = end-len(bytes.TrimLeft(data[pos+3:end], " \t")), line
			}
		}
		pos = next
	}
	flush(len(data))
	return chunks
}

// separator reports whether line is a document marker ("---" or "...",
// optionally followed by blanks and content) and returns what follows it.
func separator(line []byte) ([]byte, bool) {
	line = bytes.TrimRight(line, " \t\r")
	if len(line) < 3 {
		return nil, false
	}
	marker := string(line[:3])
	if marker != "---" && marker != "..." {
		return nil, false
	}
	if len(line) > 3 && line[3] != ' ' && line[3] != '\t' {
		return nil, false // "---foo" is a plain scalar, not a marker
	}
	return bytes.TrimSpace(line[3:]), true
}

// hasContent reports whether a YAML document has anything but blank lines,
// comments and directives ("%YAML 1.1", which precede a "---").
func hasContent(doc []byte) bool {
	for _, l := range bytes.Split(doc, []byte("\n")) {
		l = bytes.TrimSpace(l)
		if len(l) > 0 && l[0] != '#' && l[0] != '%' {
			return true
		}
	}
	return false
}

// splitJSON cuts a stream of concatenated JSON values. A syntax error ends
// the stream: nothing after it can be trusted to be aligned.
func splitJSON(data []byte) []chunk {
	var chunks []chunk
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		off := int(dec.InputOffset())
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return chunks
		}
		// Start line: skip the whitespace between the previous value and
		// this one.
		skip := len(data[off:]) - len(bytes.TrimLeft(data[off:], " \t\r\n"))
		line := 1 + bytes.Count(data[:off+skip], []byte("\n"))
		if err != nil {
			return append(chunks, chunk{line: line, err: fmt.Errorf("invalid JSON: %w", err)})
		}
		chunks = append(chunks, chunk{data: raw, line: line, isJSON: true})
	}
}

// typeHeader is read leniently first to pick the Go type for the strict
// decode.
type typeHeader struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// decodeDocument decodes one JSON document into typed objects, applies
// defaults and validates them. A `v1 List` is unpacked when allowList is set
// (one level deep, as kubectl does).
func decodeDocument(js []byte, report ObjectError, allowList bool) []item {
	fail := func(err error) []item {
		report.Decoding = append(report.Decoding, err)
		return []item{{report: report}}
	}
	trimmed := bytes.TrimSpace(js)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return fail(fmt.Errorf("want an object with apiVersion and kind, got %s", jsonKind(trimmed)))
	}
	var hdr typeHeader
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(js, &hdr); err != nil {
		return fail(fmt.Errorf("reading apiVersion and kind: %w", err))
	}
	switch {
	case hdr.APIVersion == "apps/v1" && hdr.Kind == KindDeployment:
		var d appsv1.Deployment
		return decodeTyped(js, &d, report, func() Object { return fromDeployment(&d) })
	case hdr.APIVersion == "apps/v1" && hdr.Kind == KindStatefulSet:
		var st appsv1.StatefulSet
		return decodeTyped(js, &st, report, func() Object { return fromStatefulSet(&st) })
	case hdr.APIVersion == "v1" && hdr.Kind == KindService:
		var s corev1.Service
		return decodeTyped(js, &s, report, func() Object { return fromService(&s) })
	case hdr.APIVersion == "v1" && hdr.Kind == KindConfigMap:
		var c corev1.ConfigMap
		return decodeTyped(js, &c, report, func() Object { return fromConfigMap(&c) })
	case hdr.APIVersion == "v1" && hdr.Kind == KindSecret:
		var sec corev1.Secret
		return decodeTyped(js, &sec, report, func() Object { return fromSecret(&sec) })
	case hdr.APIVersion == "v1" && hdr.Kind == KindPersistentVolumeClaim:
		var c corev1.PersistentVolumeClaim
		return decodeTyped(js, &c, report, func() Object { return fromClaim(&c) })
	case hdr.APIVersion == "networking.k8s.io/v1" && hdr.Kind == KindIngress:
		var in networkingv1.Ingress
		return decodeTyped(js, &in, report, func() Object { return fromIngress(&in) })
	case hdr.APIVersion == "v1" && hdr.Kind == "List" && allowList:
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		if err := sigsjson.UnmarshalCaseSensitivePreserveInts(js, &list); err != nil {
			return fail(fmt.Errorf("reading List items: %w", err))
		}
		var items []item
		for i, raw := range list.Items {
			for _, it := range decodeDocument(raw, report, false) {
				for j, err := range it.report.Decoding {
					it.report.Decoding[j] = fmt.Errorf("items[%d]: %w", i, err)
				}
				items = append(items, it)
			}
		}
		return items
	case hdr.Kind == "":
		return fail(fmt.Errorf("missing kind: supported apiVersion/kind: %s", supportedKinds))
	default:
		return fail(fmt.Errorf("unsupported apiVersion/kind %q: supported: %s", hdr.APIVersion+" "+hdr.Kind, supportedKinds))
	}
}

// decodeTyped strictly decodes js into v, then builds, defaults and
// validates the Object. Unknown and duplicate fields are reported but do not
// stop validation, so one pass shows every problem; type mismatches do.
func decodeTyped(js []byte, v any, report ObjectError, build func() Object) []item {
	strictErrs, err := sigsjson.UnmarshalStrict(js, v)
	if err != nil {
		if fe := typeMismatch(js, v); fe != nil {
			err = fe
		}
		report.Decoding = append(report.Decoding, err)
		return []item{{report: report}}
	}
	report.Decoding = append(report.Decoding, strictErrs...)
	obj := build()
	obj.Applied = js
	obj.Ignored = serverSet(js)
	report.Kind, report.Name = obj.Kind, obj.Name
	report.Errs = Validate(obj)
	return []item{{obj: obj, ok: true, report: report}}
}

// serverSet lists the fields of document js that the API server sets
// and Starling sets itself (serverOwnedMeta): a `kubectl get -o yaml`
// output applied again carries them; they are ignored, and said so.
func serverSet(js []byte) []string {
	var doc struct {
		Metadata map[string]json.RawMessage `json:"metadata"`
		Status   json.RawMessage            `json:"status"`
	}
	if json.Unmarshal(js, &doc) != nil {
		return nil
	}
	var out []string
	for _, f := range []string{"uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink"} {
		if v, ok := doc.Metadata[f]; ok && string(v) != "null" {
			out = append(out, "metadata."+f)
		}
	}
	if s := string(bytes.TrimSpace(doc.Status)); s != "" && s != "null" && s != "{}" {
		out = append(out, "status")
	}
	return out
}

// typeMismatch explains a value of the wrong JSON type as a field error
// with its full path, as Kubernetes' schema validation does
// ("spec.template.spec.containers[0].readinessProbe.exec.command: Invalid
// value: "cat /tmp/ready": must be a list"), instead of the decoder's
// Go-typed message. It returns nil when js has no such mismatch or the
// value cannot be located.
func typeMismatch(js []byte, v any) *field.Error {
	// sigs.k8s.io/json keeps its error type internal: decode again with
	// encoding/json (only on this error path) for a typed error.
	var ute *json.UnmarshalTypeError
	fresh := reflect.New(reflect.TypeOf(v).Elem()).Interface()
	if err := json.Unmarshal(js, fresh); !errors.As(err, &ute) || ute.Field == "" {
		return nil
	}
	// Field is a dotted path of JSON names with the Go names of embedded
	// structs (corev1.ProbeHandler) in between; JSON names start in lower case.
	var names []string
	for _, n := range strings.Split(ute.Field, ".") {
		if n != "" && !unicode.IsUpper(rune(n[0])) {
			names = append(names, n)
		}
	}
	var doc any
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil
	}
	kind, _, _ := strings.Cut(ute.Value, " ") // "number -5"
	path, value, ok := findMismatch(doc, names, nil, kind)
	if !ok {
		return nil
	}
	switch value.(type) {
	case map[string]any:
		value = "an object"
	case []any:
		value = "a list"
	}
	return field.Invalid(path, value, "must be "+describeType(ute.Type))
}

// findMismatch finds, under v at path, the first value at the dotted
// names (through any list) whose JSON kind is kind.
func findMismatch(v any, names []string, path *field.Path, kind string) (*field.Path, any, bool) {
	if len(names) == 0 && valueKind(v) == kind {
		return path, v, true
	}
	switch x := v.(type) {
	case []any:
		for i, e := range x {
			if p, found, ok := findMismatch(e, names, path.Index(i), kind); ok {
				return p, found, true
			}
		}
	case map[string]any:
		if len(names) == 0 {
			return nil, nil, false
		}
		child, ok := x[names[0]]
		if !ok {
			return nil, nil, false
		}
		p := field.NewPath(names[0])
		if path != nil {
			p = path.Child(names[0])
		}
		return findMismatch(child, names[1:], p, kind)
	}
	return nil, nil, false
}

// valueKind names a decoded JSON value as encoding/json's type errors do.
func valueKind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	}
	return "null"
}

// describeType says what a Go type accepts, in manifest words.
func describeType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return describeType(t.Elem())
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	}
	return "of type " + t.String()
}

// jsonKind names the type of a JSON value for error messages.
func jsonKind(js []byte) string {
	if len(js) == 0 {
		return "nothing"
	}
	switch js[0] {
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return "a number"
	default:
		return "something that is not JSON"
	}
}

// checkDuplicates reports objects that share a store key with an earlier
// one: applying both would silently keep only one.
func checkDuplicates(items []item) {
	seen := make(map[string]*item)
	for i := range items {
		it := &items[i]
		if !it.ok || it.obj.Name == "" {
			continue
		}
		key := it.obj.Key()
		first, dup := seen[key]
		if !dup {
			seen[key] = it
			continue
		}
		e := field.Duplicate(field.NewPath("metadata", "name"), it.obj.Name)
		e.Detail = "also defined at " + where(&first.report)
		it.report.Errs = append(it.report.Errs, e)
	}
}

// where names a document for cross-references in messages.
func where(r *ObjectError) string {
	s := fmt.Sprintf("document %d", r.Document)
	if r.Source != "" {
		s = r.Source + " " + s
	}
	return s
}

// Defaults mirror the Kubernetes API server's
// (k8s.io/kubernetes/pkg/apis/apps/v1/defaults.go and
// pkg/apis/core/v1/defaults.go) for the fields Starling supports, so a
// manifest means the same thing here as on a cluster.
const (
	defaultReplicas                = 1
	defaultRevisionHistoryLimit    = 10
	defaultProgressDeadlineSeconds = 600
	defaultGracePeriodSeconds      = 30
	defaultTerminationMessagePath  = "/dev/termination-log"
	defaultProbeTimeoutSeconds     = 1
	defaultProbePeriodSeconds      = 10
	defaultProbeSuccessThreshold   = 1
	defaultProbeFailureThreshold   = 3
)

// defaultMaxUnavailableSurge is Kubernetes' default for both
// rollingUpdate.maxUnavailable and maxSurge.
var defaultMaxUnavailableSurge = intstr.FromString("25%")

// fromDeployment defaults d in place, clears server-owned fields and wraps it.
func fromDeployment(d *appsv1.Deployment) Object {
	defaultDeployment(d)
	return Object{Kind: KindDeployment, Namespace: d.Namespace, Name: d.Name, Deployment: d}
}

// fromService defaults s in place, clears server-owned fields and wraps it.
func fromService(s *corev1.Service) Object {
	defaultService(s)
	return Object{Kind: KindService, Namespace: s.Namespace, Name: s.Name, Service: s}
}

// clearMeta drops the metadata a server fills in; manifests copied from
// `kubectl get -o yaml` carry them and they mean nothing to Starling.
func clearMeta(m *metav1.ObjectMeta) {
	if m.Namespace == "" {
		m.Namespace = DefaultNamespace
	}
	m.UID = ""
	m.ResourceVersion = ""
	m.CreationTimestamp = metav1.Time{}
	m.Generation = 0
	m.ManagedFields = nil
	m.SelfLink = ""
}

func defaultDeployment(d *appsv1.Deployment) {
	d.APIVersion, d.Kind = "apps/v1", KindDeployment
	clearMeta(&d.ObjectMeta)
	d.Status = appsv1.DeploymentStatus{}
	s := &d.Spec
	if s.Replicas == nil {
		s.Replicas = ptr[int32](defaultReplicas)
	}
	if s.Strategy.Type == "" {
		s.Strategy.Type = appsv1.RollingUpdateDeploymentStrategyType
	}
	if s.Strategy.Type == appsv1.RollingUpdateDeploymentStrategyType {
		if s.Strategy.RollingUpdate == nil {
			s.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{}
		}
		ru := s.Strategy.RollingUpdate
		if ru.MaxUnavailable == nil {
			ru.MaxUnavailable = ptr(defaultMaxUnavailableSurge)
		}
		if ru.MaxSurge == nil {
			ru.MaxSurge = ptr(defaultMaxUnavailableSurge)
		}
	}
	if s.RevisionHistoryLimit == nil {
		s.RevisionHistoryLimit = ptr[int32](defaultRevisionHistoryLimit)
	}
	if s.ProgressDeadlineSeconds == nil {
		s.ProgressDeadlineSeconds = ptr[int32](defaultProgressDeadlineSeconds)
	}
	s.Template.CreationTimestamp = metav1.Time{}
	defaultPodSpec(&s.Template.Spec)
}

func defaultPodSpec(p *corev1.PodSpec) {
	if p.RestartPolicy == "" {
		p.RestartPolicy = corev1.RestartPolicyAlways
	}
	if p.TerminationGracePeriodSeconds == nil {
		p.TerminationGracePeriodSeconds = ptr[int64](defaultGracePeriodSeconds)
	}
	for i := range p.Containers {
		defaultContainer(&p.Containers[i])
	}
	for i := range p.InitContainers {
		defaultContainer(&p.InitContainers[i])
	}
}

func defaultContainer(c *corev1.Container) {
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = defaultPullPolicy(c.Image)
	}
	if c.TerminationMessagePath == "" {
		c.TerminationMessagePath = defaultTerminationMessagePath
	}
	if c.TerminationMessagePolicy == "" {
		c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	}
	for i := range c.Ports {
		if c.Ports[i].Protocol == "" {
			c.Ports[i].Protocol = corev1.ProtocolTCP
		}
	}
	defaultResources(&c.Resources)
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if p != nil {
			defaultProbe(p)
		}
	}
}

// defaultResources sets each missing request to its limit, as Kubernetes
// does: a container that only sets limits is guaranteed what it may use.
func defaultResources(r *corev1.ResourceRequirements) {
	for name, limit := range r.Limits {
		if _, ok := r.Requests[name]; ok {
			continue
		}
		if r.Requests == nil {
			r.Requests = corev1.ResourceList{}
		}
		r.Requests[name] = limit.DeepCopy()
	}
}

// defaultPullPolicy is Kubernetes' rule: Always for ":latest" or untagged
// images, IfNotPresent otherwise. Unparseable images are left to validation.
func defaultPullPolicy(image string) corev1.PullPolicy {
	ref, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return ""
	}
	if _, ok := ref.(reference.Digested); ok {
		return corev1.PullIfNotPresent
	}
	if t, ok := ref.(reference.Tagged); ok && t.Tag() != "latest" {
		return corev1.PullIfNotPresent
	}
	return corev1.PullAlways
}

func defaultProbe(p *corev1.Probe) {
	if p.TimeoutSeconds == 0 {
		p.TimeoutSeconds = defaultProbeTimeoutSeconds
	}
	if p.PeriodSeconds == 0 {
		p.PeriodSeconds = defaultProbePeriodSeconds
	}
	if p.SuccessThreshold == 0 {
		p.SuccessThreshold = defaultProbeSuccessThreshold
	}
	if p.FailureThreshold == 0 {
		p.FailureThreshold = defaultProbeFailureThreshold
	}
	if h := p.HTTPGet; h != nil {
		if h.Path == "" {
			h.Path = "/"
		}
		if h.Scheme == "" {
			h.Scheme = corev1.URISchemeHTTP
		}
	}
}

func defaultService(s *corev1.Service) {
	s.APIVersion, s.Kind = "v1", KindService
	clearMeta(&s.ObjectMeta)
	s.Status = corev1.ServiceStatus{}
	sp := &s.Spec
	if sp.Type == "" {
		sp.Type = corev1.ServiceTypeClusterIP
	}
	if sp.SessionAffinity == "" {
		sp.SessionAffinity = corev1.ServiceAffinityNone
	}
	// clusterIP and clusterIPs[0] are the same address; the API server fills
	// whichever is missing.
	if sp.ClusterIP == "" && len(sp.ClusterIPs) > 0 {
		sp.ClusterIP = sp.ClusterIPs[0]
	}
	if sp.ClusterIP != "" && len(sp.ClusterIPs) == 0 {
		sp.ClusterIPs = []string{sp.ClusterIP}
	}
	external := sp.Type == corev1.ServiceTypeNodePort || sp.Type == corev1.ServiceTypeLoadBalancer
	if sp.InternalTrafficPolicy == nil && (sp.Type == corev1.ServiceTypeClusterIP || external) {
		sp.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyCluster)
	}
	if sp.ExternalTrafficPolicy == "" && external {
		sp.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	}
	for i := range sp.Ports {
		p := &sp.Ports[i]
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		if (p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal == 0) ||
			(p.TargetPort.Type == intstr.String && p.TargetPort.StrVal == "") {
			p.TargetPort = intstr.FromInt32(p.Port)
		}
	}
}

func ptr[T any](v T) *T { return &v }
