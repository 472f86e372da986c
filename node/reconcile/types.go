// Package reconcile decides what a node must do to its containers. It is
// the pure core of the node agent: Plan takes the desired replicas and the
// containers observed in the runtime and returns actions; it does no I/O,
// keeps no memory between calls and reads no clock (now is an argument),
// so every decision can be tested without root, containerd or a network.
//
// The runtime edge (node/runtime) observes containers from containerd
// labels and executes the actions; the agent (node) runs Plan on every
// change of desired state and every resync period.
package reconcile

import (
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/starling-orchestrator/starling/node/api"
)

// Port is one container port.
type Port struct {
	Name          string `json:"name,omitempty"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"` // "TCP" or "UDP"
}

// Spec is what a replica's containers run. It is derived from the pod
// template and never changes for a given SpecHash. Its container fields
// are the first app container's (containers[0]); Init and Containers
// hold the others, of which only the container fields count (a pod's
// volumes, host name, DNS, grace period and labels are this Spec's).
type Spec struct {
	// Name is the container's name (containers[].name; "" in a Spec
	// made before pods had several containers).
	Name  string `json:"name,omitempty"`
	Image string `json:"image"`
	// Sidecar marks an init container with restartPolicy Always (a
	// native sidecar): it starts before the app containers, runs beside
	// them, restarts as they do and stops after them.
	Sidecar bool `json:"sidecar,omitempty"`
	// Init are the pod's initContainers, in order: each runs to
	// completion (a Sidecar: until it runs) before the next starts, and
	// the app containers start after the last. Containers are the app
	// containers after the first.
	Init       []Spec `json:"init,omitempty"`
	Containers []Spec `json:"containers,omitempty"`
	// SharePIDs is shareProcessNamespace: the containers share one PID
	// namespace (node/pidns), each seeing the others' processes.
	SharePIDs bool `json:"sharePIDs,omitempty"`
	// PullPolicy is the container's imagePullPolicy: "Always",
	// "IfNotPresent" or "Never" ("": IfNotPresent); see
	// runtime.EnsureImage.
	PullPolicy string `json:"pullPolicy,omitempty"`
	// PullSecrets are the pod's imagePullSecrets: Secrets of the
	// replica's namespace whose registry credentials a pull from a
	// registry uses (PullCreds).
	PullSecrets []string `json:"pullSecrets,omitempty"`
	Command     []string `json:"command,omitempty"` // replaces the image entrypoint when set
	Args        []string `json:"args,omitempty"`    // replaces the image cmd when set
	Env         []EnvVar `json:"env,omitempty"`     // in order; later may refer to earlier ($(NAME))
	// EnvFrom are the container's envFrom sources, in order (their
	// variables come before Env's, which win over them).
	EnvFrom []EnvFrom `json:"envFrom,omitempty"`
	Ports   []Port    `json:"ports,omitempty"`
	// WorkingDir overrides the image's working directory when set.
	WorkingDir string `json:"workingDir,omitempty"`
	// CPUMillis is the CPU limit in thousandths of a core (0: none).
	CPUMillis int64 `json:"cpuMillis,omitempty"`
	// CPURequestMillis sets the CPU weight (cgroup shares) (0: default).
	CPURequestMillis int64 `json:"cpuRequestMillis,omitempty"`
	// MemoryBytes is the memory limit in bytes (0: none).
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// MemoryRequestBytes is the memory request in bytes, used by
	// placement (0: none).
	MemoryRequestBytes int64 `json:"memoryRequestBytes,omitempty"`
	// GracePeriod is how long a stop waits after SIGTERM before SIGKILL.
	GracePeriod time.Duration `json:"gracePeriod"`
	// Hostname is the container's host name (the pod template's
	// hostname; the replica's name when empty); with Subdomain the
	// replica's /etc/hosts also names it
	// <hostname>.<subdomain>.<namespace>.svc.<cluster domain>.
	Hostname, Subdomain string
	// HostAliases are extra /etc/hosts entries (hostAliases).
	HostAliases []HostAlias
	// DNSPolicy is the pod's dnsPolicy ("ClusterFirst", "Default",
	// "None"; "" is ClusterFirst) and DNSConfig its dnsConfig (nil: none).
	DNSPolicy string
	DNSConfig *DNSConfig
	// Security is the container's securityContext over the pod's.
	Security Security
	// NoServiceLinks is enableServiceLinks: false: the container gets no
	// Service variables (Replica.ServiceEnv).
	NoServiceLinks bool
	// PostStart and PreStop are the container's lifecycle hooks (nil:
	// none).
	PostStart, PreStop *Hook
	// Volumes are the pod's volumes, Mounts the container's mounts of
	// them (volumes.go).
	Volumes []Volume
	Mounts  []Mount
	// Labels and Annotations are the pod template's (the downward API).
	Labels, Annotations map[string]string
}

