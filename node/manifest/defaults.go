package manifest

import (
	"github.com/distribution/reference"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

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
	if sp.InternalTrafficPolicy == nil && (sp.Type == corev1.ServiceTypeClusterIP || sp.Type == corev1.ServiceTypeNodePort) {
		sp.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyCluster)
	}
	if sp.ExternalTrafficPolicy == "" && sp.Type == corev1.ServiceTypeNodePort {
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
