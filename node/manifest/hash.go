package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// replicaSpec is what defines a replica of a container: two replicas with
// equal replicaSpecs are interchangeable. Field order is part of the hash;
// append new fields at the end, with omitempty, so existing hashes hold.
type replicaSpec struct {
	Image     string                      `json:"image"`
	Command   []string                    `json:"command,omitempty"`
	Args      []string                    `json:"args,omitempty"`
	Env       []corev1.EnvVar             `json:"env,omitempty"`
	Ports     []corev1.ContainerPort      `json:"ports,omitempty"`
	Resources corev1.ResourceRequirements `json:"resources"`
	// WorkingDir came after the first release: omitempty keeps the hashes
	// of templates without one.
	WorkingDir string `json:"workingDir,omitempty"`
	// RestartedAt is the pod template annotation RestartedAtAnnotation,
	// which `rollout restart` sets to make the hash, and so every replica,
	// new (as the annotation's pod-template-hash change does in Kubernetes).
	RestartedAt string `json:"restartedAt,omitempty"`
	// The probes are part of the spec, as in Kubernetes' pod-template
	// hash: changing one rolls the replicas under the update budget
	// instead of judging (and restarting) every running copy at once.
	ReadinessProbe *corev1.Probe `json:"readinessProbe,omitempty"`
	LivenessProbe  *corev1.Probe `json:"livenessProbe,omitempty"`
	StartupProbe   *corev1.Probe `json:"startupProbe,omitempty"`
	// Pod-level fields, after the first release: set only when not the
	// default, so the hashes of templates without them hold.
	// terminationGracePeriodSeconds is fixed in a container when it is
	// created; nodeSelector decides where replicas may run. Both roll, as
	// in Kubernetes.
	TerminationGracePeriodSeconds *int64            `json:"terminationGracePeriodSeconds,omitempty"`
	NodeSelector                  map[string]string `json:"nodeSelector,omitempty"`
	// What the replica's /etc/hosts, /etc/hostname and /etc/resolv.conf
	// are made of (dnsPolicy unless ClusterFirst, the default).
	Hostname    string               `json:"hostname,omitempty"`
	Subdomain   string               `json:"subdomain,omitempty"`
	HostAliases []corev1.HostAlias   `json:"hostAliases,omitempty"`
	DNSPolicy   corev1.DNSPolicy     `json:"dnsPolicy,omitempty"`
	DNSConfig   *corev1.PodDNSConfig `json:"dnsConfig,omitempty"`
	// The pod's and the container's securityContext, when not empty
	// (kubectl prints `securityContext: {}`, which changes nothing).
	PodSecurityContext *corev1.PodSecurityContext `json:"podSecurityContext,omitempty"`
	SecurityContext    *corev1.SecurityContext    `json:"securityContext,omitempty"`
	// enableServiceLinks when false (true is the default).
	NoServiceLinks bool `json:"noServiceLinks,omitempty"`
	// The container's postStart and preStop hooks.
	Lifecycle *corev1.Lifecycle `json:"lifecycle,omitempty"`
	// imagePullPolicy unless the default for the image (Always for
	// ":latest" or no tag, else IfNotPresent), so the hashes of templates
	// that leave it out hold; a change rolls, as in Kubernetes.
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// The pod's volumes (their default modes left out), the container's
	// mounts of them and the pod's imagePullSecrets: a change rolls, as
	// in Kubernetes.
	Volumes          []corev1.Volume               `json:"volumes,omitempty"`
	VolumeMounts     []corev1.VolumeMount          `json:"volumeMounts,omitempty"`
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// Pods of several containers: every container's name, whether it is
	// an init container, and an init container's restartPolicy (Always:
	// a native sidecar). Left out for a pod of one container and no init
	// container, so its hash holds.
	Name          string                         `json:"name,omitempty"`
	Init          bool                           `json:"init,omitempty"`
	RestartPolicy *corev1.ContainerRestartPolicy `json:"restartPolicy,omitempty"`
	// shareProcessNamespace when true.
	SharePIDs bool `json:"sharePIDs,omitempty"`
}