// Hook is a lifecycle handler, as the kubelet runs them: exactly one of
// Exec (argv run in the container, exit 0 is success), HTTPGet and Sleep.
type Hook struct {
	Exec    []string      `json:"exec,omitempty"`
	HTTPGet *HTTPGetHook  `json:"httpGet,omitempty"`
	Sleep   time.Duration `json:"sleep,omitempty"`
}

// HTTPGetHook is a GET to Scheme://Host:Port Path (Host "" is the pod's
// address); a 2xx or 3xx answer is success.
type HTTPGetHook struct {
	HTTPS   bool         `json:"https,omitempty"`
	Host    string       `json:"host,omitempty"`
	Port    int32        `json:"port"`
	Path    string       `json:"path,omitempty"`
	Headers []HTTPHeader `json:"headers,omitempty"`
}

// HTTPHeader is one header of an HTTPGetHook.
type HTTPHeader struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Security is what a replica's securityContext asks of its sandbox
// (package runtime applies it over CRI's defaults).
type Security struct {
	// RunAsUser and RunAsGroup replace the image's user and group.
	RunAsUser, RunAsGroup *int64
	// RunAsNonRoot refuses to start the container as UID 0.
	RunAsNonRoot bool
	// ReadOnlyRootFilesystem mounts the image's filesystem read-only.
	ReadOnlyRootFilesystem bool
	// AllowPrivilegeEscalation false (and nil, the default) sets
	// no_new_privs.
	AllowPrivilegeEscalation *bool
	// CapAdd and CapDrop change the default capabilities (names without
	// "CAP_"; "ALL" in CapDrop drops every one).
	CapAdd, CapDrop []string
	// Seccomp is "RuntimeDefault" ("" too) or "Unconfined".
	Seccomp string
	// FSGroup is the pod's fsGroup: a supplementary group of the
	// container, and the group of its writable and projected volumes.
	FSGroup *int64
}

// HostAlias is one hostAliases entry: IP and the names it answers to.
type HostAlias struct {
	IP        string
	Hostnames []string
}

// DNSConfig is a pod's dnsConfig: nameservers (IP addresses), search
// domains and resolver options ("ndots" with Value "2", "edns0" alone).
type DNSConfig struct {
	Nameservers, Searches []string
	Options               []DNSOption
}

// DNSOption is one resolv.conf option; Value nil for a bare option.
type DNSOption struct {
	Name  string
	Value *string
}

