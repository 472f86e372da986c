package harness

import (
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// EchoImage is the test image most end-to-end tests run (the echo server
// of test/imagebuild, imported from the tarball its tests build).
const EchoImage = "starling.local/echo:v1"

// App is the pod of a test workload: one container, named "echo" and of
// EchoImage unless set, in pods labelled app=Name. Its methods write the
// YAML of a Deployment or StatefulSet of it, in the shape kubectl writes
// (sigs.k8s.io/yaml over Kubernetes' types, k8s.io/api), so the end-to-end
// tests apply what users bring.
type App struct {
	Name      string
	Namespace string // "": none written (the default namespace)
	Replicas  int32
	Image     string // "": EchoImage
	Container string // "": echo
	Command   []string
	Env       []corev1.EnvVar // see Env
	Ports     []corev1.ContainerPort
	// Grace is terminationGracePeriodSeconds (nil: unset, 30 s).
	Grace     *int64
	Readiness *corev1.Probe
	Liveness  *corev1.Probe
	Limits    corev1.ResourceList // see Limits
	// Pod edits the pod spec last (hooks, DNS, security context, ...).
	Pod func(*corev1.PodSpec)
}

// Seconds returns a pointer to s, for App.Grace and other optional
// counts of seconds.
func Seconds(s int64) *int64 { return &s }

// Env returns environment variables from name, value pairs.
func Env(pairs ...string) []corev1.EnvVar {
	if len(pairs)%2 != 0 {
		panic("harness.Env: odd number of arguments")
	}
	var env []corev1.EnvVar
	for i := 0; i < len(pairs); i += 2 {
		env = append(env, corev1.EnvVar{Name: pairs[i], Value: pairs[i+1]})
	}
	return env
}

// FieldEnv returns a variable set from a field of the pod
// (the field valueFrom.fieldRef in YAML), e.g. "status.podIP".
func FieldEnv(name, fieldPath string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: fieldPath}}}
}

// Limits returns resource limits from resource, quantity pairs
// ("memory", "64Mi"); it panics on a malformed quantity.
func Limits(pairs ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i+1 < len(pairs); i += 2 {
		l[corev1.ResourceName(pairs[i])] = resource.MustParse(pairs[i+1])
	}
	return l
}

// HTTPPort is the echo server's port 8080, named http.
var HTTPPort = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}

// Port8080 is the echo server's port 8080, unnamed.
var Port8080 = []corev1.ContainerPort{{ContainerPort: 8080}}

// HTTPProbe returns a probe of path on the port named http, every second,
// failing after failures failed attempts.
func HTTPProbe(path string, failures int32) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("http")}},
		PeriodSeconds: 1, FailureThreshold: failures}
}

// ExecProbe returns a probe that runs command every second, failing
// after failures failed attempts (0: the default, 3).
func ExecProbe(failures int32, command ...string) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: command}},
		PeriodSeconds: 1, FailureThreshold: failures}
}

// template is a's pod template.
func (a App) template() corev1.PodTemplateSpec {
	c := corev1.Container{Name: a.Container, Image: a.Image, Command: a.Command, Env: a.Env, Ports: a.Ports,
		ReadinessProbe: a.Readiness, LivenessProbe: a.Liveness, Resources: corev1.ResourceRequirements{Limits: a.Limits}}
	if c.Name == "" {
		c.Name = "echo"
	}
	if c.Image == "" {
		c.Image = EchoImage
	}
	spec := corev1.PodSpec{TerminationGracePeriodSeconds: a.Grace, Containers: []corev1.Container{c}}
	if a.Pod != nil {
		a.Pod(&spec)
	}
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": a.Name}}, Spec: spec}
}

func (a App) meta() metav1.ObjectMeta { return metav1.ObjectMeta{Name: a.Name, Namespace: a.Namespace} }

func (a App) selector() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"app": a.Name}}
}

// Deployment returns the YAML of an apps/v1 Deployment of a, after edit.
func (a App) Deployment(edit ...func(*appsv1.Deployment)) string {
	d := appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"}, ObjectMeta: a.meta(),
		Spec: appsv1.DeploymentSpec{Replicas: &a.Replicas, Selector: a.selector(), Template: a.template()}}
	for _, e := range edit {
		e(&d)
	}
	return toYAML(d)
}

// StatefulSet returns the YAML of an apps/v1 StatefulSet of a whose
// governing Service is service, after edit.
func (a App) StatefulSet(service string, edit ...func(*appsv1.StatefulSet)) string {
	s := appsv1.StatefulSet{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"}, ObjectMeta: a.meta(),
		Spec: appsv1.StatefulSetSpec{Replicas: &a.Replicas, ServiceName: service, Selector: a.selector(), Template: a.template()}}
	for _, e := range edit {
		e(&s)
	}
	return toYAML(s)
}

// Service returns the YAML of a v1 Service named name in a's namespace
// that selects a's pods, with ports (see ServicePort), after edit.
func (a App) Service(name string, ports []corev1.ServicePort, edit ...func(*corev1.ServiceSpec)) string {
	s := corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: a.Namespace},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": a.Name}, Ports: ports}}
	for _, e := range edit {
		e(&s.Spec)
	}
	return toYAML(s)
}

// ServicePort returns a TCP Service port that forwards port to target: a
// container port's number ("8080") or name ("http"); "" forwards to port.
func ServicePort(port int32, target string) corev1.ServicePort {
	p := corev1.ServicePort{Port: port, TargetPort: intstr.FromInt32(port)}
	if target != "" {
		p.TargetPort = intstr.Parse(target)
	}
	return p
}

// Manifests joins YAML documents into one stream.
func Manifests(docs ...string) string { return strings.Join(docs, "---\n") }

// toYAML writes v as YAML; the types above always marshal.
func toYAML(v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("harness: marshal %T: %v", v, err))
	}
	return string(b)
}