// RestartedAtAnnotation is the pod template annotation `kubectl rollout
// restart` sets to the time of the restart (RFC 3339); Starling's
// `rollout restart` sets the same one.
const RestartedAtAnnotation = "kubectl.kubernetes.io/restartedAt"

// SpecHash returns 8 lowercase hex characters identifying the replica
// template of d: the first 4 bytes of the SHA-256 of the canonical JSON of
// image, command, args, env, ports, resources, workingDir and probes of
// every container, in order, each with the template's RestartedAtAnnotation,
// terminationGracePeriodSeconds (unless 30, the default), nodeSelector,
// hostname, subdomain, hostAliases, dnsPolicy (unless ClusterFirst),
// dnsConfig, the pod's and container's securityContext,
// enableServiceLinks (when false), the container's lifecycle hooks, its
// imagePullPolicy (unless the image's default), the pod's volumes and
// imagePullSecrets and the container's volumeMounts; for a pod of
// several containers (init containers included, first), each one's name,
// role and restartPolicy.
// Replicas, strategy and other Deployment settings do not change it, so it
// changes exactly when replicas must be replaced. Unlike Kubernetes'
// pod-template-hash, the template's labels and other annotations are left
// out: Starling gives them to no container, so a change to them has
// nothing to roll. Defaults are applied to a copy first, so a defaulted and an
// undefaulted Deployment hash alike, as do equal quantities written
// differently ("0.5" and "500m" CPU).
func SpecHash(d *appsv1.Deployment) string {
	if d == nil {
		return TemplateHash(nil)
	}
	return TemplateHash(&d.Spec.Template)
}

// TemplateHash is SpecHash of a pod template (a StatefulSet's, or a
// Deployment's); nil hashes like an empty template.
func TemplateHash(t *corev1.PodTemplateSpec) string {
	var specs []replicaSpec
	if t != nil {
		restartedAt := t.Annotations[RestartedAtAnnotation]
		grace := t.Spec.TerminationGracePeriodSeconds
		if grace != nil && *grace == defaultGracePeriodSeconds {
			grace = nil
		}
		dnsPolicy := t.Spec.DNSPolicy
		if dnsPolicy == corev1.DNSClusterFirst {
			dnsPolicy = ""
		}
		podSecurity := t.Spec.SecurityContext
		if podSecurity != nil && reflect.ValueOf(*podSecurity).IsZero() {
			podSecurity = nil
		}
		several := len(t.Spec.Containers) > 1 || len(t.Spec.InitContainers) > 0
		volumes := hashVolumes(t.Spec.Volumes)
		add := func(c corev1.Container, init bool) {
			c = *c.DeepCopy()
			defaultContainer(&c)
			rs := replicaSpec{
				Image:          c.Image,
				Command:        c.Command,
				Args:           c.Args,
				Env:            c.Env,
				Ports:          c.Ports,
				Resources:      c.Resources,
				WorkingDir:     c.WorkingDir,
				RestartedAt:    restartedAt,
				ReadinessProbe: c.ReadinessProbe,
				LivenessProbe:  c.LivenessProbe,
				StartupProbe:   c.StartupProbe,

				TerminationGracePeriodSeconds: grace,
				NodeSelector:                  t.Spec.NodeSelector,
				Hostname:                      t.Spec.Hostname,
				Subdomain:                     t.Spec.Subdomain,
				HostAliases:                   t.Spec.HostAliases,
				DNSPolicy:                     dnsPolicy,
				DNSConfig:                     t.Spec.DNSConfig,
				PodSecurityContext:            podSecurity,
				SecurityContext:               nonEmptySecurity(c.SecurityContext),
				NoServiceLinks:                t.Spec.EnableServiceLinks != nil && !*t.Spec.EnableServiceLinks,
				Lifecycle:                     c.Lifecycle,
				ImagePullPolicy:               nonDefaultPullPolicy(c),
				Volumes:                       volumes,
				VolumeMounts:                  c.VolumeMounts,
				ImagePullSecrets:              t.Spec.ImagePullSecrets,
				SharePIDs:                     t.Spec.ShareProcessNamespace != nil && *t.Spec.ShareProcessNamespace,
			}
			if several {
				rs.Name, rs.Init, rs.RestartPolicy = c.Name, init, c.RestartPolicy
			}
			specs = append(specs, rs)
		}
		for _, c := range t.Spec.InitContainers {
			add(c, true)
		}
		for _, c := range t.Spec.Containers {
			add(c, false)
		}
	}
	// json.Marshal of these types cannot fail: no channels, funcs or
	// non-finite floats, and Quantity marshals to its canonical string.
	js, err := json.Marshal(specs)
	if err != nil {
		panic("manifest: SpecHash: " + err.Error())
	}
	sum := sha256.Sum256(js)
	return hex.EncodeToString(sum[:4])
}