// EnvVar is one environment variable of a container, as the pod
// template gives it: a value, (FieldPath set) a downward API field
// ("status.podIP", ...; manifest.EnvFieldPaths) filled in at create, or
// (ConfigMap or Secret set) a key of a ConfigMap or Secret of the
// replica's namespace, resolved before create (ResolveEnv). Value may
// hold $(NAME) references, expanded at create by the kubelet's rules,
// unless Literal: a ConfigMap's or Secret's value is taken as it is.
type EnvVar struct {
	Name      string `json:"name"`
	Value     string `json:"value,omitempty"`
	FieldPath string `json:"fieldPath,omitempty"`
	// ConfigMap or Secret names the object of a configMapKeyRef or
	// secretKeyRef, Key its key; Optional: a missing object or key
	// leaves the variable unset instead of holding the replica back.
	ConfigMap string `json:"configMap,omitempty"`
	Secret    string `json:"secret,omitempty"`
	Key       string `json:"key,omitempty"`
	Optional  bool   `json:"optional,omitempty"`
	Literal   bool   `json:"-"`
	// Resource names a limit the container does not set
	// ("limits.cpu", "limits.memory": a resourceFieldRef), whose value is
	// then the node's allocatable, divided by DivisorMilli (thousandths
	// of the divisor: 1000 for "1", 1 for "1m"), rounded up, as the
	// kubelet gives it.
	Resource     string `json:"resource,omitempty"`
	DivisorMilli int64  `json:"divisorMilli,omitempty"`
}

// Allocatable is what a node offers its replicas: thousandths of a CPU
// core and bytes of memory (zero: unknown).
type Allocatable struct {
	MilliCPU, MemoryBytes int64
}

// value is the value of a resourceFieldRef to limit resource
// ("limits.cpu", "limits.memory") that a container does not set: a's,
// divided by divisorMilli (ResourceValue).
func (a Allocatable) value(resource string, divisorMilli int64) string {
	q := a.MemoryBytes * 1000
	if resource == "limits.cpu" {
		q = a.MilliCPU
	}
	return ResourceValue(q, divisorMilli)
}

// ResourceValue is the value of a resourceFieldRef: quantityMilli
// (thousandths of cores, or of bytes) divided by divisorMilli, rounded
// up; the kubelet's ExtractContainerResourceValue.
func ResourceValue(quantityMilli, divisorMilli int64) string {
	if divisorMilli <= 0 {
		divisorMilli = 1000
	}
	return strconv.FormatInt((quantityMilli+divisorMilli-1)/divisorMilli, 10)
}

// EnvFrom is one envFrom source: every key of a ConfigMap or Secret of
// the replica's namespace as a variable, named Prefix+key.
type EnvFrom struct {
	ConfigMap, Secret, Prefix string
	Optional                  bool
}

// Replica is one desired replica on this node.
type Replica struct {
	// ID is the container ID in containerd, unique on the node:
	// "<namespace>_<name>".
	ID string
	// Name is the replica name shown to users: "<workload>-<specHash>-<ordinal>".
	Name      string
	Namespace string
	Workload  string // Deployment name
	// UID is the Deployment object's UID ("" for an object stored before
	// Starling gave UIDs, and for StatefulSets, whose ordinals are one
	// copy whatever the object).
	UID      string
	Ordinal  int
	SpecHash string // 8 hex chars, see manifest.SpecHash
	Spec     Spec
	// AtMostOne marks a StatefulSet replica: its name has no spec hash
	// (a new spec replaces the container under the same ID), there is no
	// make-before-break handoff, and the node runs it only while fenced
	// in (see node's quorum rule).
	AtMostOne bool
	// ServiceEnv are the Service variables the container gets
	// (<NAME>_SERVICE_HOST, ...; enableServiceLinks), filled in by the
	// agent when it creates the container. Not part of Spec: as in
	// Kubernetes, a Service created or changed later restarts nothing.
	ServiceEnv []EnvVar
	// PullCreds are the registry credentials of the Secrets of
	// Spec.PullSecrets, by registry host, filled in with ServiceEnv
	// (RegistryCreds). Never written anywhere.
	PullCreds map[string]RegistryCred `json:"-"`
	// Files are the files of the replica's configMap, secret,
	// downwardAPI and projected volumes, by volume name, filled in with
	// ServiceEnv (ProjectVolume).
	Files map[string][]File
	// HostIP is this node's address (the field path "status.hostIP"), filled in with
	// ServiceEnv.
	HostIP string
}

// State is the lifecycle state of an observed container's task.
type State string

// Container task states, as read from containerd.
const (
	// StateCreated: the container exists but its task was never started
	// (or the agent died between creating and starting it).
	StateCreated State = "Created"
	StateRunning State = "Running"
	// StateExited: the task ran and stopped (crash, kill, exit).
	StateExited State = "Exited"
	// StateUnknown: containerd could not say (paused, shim gone, ...).
	StateUnknown State = "Unknown"
)

// Container is one managed container as observed in the runtime. Every
// field but Unhealthy is rebuilt from containerd (labels and task status),
// never from the agent's memory, so a restarted agent sees exactly what is
// there.
type Container struct {
	ID   string
	Name string
	// ContainerName is the pod template's name of this container ("" on
	// a container made before pods had several); Members are the
	// replica's other containers (its init containers, its app
	// containers after the first), each with its own state, restarts
	// and backoff, in no order. The replica's container, the one with
	// its ID, holds its sandbox (PodIP) and is the first app container.
	ContainerName string
	Members       []Container
	// Init marks a member that is an init container, Sidecar one that is
	// a native sidecar (runtime's LabelRole).
	Init, Sidecar bool
	// Claims are the PersistentVolumeClaims the replica mounts
	// ("namespace/name", as made at create; nil for a container made
	// before they were recorded).
	Claims    []string
	Namespace string
	Workload  string
	UID       string // the object's, as Replica.UID
	Ordinal   int
	SpecHash  string
	State     State
	// PodIP is the address CNI gave the replica; empty means the sandbox
	// setup did not finish (the agent died half-way), so it is rebuilt.
	PodIP string
	// OutsideSubnet: PodIP lies outside the node's pod subnet, which
	// moved since the sandbox was set up (net/ipam.Displaced); no peer
	// routes that address here any more, so it is rebuilt.
	OutsideSubnet bool
	// Evicted says why the replica is evicted (an emptyDir over its
	// sizeLimit): it is replaced by a fresh copy, its volumes new.
	Evicted string
	// Restarts counts restarts since creation (shown to users).
	Restarts int
	// BackoffStep counts consecutive quick crashes: the next restart waits
	// Backoff(BackoffStep).
	BackoffStep int
	StartedAt   time.Time // last task start
	CreatedAt   time.Time // when the container was created (kubectl's AGE)
	ExitedAt    time.Time // last task exit (StateExited only)
	ExitCode    uint32
	// OOMKilled: the exited run was killed by the kernel's OOM killer.
	OOMKilled bool
	// Last is the run before the current one, if it ended (kubectl's
	// Last State); nil for a container never restarted.
	Last        *api.Termination
	GracePeriod time.Duration
	// StopReason says why the agent stopped the last run ("liveness probe
	// failed: HTTP 500"); empty when it ended by itself or still runs.
	StopReason string

	// Unhealthy is the one field not read from containerd: the agent's
	// prober sets it on a running container whose liveness or startup
	// probe failed, to the reason. Plan stops such a container, which is
	// then restarted like a crashed one.
	Unhealthy string
}

// Terminated returns how a run that started at started and exited at
// finished with exit status code ended; oom says the OOM killer killed it.
func Terminated(code uint32, oom bool, started, finished time.Time) api.Termination {
	t := api.Termination{ExitCode: int(code), StartedAt: started, FinishedAt: finished}
	if code > 128 && code <= 128+64 {
		t.Signal = int(code) - 128
	}
	switch {
	case oom:
		t.Reason = "OOMKilled"
	case code == 0:
		t.Reason = "Completed"
	default:
		t.Reason = "Error"
	}
	return t
}

// PodUID is the UID a replica's pod shows (the field path
// "metadata.uid"): a name-based UUID (RFC 4122 version 5) of its
// object's UID, namespace, name and spec hash, the same for the life of
// one replica's copy, another for a new one.
func PodUID(r Replica) string {
	return uuid.NewSHA1(uuid.NameSpaceOID, []byte("starling/"+r.UID+"/"+r.Namespace+"/"+r.Name+"/"+r.SpecHash)).String()
}