// hashVolumes is volumes as the hash takes them: what the API server
// fills in left out (the default file mode 0644 of configMap, secret,
// downwardAPI and projected volumes, hostPath's type "", downward API
// fields' apiVersion v1), so a template written with it (kubectl get -o
// yaml) and one without hash alike.
func hashVolumes(volumes []corev1.Volume) []corev1.Volume {
	if len(volumes) == 0 {
		return nil
	}
	out := make([]corev1.Volume, len(volumes))
	for i, v := range volumes {
		v = *v.DeepCopy()
		if v.HostPath != nil && v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathUnset {
			v.HostPath.Type = nil
		}
		if v.DownwardAPI != nil {
			clearFieldVersions(v.DownwardAPI.Items)
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.DownwardAPI != nil {
					clearFieldVersions(s.DownwardAPI.Items)
				}
			}
		}
		for _, m := range []**int32{
			modeOf(v.ConfigMap != nil, func() **int32 { return &v.ConfigMap.DefaultMode }),
			modeOf(v.Secret != nil, func() **int32 { return &v.Secret.DefaultMode }),
			modeOf(v.DownwardAPI != nil, func() **int32 { return &v.DownwardAPI.DefaultMode }),
			modeOf(v.Projected != nil, func() **int32 { return &v.Projected.DefaultMode }),
		} {
			if m != nil && *m != nil && **m == 0o644 {
				*m = nil
			}
		}
		out[i] = v
	}
	return out
}

// clearFieldVersions leaves out the apiVersion v1 (the default) of the
// fields of downward API files (changed in place: the caller's copy).
func clearFieldVersions(items []corev1.DownwardAPIVolumeFile) {
	for i := range items {
		if f := items[i].FieldRef; f != nil && f.APIVersion == "v1" {
			f.APIVersion = ""
		}
	}
}

// modeOf is the address of a volume source's defaultMode (f) when the
// source is set, else nil.
func modeOf(set bool, f func() **int32) **int32 {
	if !set {
		return nil
	}
	return f()
}

// nonDefaultPullPolicy is c's imagePullPolicy, or "" when it is the
// default for c's image.
func nonDefaultPullPolicy(c corev1.Container) corev1.PullPolicy {
	if c.ImagePullPolicy == defaultPullPolicy(c.Image) {
		return ""
	}
	return c.ImagePullPolicy
}

// nonEmptySecurity is sc, or nil when it sets nothing (or only
// privileged: false, as kubectl prints it).
func nonEmptySecurity(sc *corev1.SecurityContext) *corev1.SecurityContext {
	if sc == nil {
		return nil
	}
	c := *sc
	if c.Privileged != nil && !*c.Privileged {
		c.Privileged = nil
	}
	if reflect.ValueOf(c).IsZero() {
		return nil
	}
	return &c
}
