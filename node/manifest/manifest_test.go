package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const goodDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: hello
  labels:
    app: hello
spec:
  selector:
    matchLabels:
      app: hello
  template:
    metadata:
      labels:
        app: hello
    spec:
      containers:
      - name: web
        image: nginx:1.27
        args: ["-g", "daemon off;"]
        env:
        - name: GREETING
          value: hi
        ports:
        - name: http
          containerPort: 80
        resources:
          limits:
            cpu: 500m
            memory: 128Mi
        readinessProbe:
          httpGet:
            port: http
`

const goodService = `apiVersion: v1
kind: Service
metadata:
  name: hello
spec:
  selector:
    app: hello
  ports:
  - port: 80
`

// edit returns s with old replaced by new, failing the test if old is
// missing, so a case cannot silently test the unmodified manifest.
func edit(t *testing.T, s, old, new string) string {
	t.Helper()
	if !strings.Contains(s, old) {
		t.Fatalf("edit: %q not in manifest", old)
	}
	return strings.Replace(s, old, new, 1)
}

// problemLines returns the lines of err, which must be a *ValidationError.
func problemLines(t *testing.T, err error) []string {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
	}
	lines := strings.Split(ve.Error(), "\n")
	if !slices.Equal(lines, ve.Lines()) {
		t.Errorf("Error() and Lines() disagree:\n%q\n%q", lines, ve.Lines())
	}
	return lines
}

func TestParseAppliesDeploymentDefaults(t *testing.T) {
	objs, err := Parse([]byte(goodDeployment), "hello.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 {
		t.Fatalf("got %d objects, want 1", len(objs))
	}
	o := objs[0]
	if o.Kind != KindDeployment || o.Namespace != "default" || o.Name != "hello" || o.Service != nil {
		t.Fatalf("object header = %q %q %q (service %v)", o.Kind, o.Namespace, o.Name, o.Service)
	}
	if got := o.Key(); got != "deployment/default/hello" {
		t.Errorf("Key() = %q", got)
	}
	d := o.Deployment
	quarter := intstr.FromString("25%")
	checks := []struct {
		name      string
		got, want any
	}{
		{"apiVersion", d.APIVersion, "apps/v1"},
		{"kind", d.Kind, "Deployment"},
		{"metadata.namespace", d.Namespace, "default"},
		{"spec.replicas", *d.Spec.Replicas, int32(1)},
		{"spec.strategy.type", d.Spec.Strategy.Type, appsv1.RollingUpdateDeploymentStrategyType},
		{"spec.strategy.rollingUpdate.maxUnavailable", *d.Spec.Strategy.RollingUpdate.MaxUnavailable, quarter},
		{"spec.strategy.rollingUpdate.maxSurge", *d.Spec.Strategy.RollingUpdate.MaxSurge, quarter},
		{"spec.revisionHistoryLimit", *d.Spec.RevisionHistoryLimit, int32(10)},
		{"spec.progressDeadlineSeconds", *d.Spec.ProgressDeadlineSeconds, int32(600)},
		{"restartPolicy", d.Spec.Template.Spec.RestartPolicy, corev1.RestartPolicyAlways},
		{"terminationGracePeriodSeconds", *d.Spec.Template.Spec.TerminationGracePeriodSeconds, int64(30)},
	}
	c := d.Spec.Template.Spec.Containers[0]
	checks = append(checks, []struct {
		name      string
		got, want any
	}{
		{"ports[0].protocol", c.Ports[0].Protocol, corev1.ProtocolTCP},
		{"imagePullPolicy", c.ImagePullPolicy, corev1.PullIfNotPresent},
		{"terminationMessagePath", c.TerminationMessagePath, "/dev/termination-log"},
		{"terminationMessagePolicy", c.TerminationMessagePolicy, corev1.TerminationMessageReadFile},
		{"requests.cpu (from limit)", c.Resources.Requests.Cpu().String(), "500m"},
		{"requests.memory (from limit)", c.Resources.Requests.Memory().String(), "128Mi"},
		{"readinessProbe.httpGet.path", c.ReadinessProbe.HTTPGet.Path, "/"},
		{"readinessProbe.httpGet.scheme", c.ReadinessProbe.HTTPGet.Scheme, corev1.URISchemeHTTP},
		{"readinessProbe.periodSeconds", c.ReadinessProbe.PeriodSeconds, int32(10)},
		{"readinessProbe.timeoutSeconds", c.ReadinessProbe.TimeoutSeconds, int32(1)},
		{"readinessProbe.failureThreshold", c.ReadinessProbe.FailureThreshold, int32(3)},
	}...)
	for _, ch := range checks {
		if !reflect.DeepEqual(ch.got, ch.want) {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

func TestParseAppliesServiceDefaults(t *testing.T) {
	objs, err := Parse([]byte(goodService), "svc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o := objs[0]
	if o.Key() != "service/default/hello" || o.Deployment != nil {
		t.Fatalf("got %s (deployment %v)", o.Key(), o.Deployment)
	}
	s := o.Service.Spec
	if s.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("type = %q, want ClusterIP", s.Type)
	}
	if s.SessionAffinity != corev1.ServiceAffinityNone {
		t.Errorf("sessionAffinity = %q, want None", s.SessionAffinity)
	}
	if s.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("protocol = %q, want TCP", s.Ports[0].Protocol)
	}
	if s.Ports[0].TargetPort != intstr.FromInt32(80) {
		t.Errorf("targetPort = %v, want 80 (= port)", s.Ports[0].TargetPort)
	}
	if s.InternalTrafficPolicy == nil || *s.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyCluster {
		t.Errorf("internalTrafficPolicy = %v, want Cluster", s.InternalTrafficPolicy)
	}
}

// kubectlGetDeployment is what `kubectl get deployment hello -o yaml` prints:
// server-owned fields and defaults must all be accepted.
const kubectlGetDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  annotations:
    deployment.kubernetes.io/revision: "1"
  creationTimestamp: "2024-05-01T10:00:00Z"
  generation: 3
  labels:
    app: hello
  name: hello
  namespace: shop
  resourceVersion: "12345"
  uid: 0b1c2d3e-0000-4000-8000-000000000000
spec:
  progressDeadlineSeconds: 600
  replicas: 3
  revisionHistoryLimit: 10
  selector:
    matchLabels:
      app: hello
  strategy:
    rollingUpdate:
      maxSurge: 1
      maxUnavailable: 0
    type: RollingUpdate
  template:
    metadata:
      creationTimestamp: null
      labels:
        app: hello
    spec:
      containers:
      - image: nginx
        imagePullPolicy: Always
        name: web
        ports:
        - containerPort: 80
          protocol: TCP
        resources: {}
        terminationMessagePath: /dev/termination-log
        terminationMessagePolicy: File
      dnsPolicy: ClusterFirst
      restartPolicy: Always
      schedulerName: default-scheduler
      securityContext: {}
      terminationGracePeriodSeconds: 30
status:
  availableReplicas: 3
  observedGeneration: 3
  readyReplicas: 3
  replicas: 3
  updatedReplicas: 3
`

const kubectlGetService = `apiVersion: v1
kind: Service
metadata:
  creationTimestamp: "2024-05-01T10:00:00Z"
  name: hello
  namespace: shop
  resourceVersion: "678"
  uid: 1b1c2d3e-0000-4000-8000-000000000000
spec:
  clusterIP: 10.96.12.34
  clusterIPs:
  - 10.96.12.34
  externalTrafficPolicy: Cluster
  internalTrafficPolicy: Cluster
  ipFamilies:
  - IPv4
  ipFamilyPolicy: SingleStack
  ports:
  - name: http
    nodePort: 31080
    port: 80
    protocol: TCP
    targetPort: http
  - name: metrics
    port: 9090
    protocol: UDP
    targetPort: 9090
  selector:
    app: hello
  sessionAffinity: None
  type: NodePort
status:
  loadBalancer: {}
`

func TestParseAcceptsKubectlGetOutputAndClearsServerFields(t *testing.T) {
	objs, err := Parse([]byte(kubectlGetDeployment+"---\n"+kubectlGetService), "get.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("got %d objects, want 2", len(objs))
	}
	d := objs[0].Deployment
	if objs[0].Key() != "deployment/shop/hello" {
		t.Errorf("key = %q", objs[0].Key())
	}
	if d.UID != "" || d.ResourceVersion != "" || d.Generation != 0 || !d.CreationTimestamp.IsZero() {
		t.Errorf("server-owned metadata not cleared: %+v", d.ObjectMeta)
	}
	if !reflect.DeepEqual(d.Status, appsv1.DeploymentStatus{}) {
		t.Errorf("status not cleared: %+v", d.Status)
	}
	if *d.Spec.Replicas != 3 || d.Spec.Strategy.RollingUpdate.MaxSurge.IntVal != 1 {
		t.Errorf("explicit values lost: replicas %d maxSurge %v", *d.Spec.Replicas, d.Spec.Strategy.RollingUpdate.MaxSurge)
	}
	s := objs[1].Service
	if s.Spec.Type != corev1.ServiceTypeNodePort || s.Spec.Ports[0].NodePort != 31080 || s.Spec.ClusterIP != "10.96.12.34" {
		t.Errorf("service spec = %+v", s.Spec)
	}
}

func TestParseInputShapes(t *testing.T) {
	jsonDeployment := `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"a"},
	"spec":{"selector":{"matchLabels":{"app":"a"}},"template":{"metadata":{"labels":{"app":"a"}},
	"spec":{"containers":[{"name":"c","image":"busybox:1.36","command":["sleep","3600"]}]}}}}`
	tests := []struct {
		name     string
		input    string
		wantKeys []string
	}{
		{"empty input", "", nil},
		{"only comments and separators", "# nothing\n---\n---\n# more\n", nil},
		{"leading separator and empty documents", "---\n" + goodDeployment + "---\n\n---\n" + goodService + "---\n",
			[]string{"deployment/default/hello", "service/default/hello"}},
		{"separator with trailing comment", goodDeployment + "--- # svc\n" + goodService,
			[]string{"deployment/default/hello", "service/default/hello"}},
		{"CRLF line endings", strings.ReplaceAll(goodDeployment+"---\n"+goodService, "\n", "\r\n"),
			[]string{"deployment/default/hello", "service/default/hello"}},
		{"document starting on the marker line", "--- " + goodService, []string{"service/default/hello"}},
		{"YAML directive", "%YAML 1.1\n---\n" + goodService, []string{"service/default/hello"}},
		{"byte order mark", "\xef\xbb\xbf" + goodService, []string{"service/default/hello"}},
		{"JSON", jsonDeployment, []string{"deployment/default/a"}},
		{"JSON stream", jsonDeployment + "\n" + strings.ReplaceAll(jsonDeployment, `"a"`, `"b"`),
			[]string{"deployment/default/a", "deployment/default/b"}},
		{"JSON with tab indentation", "{\n\t\"apiVersion\": \"v1\",\n\t\"kind\": \"Service\",\n\t\"metadata\": {\"name\": \"s\"},\n\t\"spec\": {\"ports\": [{\"port\": 53, \"protocol\": \"UDP\"}]}\n}",
			[]string{"service/default/s"}},
		{"List", "apiVersion: v1\nkind: List\nitems:\n- " + jsonDeployment + "\n- " + strings.ReplaceAll(jsonDeployment, `"a"`, `"b"`),
			[]string{"deployment/default/a", "deployment/default/b"}},
		{"same name in two namespaces", goodService + "---\n" + edit(t, goodService, "name: hello", "name: hello\n  namespace: other"),
			[]string{"service/default/hello", "service/other/hello"}},
		{"Recreate strategy", edit(t, goodDeployment, "spec:\n  selector", "spec:\n  strategy:\n    type: Recreate\n  selector"),
			[]string{"deployment/default/hello"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := Parse([]byte(tt.input), "in.yaml")
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, o := range objs {
				keys = append(keys, o.Key())
			}
			if !slices.Equal(keys, tt.wantKeys) {
				t.Errorf("keys = %q, want %q", keys, tt.wantKeys)
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	d := goodDeployment
	ctr := "spec.template.spec.containers[0]"
	tests := []struct {
		name  string
		input string
		want  []string // exact lines, in order
	}{
		{
			name:  "negative replicas",
			input: edit(t, d, "spec:\n  selector", "spec:\n  replicas: -1\n  selector"),
			want:  []string{`x.yaml: Deployment "hello": spec.replicas: Invalid value: -1: must be greater than or equal to 0`},
		},
		{
			name:  "container port out of range",
			input: edit(t, d, "containerPort: 80", "containerPort: 70000"),
			want:  []string{`x.yaml: Deployment "hello": ` + ctr + `.ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive`},
		},
		{
			name:  "missing image",
			input: edit(t, d, "        image: nginx:1.27\n", ""),
			want:  []string{`x.yaml: Deployment "hello": ` + ctr + `.image: Required value`},
		},
		{
			name:  "unknown kind",
			input: "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: db\n",
			want:  []string{`x.yaml: document 1 (line 1): unsupported apiVersion/kind "apps/v1 DaemonSet": supported: apps/v1 Deployment, apps/v1 StatefulSet, v1 Service, v1 ConfigMap, v1 Secret, v1 PersistentVolumeClaim, networking.k8s.io/v1 Ingress`},
		},
		{
			name: "StatefulSet with an incomplete volumeClaimTemplate",
			input: `apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  selector: {matchLabels: {app: db}}
  podManagementPolicy: Sometimes
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: db, image: busybox}]
  volumeClaimTemplates: [{metadata: {name: data}}]
`,
			want: []string{
				`x.yaml: StatefulSet "db": spec.podManagementPolicy: Unsupported value: "Sometimes": supported values: "OrderedReady", "Parallel"`,
				`x.yaml: StatefulSet "db": spec.volumeClaimTemplates[0].spec.accessModes: Required value: at least 1 access mode is required: ReadWriteOnce`,
				`x.yaml: StatefulSet "db": spec.volumeClaimTemplates[0].spec.resources.requests.storage: Required value: a size, e.g. 1Gi`,
			},
		},
		{
			name:  "old apiVersion of a known kind",
			input: edit(t, d, "apps/v1", "extensions/v1beta1"),
			want:  []string{`x.yaml: document 1 (line 1): unsupported apiVersion/kind "extensions/v1beta1 Deployment": supported: apps/v1 Deployment, apps/v1 StatefulSet, v1 Service, v1 ConfigMap, v1 Secret, v1 PersistentVolumeClaim, networking.k8s.io/v1 Ingress`},
		},
		{
			name:  "missing kind",
			input: "apiVersion: v1\nmetadata:\n  name: x\n",
			want:  []string{`x.yaml: document 1 (line 1): missing kind: supported apiVersion/kind: apps/v1 Deployment, apps/v1 StatefulSet, v1 Service, v1 ConfigMap, v1 Secret, v1 PersistentVolumeClaim, networking.k8s.io/v1 Ingress`},
		},
		{
			name: "volumes",
			input: edit(t, d, "    spec:\n      containers:", "    spec:\n      volumes:\n      - name: data\n        emptyDir: {medium: HugePages-2Mi}\n      - name: data\n        nfs: {server: x, path: /}\n"+
				"      - name: cfg\n        configMap: {items: [{key: k, path: ../etc/passwd, mode: 4095}]}\n      - name: both\n        emptyDir: {}\n        hostPath: {path: /srv}\n"+
				"      - name: host\n        hostPath: {path: srv/../x, type: Socket}\n      containers:"),
			want: []string{
				`x.yaml: Deployment "hello": spec.template.spec.volumes[0].emptyDir.medium: Unsupported value: "HugePages-2Mi": supported values: "", "Memory"`,
				`x.yaml: Deployment "hello": spec.template.spec.volumes[1].name: Duplicate value: "data"`,
				`x.yaml: Deployment "hello": spec.template.spec.volumes[2].configMap.name: Required value`,
				`x.yaml: Deployment "hello": spec.template.spec.volumes[2].configMap.items[0].path: Invalid value: "../etc/passwd": must not start with '..'`,
				`x.yaml: Deployment "hello": spec.template.spec.volumes[2].configMap.items[0].mode: Invalid value: 4095: must be a number between 0 and 0777 (octal), both inclusive`,
				`x.yaml: Deployment "hello": spec.template.spec.volumes[3]: Forbidden: may not specify more than 1 volume type`,
				`x.yaml: Deployment "hello": spec.template.spec.volumes[4].hostPath.path: Invalid value: "srv/../x": must be an absolute, clean path`,
				`x.yaml: Deployment "hello": spec.template.spec.volumes[4].hostPath.type: Unsupported value: "Socket": supported values: "", "Directory", "DirectoryOrCreate"`,
				`x.yaml: Deployment "hello": spec.template.spec.volumes[1].nfs: Forbidden: not supported by Starling yet`,
			},
		},
		{
			name:  "hostNetwork",
			input: edit(t, d, "    spec:\n      containers:", "    spec:\n      hostNetwork: true\n      containers:"),
			want:  []string{`x.yaml: Deployment "hello": spec.template.spec.hostNetwork: Forbidden: not supported by Starling yet`},
		},
		{
			name: "init containers: a probe only on a sidecar, restartPolicy only Always, names apart",
			input: edit(t, d, "    spec:\n      containers:", "    spec:\n      shareProcessNamespace: true\n      hostPID: true\n      initContainers:\n"+
				"      - name: init\n        image: busybox\n        readinessProbe:\n          exec:\n            command: [\"true\"]\n"+
				"      - name: side\n        image: busybox\n        restartPolicy: OnFailure\n"+
				"      - name: web\n        image: busybox\n        restartPolicy: Always\n        readinessProbe:\n          exec:\n            command: [\"true\"]\n"+
				"      containers:"),
			want: []string{
				`x.yaml: Deployment "hello": spec.template.spec.initContainers[0].readinessProbe: Forbidden: may not be set for init containers without restartPolicy Always`,
				`x.yaml: Deployment "hello": spec.template.spec.initContainers[1].restartPolicy: Unsupported value: "OnFailure": supported values: "Always"`,
				`x.yaml: Deployment "hello": spec.template.spec.containers[0].name: Duplicate value: "web"`,
				`x.yaml: Deployment "hello": spec.template.spec.hostPID: Forbidden: not supported by Starling yet`,
			},
		},
		{
			name:  "volumeMounts and hostPort name their exact paths",
			input: edit(t, edit(t, edit(t, d, "        - name: http\n", "        - name: http\n          hostPort: 8080\n"), "        env:\n", "        envFrom:\n        - configMapRef: {name: cfg}\n        env:\n"), "        args:", "        volumeMounts: [{name: data, mountPath: /data}]\n        args:"),
			want: []string{
				`x.yaml: Deployment "hello": ` + ctr + `.volumeMounts[0].name: Not found: "data"`,
				`x.yaml: Deployment "hello": ` + ctr + `.ports[0].hostPort: Forbidden: not supported by Starling yet`,
			},
		},
		{
			name:  "securityContext fields Starling does not apply",
			input: edit(t, d, "    spec:\n      containers:", "    spec:\n      securityContext:\n        sysctls: [{name: net.core.somaxconn, value: '1024'}]\n        seccompProfile: {type: Localhost, localhostProfile: x.json}\n      containers:"),
			want: []string{
				`x.yaml: Deployment "hello": spec.template.spec.securityContext.seccompProfile.type: Unsupported value: "Localhost": supported values: "RuntimeDefault", "Unconfined"`,
				`x.yaml: Deployment "hello": spec.template.spec.securityContext.seccompProfile.localhostProfile: Forbidden: not supported by Starling yet`,
				`x.yaml: Deployment "hello": spec.template.spec.securityContext.sysctls: Forbidden: not supported by Starling yet`,
			},
		},
		{
			name:  "container securityContext: privileged, a capability outside the allowlist, a bad user",
			input: edit(t, d, "        image: nginx:1.27", "        image: nginx:1.27\n        securityContext:\n          privileged: true\n          runAsUser: -1\n          capabilities: {add: [SYS_ADMIN], drop: [ALL]}"),
			want: []string{
				`x.yaml: Deployment "hello": ` + ctr + `.securityContext.runAsUser: Invalid value: -1: must be between 0 and 2147483647, inclusive`,
				`x.yaml: Deployment "hello": ` + ctr + `.securityContext.privileged: Forbidden: privileged containers are not supported: they can take over the node`,
				`x.yaml: Deployment "hello": ` + ctr + `.securityContext.capabilities.add[0]: Unsupported value: "SYS_ADMIN": supported values: "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"`,
			},
		},
		{
			name: "lifecycle hooks: tcpSocket, two handlers, a sleep past the grace period, a port the container lacks",
			input: edit(t, d, "        image: nginx:1.27", "        image: nginx:1.27\n        lifecycle:\n"+
				"          postStart: {tcpSocket: {port: 80}}\n"+
				"          preStop: {exec: {command: [nginx, -s, quit]}, sleep: {seconds: 40}}"),
			want: []string{
				`x.yaml: Deployment "hello": ` + ctr + `.lifecycle.preStop.sleep.seconds: Invalid value: 40: must be between 0 and terminationGracePeriodSeconds (30)`,
				`x.yaml: Deployment "hello": ` + ctr + `.lifecycle.preStop.sleep: Forbidden: may not specify more than 1 handler type`,
				`x.yaml: Deployment "hello": ` + ctr + `.lifecycle.postStart.tcpSocket: Forbidden: not supported by Starling yet`,
			},
		},
		{
			name:  "lifecycle httpGet to a port name the container lacks",
			input: edit(t, d, "        image: nginx:1.27", "        image: nginx:1.27\n        lifecycle:\n          preStop: {httpGet: {port: admin, path: /drain, host: db.local}}"),
			want: []string{
				`x.yaml: Deployment "hello": ` + ctr + `.lifecycle.preStop.httpGet.port: Invalid value: "admin": must be the name of one of the container's ports`,
				`x.yaml: Deployment "hello": ` + ctr + `.lifecycle.preStop.httpGet.host: Invalid value: "db.local": must be an IP address (Starling resolves no names for hooks); leave it out for the pod's own address`,
			},
		},
		{
			name:  "env valueFrom",
			input: edit(t, d, "          value: hi", "          valueFrom:\n            resourceFieldRef: {resource: limits.gpu}\n        - name: B\n          valueFrom:\n            secretKeyRef: {name: s, key: a/b}\n            configMapKeyRef: {name: c, key: k}\n        - name: C\n          valueFrom:\n            configMapKeyRef: {key: k}\n        envFrom:\n        - {prefix: 1X, secretRef: {name: s}}\n        - {}"),
			want: []string{
				`x.yaml: Deployment "hello": ` + ctr + `.env[0].valueFrom.resourceFieldRef.resource: Unsupported value: "limits.gpu": supported values: "limits.cpu", "limits.memory", "requests.cpu", "requests.memory"`,
				`x.yaml: Deployment "hello": ` + ctr + `.env[1].valueFrom: Invalid value: "": may not have more than one field specified at a time`,
				`x.yaml: Deployment "hello": ` + ctr + `.env[2].valueFrom.configMapKeyRef.name: Required value`,
				`x.yaml: Deployment "hello": ` + ctr + `.envFrom[1]: Required value: give configMapRef or secretRef`,
			},
		},
		{
			name:  "env fieldRef to a field Starling does not fill",
			input: edit(t, d, "          value: hi", "          valueFrom:\n            fieldRef: {fieldPath: status.phase}"),
			want:  []string{`x.yaml: Deployment "hello": ` + ctr + `.env[0].valueFrom.fieldRef.fieldPath: Unsupported value: "status.phase": supported values: "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs", "metadata.labels['KEY']", "metadata.annotations['KEY']"`},
		},
		{
			name:  "env value and valueFrom",
			input: edit(t, d, "          value: hi", "          value: hi\n          valueFrom:\n            fieldRef: {fieldPath: metadata.name}"),
			want:  []string{`x.yaml: Deployment "hello": ` + ctr + `.env[0].valueFrom: Invalid value: "": may not be specified when ` + "`value`" + ` is not empty`},
		},
		{
			name:  "selector matchExpressions",
			input: edit(t, d, "    matchLabels:\n      app: hello\n", "    matchLabels:\n      app: hello\n    matchExpressions:\n    - {key: tier, operator: Exists}\n"),
			want:  []string{`x.yaml: Deployment "hello": spec.selector.matchExpressions: Forbidden: not supported by Starling yet`},
		},
		{
			name:  "malformed YAML",
			input: goodService + "---\napiVersion: v1\nkind: Service\nmetadata: {name: [\n",
			want:  []string{`x.yaml: document 2 (line 11): invalid YAML: yaml: line 13: did not find expected node content`},
		},
		{
			name:  "duplicate key",
			input: edit(t, goodService, "  name: hello\n", "  name: hello\n  name: again\n"),
			want:  []string{`x.yaml: document 1 (line 1): invalid YAML: yaml: unmarshal errors: line 5: key "name" already set in map`},
		},
		{
			name:  "typo'd field",
			input: edit(t, d, "        image: nginx:1.27", "        image: nginx:1.27\n        imagePolicy: Always"),
			want:  []string{`x.yaml: Deployment "hello": unknown field "` + ctr + `.imagePolicy"`},
		},
		{
			name:  "field with wrong case",
			input: edit(t, goodService, "spec:", "Spec: {}\nspec:"),
			want:  []string{`x.yaml: Service "hello": unknown field "Spec"`},
		},
		{
			name:  "wrong type",
			input: edit(t, d, "spec:\n  selector", "spec:\n  replicas: three\n  selector"),
			want:  []string{`x.yaml: document 1 (line 1): spec.replicas: Invalid value: "three": must be an integer`},
		},
		{
			name:  "selector does not match template labels",
			input: edit(t, d, "      labels:\n        app: hello", "      labels:\n        app: bye"),
			want:  []string{`x.yaml: Deployment "hello": spec.template.metadata.labels: Invalid value: {"app":"bye"}: ` + "`selector` does not match template `labels`"},
		},
		{
			name:  "two problems in one document",
			input: edit(t, edit(t, d, "containerPort: 80", "containerPort: 0"), "spec:\n  selector", "spec:\n  replicas: -2\n  selector"),
			want: []string{
				`x.yaml: Deployment "hello": spec.replicas: Invalid value: -2: must be greater than or equal to 0`,
				`x.yaml: Deployment "hello": ` + ctr + `.ports[0].containerPort: Invalid value: 0: must be between 1 and 65535, inclusive`,
			},
		},
		{
			name:  "problems in two documents",
			input: edit(t, d, "spec:\n  selector", "spec:\n  replicas: -1\n  selector") + "---\n" + edit(t, goodService, "port: 80", "port: 70000"),
			want: []string{
				`x.yaml: Deployment "hello": spec.replicas: Invalid value: -1: must be greater than or equal to 0`,
				`x.yaml: Service "hello": spec.ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive`,
				`x.yaml: Service "hello": spec.ports[0].targetPort: Invalid value: 70000: must be between 1 and 65535, inclusive`,
			},
		},
		{
			name:  "typo and validation problem together",
			input: edit(t, edit(t, d, "containerPort: 80", "containerPort: 70000"), "  template:", "  tempalte: {}\n  template:"),
			want: []string{
				`x.yaml: Deployment "hello": unknown field "spec.tempalte"`,
				`x.yaml: Deployment "hello": ` + ctr + `.ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive`,
			},
		},
		{
			name:  "two containers of one name",
			input: d + "      - name: web\n        image: busybox\n",
			want:  []string{`x.yaml: Deployment "hello": spec.template.spec.containers[1].name: Duplicate value: "web"`},
		},
		{
			name:  "name too long for replica names",
			input: strings.ReplaceAll(d, "name: hello", "name: "+strings.Repeat("a", 41)),
			want:  []string{`x.yaml: Deployment "` + strings.Repeat("a", 41) + `": metadata.name: Invalid value: "` + strings.Repeat("a", 41) + `": must be no more than 40 characters because replica names are derived from it`},
		},
		{
			name:  "missing name",
			input: edit(t, d, "  name: hello\n", ""),
			want:  []string{`x.yaml: document 1 (line 1): Deployment: metadata.name: Required value: name is required`},
		},
		{
			name:  "same object twice",
			input: goodService + "---\n" + goodService,
			want:  []string{`x.yaml: Service "hello": metadata.name: Duplicate value: "hello": also defined at x.yaml document 1`},
		},
		{
			name:  "rolling update that can make no progress",
			input: edit(t, d, "spec:\n  selector", "spec:\n  strategy:\n    rollingUpdate: {maxSurge: 0, maxUnavailable: 0%}\n  selector"),
			want:  []string{`x.yaml: Deployment "hello": spec.strategy.rollingUpdate.maxUnavailable: Invalid value: "0%": may not be 0 when ` + "`maxSurge`" + ` is 0`},
		},
		{
			name:  "resource other than cpu and memory",
			input: edit(t, d, "            memory: 128Mi", "            memory: 128Mi\n            nvidia.com/gpu: 1"),
			want: []string{
				`x.yaml: Deployment "hello": ` + ctr + `.resources.limits[nvidia.com/gpu]: Unsupported value: "nvidia.com/gpu": supported values: "cpu", "memory"`,
				`x.yaml: Deployment "hello": ` + ctr + `.resources.requests[nvidia.com/gpu]: Unsupported value: "nvidia.com/gpu": supported values: "cpu", "memory"`,
			},
		},
		{
			name:  "probe on an unknown named port",
			input: edit(t, d, "            port: http", "            port: admin"),
			want:  []string{`x.yaml: Deployment "hello": ` + ctr + `.readinessProbe.httpGet.port: Invalid value: "admin": must be the name of one of the container's ports`},
		},
		{
			name:  "probe without handler",
			input: edit(t, d, "          httpGet:\n            port: http\n", "          periodSeconds: 5\n"),
			want:  []string{`x.yaml: Deployment "hello": ` + ctr + `.readinessProbe: Required value: must specify a handler type`},
		},
		{
			name:  "exec probe without a command",
			input: edit(t, d, "          httpGet:\n            port: http\n", "          exec: {command: []}\n"),
			want:  []string{`x.yaml: Deployment "hello": ` + ctr + `.readinessProbe.exec.command: Required value`},
		},
		{
			name:  "exec probe with a shell string instead of a list",
			input: edit(t, d, "          httpGet:\n            port: http\n", "          exec: {command: cat /tmp/ready}\n"),
			want:  []string{`x.yaml: document 1 (line 1): ` + ctr + `.readinessProbe.exec.command: Invalid value: "cat /tmp/ready": must be a list`},
		},
		{
			name:  "exec probe command with a number in it",
			input: edit(t, d, "          httpGet:\n            port: http\n", "          exec: {command: [sleep, 5]}\n"),
			want:  []string{`x.yaml: document 1 (line 1): ` + ctr + `.readinessProbe.exec.command[1]: Invalid value: 5: must be a string`},
		},
		{
			name: "exec and httpGet in one probe, liveness needing two successes",
			input: edit(t, d, "          httpGet:\n            port: http\n",
				"          httpGet:\n            port: http\n          exec: {command: [check]}\n        livenessProbe:\n          exec: {command: [check]}\n          successThreshold: 2\n"),
			want: []string{
				`x.yaml: Deployment "hello": ` + ctr + `.readinessProbe.httpGet: Forbidden: may not specify more than 1 handler type`,
				`x.yaml: Deployment "hello": ` + ctr + `.livenessProbe.successThreshold: Invalid value: 2: must be 1`,
			},
		},
		{
			name:  "restartPolicy other than Always",
			input: edit(t, d, "    spec:\n      containers:", "    spec:\n      restartPolicy: Never\n      containers:"),
			want:  []string{`x.yaml: Deployment "hello": spec.template.spec.restartPolicy: Unsupported value: "Never": supported values: "Always"`},
		},
		{
			name:  "invalid image reference",
			input: edit(t, d, "image: nginx:1.27", "image: Nginx:1.27"),
			want:  []string{`x.yaml: Deployment "hello": ` + ctr + `.image: Invalid value: "Nginx:1.27": must be a valid image reference: invalid reference format: repository name (library/Nginx) must be lowercase`},
		},
		{
			name:  "LoadBalancer Service with a bad address",
			input: edit(t, goodService, "spec:", "spec:\n  type: LoadBalancer\n  loadBalancerIP: 192.168.1.300"),
			want: []string{`x.yaml: Service "hello": spec.loadBalancerIP: Invalid value: "192.168.1.300": must be an IPv4 address of the nodes' LAN ` +
				"(or leave it empty to get one from the pool: `starling cluster lb-pool CIDR`)"},
		},
		{
			name:  "LoadBalancer Service asking for the broadcast address",
			input: edit(t, goodService, "spec:", "spec:\n  type: LoadBalancer\n  loadBalancerIP: 255.255.255.255"),
			want:  []string{`x.yaml: Service "hello": spec.loadBalancerIP: Invalid value: "255.255.255.255": must be a unicast address of the nodes' LAN`},
		},
		{
			name:  "loadBalancerIP without type LoadBalancer",
			input: edit(t, goodService, "spec:", "spec:\n  loadBalancerIP: 192.168.1.240"),
			want:  []string{"x.yaml: Service \"hello\": spec.loadBalancerIP: Forbidden: may only be set when `type` is 'LoadBalancer'"},
		},
		{
			name:  "LoadBalancer pool not a CIDR",
			input: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lb-pool, namespace: starling-system}\ndata: {cidr: 192.168.1.241/28}\n",
			want:  []string{`x.yaml: ConfigMap "lb-pool": data[cidr]: Invalid value: "192.168.1.241/28": must start at its network address: use 192.168.1.240/28`},
		},
		{
			name:  "headless NodePort Service",
			input: edit(t, goodService, "spec:", "spec:\n  clusterIP: None\n  type: NodePort"),
			want:  []string{`x.yaml: Service "hello": spec.type: Invalid value: "NodePort": a headless Service (clusterIP: None) must be of type ClusterIP`},
		},
		{
			name:  "IPv6 cluster IP",
			input: edit(t, goodService, "spec:", "spec:\n  clusterIP: fd00::1"),
			want:  []string{`x.yaml: Service "hello": spec.clusterIP: Invalid value: "fd00::1": must be a valid IPv4 address`},
		},
		{
			name:  "externalIPs",
			input: edit(t, goodService, "spec:", "spec:\n  externalIPs: [192.0.2.1]"),
			want:  []string{`x.yaml: Service "hello": spec.externalIPs: Forbidden: not supported by Starling yet`},
		},
		{
			name:  "Local traffic policy",
			input: edit(t, goodService, "spec:", "spec:\n  type: NodePort\n  externalTrafficPolicy: Local"),
			want: []string{"x.yaml: Service \"hello\": spec.externalTrafficPolicy: Invalid value: \"Local\": 'Local' is supported for `type` 'LoadBalancer' only " +
				"(its LAN address); use 'Cluster' for a NodePort Service"},
		},
		{
			name:  "nodePort on a ClusterIP Service",
			input: edit(t, goodService, "  - port: 80", "  - port: 80\n    nodePort: 30080"),
			want:  []string{`x.yaml: Service "hello": spec.ports[0].nodePort: Forbidden: may not be used when ` + "`type`" + ` is 'ClusterIP'`},
		},
		{
			name:  "nodePort out of range",
			input: edit(t, edit(t, goodService, "  - port: 80", "  - port: 80\n    nodePort: 8080"), "spec:", "spec:\n  type: NodePort"),
			want:  []string{`x.yaml: Service "hello": spec.ports[0].nodePort: Invalid value: 8080: must be between 30000 and 32767, inclusive`},
		},
		{
			name:  "unnamed and duplicate Service ports",
			input: edit(t, goodService, "  - port: 80\n", "  - port: 80\n  - port: 80\n  - name: a\n    port: 81\n  - name: a\n    port: 82\n    protocol: SCTP\n"),
			want: []string{
				`x.yaml: Service "hello": spec.ports[0].name: Required value`,
				`x.yaml: Service "hello": spec.ports[1].name: Required value`,
				`x.yaml: Service "hello": spec.ports[1].port: Duplicate value: 80`,
				`x.yaml: Service "hello": spec.ports[3].name: Duplicate value: "a"`,
				`x.yaml: Service "hello": spec.ports[3].protocol: Unsupported value: "SCTP": supported values: "TCP", "UDP"`,
			},
		},
		{
			name:  "scalar document",
			input: "just a string\n",
			want:  []string{`x.yaml: document 1 (line 1): want an object with apiVersion and kind, got a string`},
		},
		{
			name:  "bad item in a List",
			input: "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod}\n",
			want:  []string{`x.yaml: document 1 (line 1): items[0]: unsupported apiVersion/kind "v1 Pod": supported: apps/v1 Deployment, apps/v1 StatefulSet, v1 Service, v1 ConfigMap, v1 Secret, v1 PersistentVolumeClaim, networking.k8s.io/v1 Ingress`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := Parse([]byte(tt.input), "x.yaml")
			if err == nil {
				t.Fatalf("Parse succeeded with %d objects, want errors %q", len(objs), tt.want)
			}
			if objs != nil {
				t.Errorf("Parse returned %d objects along with the error", len(objs))
			}
			if got := problemLines(t, err); !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

func TestValidationErrorGroupsProblemsByObject(t *testing.T) {
	input := edit(t, goodDeployment, "spec:\n  selector", "spec:\n  replicas: -1\n  selector") + "---\n" + goodService + "---\nkind: Nope\n"
	_, err := Parse([]byte(input), "x.yaml")
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("got %T, want *ValidationError", err)
	}
	if len(ve.Objects) != 2 {
		t.Fatalf("got %d objects with problems, want 2 (the good Service has none)", len(ve.Objects))
	}
	first, second := ve.Objects[0], ve.Objects[1]
	if first.Kind != KindDeployment || first.Name != "hello" || first.Document != 1 || len(first.Errs) != 1 || first.Errs[0].Field != "spec.replicas" {
		t.Errorf("first = %+v", first)
	}
	if second.Document != 3 || len(second.Decoding) != 1 || len(second.Errs) != 0 {
		t.Errorf("second = %+v", second)
	}
}

func TestKeyFor(t *testing.T) {
	tests := []struct {
		kind, ns, name, want string
	}{
		{KindDeployment, "default", "hello", "deployment/default/hello"},
		{KindService, "shop", "web", "service/shop/web"},
		{KindService, "", "web", "service/default/web"},
	}
	for _, tt := range tests {
		if got := KeyFor(tt.kind, tt.ns, tt.name); got != tt.want {
			t.Errorf("KeyFor(%q, %q, %q) = %q, want %q", tt.kind, tt.ns, tt.name, got, tt.want)
		}
	}
}

// TestServerSetFieldsAreIgnoredAndNamed: a `kubectl get -o yaml` output
// applied again names the fields the API server sets (for one warning);
// a file of the user's names none.
func TestServerSetFieldsAreIgnoredAndNamed(t *testing.T) {
	objs, err := Parse([]byte(kubectlGetDeployment+"---\n"+goodService), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(objs[0].Ignored, ","); got != "metadata.uid,metadata.resourceVersion,metadata.creationTimestamp,metadata.generation,status" {
		t.Errorf("kubectl get output: ignored %s", got)
	}
	if len(objs[1].Ignored) != 0 {
		t.Errorf("a plain file: ignored %v", objs[1].Ignored)
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	objs, err := Parse([]byte(goodDeployment+"---\n"+goodService+"---\n"+kubectlGetDeployment+"---\n"+kubectlGetService), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		t.Run(o.Key(), func(t *testing.T) {
			js, err := Encode(o)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(js)
			if err != nil {
				t.Fatalf("Decode(Encode(o)): %v\n%s", err, js)
			}
			if o.Applied, o.Ignored = nil, nil; !reflect.DeepEqual(got, o) {
				t.Errorf("round trip changed the object:\n got %+v\nwant %+v", got, o)
			}
			again, err := Encode(got)
			if err != nil {
				t.Fatal(err)
			}
			if string(again) != string(js) {
				t.Errorf("encoding is not canonical:\n%s\n%s", js, again)
			}
			// Encode output parses as a manifest too.
			if _, err := Parse(js, "stored.json"); err != nil {
				t.Errorf("Parse(Encode(o)): %v", err)
			}
		})
	}
}

func TestEncodeRejectsInconsistentObjects(t *testing.T) {
	for _, o := range []Object{
		{Kind: KindDeployment, Name: "x"},
		{Kind: KindService, Name: "x"},
		{Kind: "Pod", Name: "x"},
	} {
		if _, err := Encode(o); err == nil {
			t.Errorf("Encode(%+v) succeeded", o)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	objs, err := Parse([]byte(goodService), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	good, err := Encode(objs[0])
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, input, want string
	}{
		{"empty", "", "want a JSON object, got nothing"},
		{"YAML", goodService, "want a JSON object, got something that is not JSON"},
		{"null", "null", "want a JSON object, got null"},
		{"trailing data", string(good) + "{}", "invalid character '{' after top-level value"},
		{"two objects", string(good) + string(good), "after top-level value"},
		{"List", `{"apiVersion":"v1","kind":"List","items":[]}`, `unsupported apiVersion/kind "v1 List"`},
		{"unknown field", strings.Replace(string(good), `"spec":{`, `"spec":{"bogus":1,`, 1), `unknown field "spec.bogus"`},
		{"duplicate field", strings.Replace(string(good), `"spec":{`, `"spec":{"type":"NodePort","type":"ClusterIP",`, 1), `duplicate field "spec.type"`},
		{"invalid object", strings.Replace(string(good), `"port":80`, `"port":0`, 1), `spec.ports[0].port: Invalid value: 0`},
		{"truncated", string(good[:len(good)/2]), "unexpected end of JSON input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.input))
			if err == nil {
				t.Fatal("Decode succeeded")
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Errorf("error %v is %T, want *ValidationError", err, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestReadPaths(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Names chosen so that name order differs from creation order.
	write("b-service.yml", goodService)
	write("a-deployment.yaml", goodDeployment)
	write("notes.txt", "not a manifest")
	if err := os.Mkdir(filepath.Join(dir, "nested.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	stdin := strings.NewReader(edit(t, goodService, "name: hello", "name: from-stdin"))

	objs, err := ReadPaths([]string{dir, "-"}, false, stdin)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range objs {
		keys = append(keys, o.Key())
	}
	want := []string{"deployment/default/hello", "service/default/hello", "service/default/from-stdin"}
	if !slices.Equal(keys, want) {
		t.Errorf("keys = %q, want %q", keys, want)
	}
	// -R: subdirectories too, depth first in name order.
	os.WriteFile(filepath.Join(dir, "nested.yaml", "c.yaml"), []byte(edit(t, goodService, "name: hello", "name: nested")), 0o644)
	objs, err = ReadPaths([]string{dir}, true, nil)
	keys = keys[:0]
	for _, o := range objs {
		keys = append(keys, o.Key())
	}
	if want := []string{"deployment/default/hello", "service/default/hello", "service/default/nested"}; err != nil || !slices.Equal(keys, want) {
		t.Errorf("recursive: keys = %q (%v), want %q", keys, err, want)
	}
}

func TestReadPathsCollectsErrorsFromAllInputs(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(edit(t, goodDeployment, "containerPort: 80", "containerPort: 70000")), 0o644); err != nil {
		t.Fatal(err)
	}
	dup := filepath.Join(dir, "dup.json")
	objs, err := Parse([]byte(goodService), "x")
	if err != nil {
		t.Fatal(err)
	}
	js, _ := Encode(objs[0])
	if err := os.WriteFile(dup, js, 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.yaml")

	got, err := ReadPaths([]string{bad, missing, dup, "-"}, false, strings.NewReader(goodService))
	if err == nil {
		t.Fatalf("ReadPaths succeeded with %d objects", len(got))
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error does not wrap the missing file's os.ErrNotExist: %v", err)
	}
	lines := problemLines(t, err)
	want := []string{
		bad + `: Deployment "hello": spec.template.spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive`,
		`<stdin>: Service "hello": metadata.name: Duplicate value: "hello": also defined at ` + dup + ` document 1`,
	}
	if !slices.Equal(lines, want) {
		t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(lines, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestValidateHandBuiltObjects(t *testing.T) {
	objs, err := Parse([]byte(goodDeployment), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o := objs[0]
	if errs := Validate(o); len(errs) != 0 {
		t.Fatalf("Validate(parsed object) = %v", errs)
	}

	o.Deployment = o.Deployment.DeepCopy()
	o.Deployment.Spec.Template.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("2")
	o.Deployment.Spec.Template.Spec.HostPID = true
	o.Name = "other"
	var got []string
	for _, e := range Validate(o) {
		got = append(got, e.Error())
	}
	want := []string{
		`metadata.name: Invalid value: "hello": must equal Object.Name "other"`,
		`spec.template.spec.containers[0].resources.requests[cpu]: Invalid value: "2": must be less than or equal to cpu limit of 500m`,
		`spec.template.spec.hostPID: Forbidden: not supported by Starling yet`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("Validate:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	if errs := Validate(Object{Kind: "Pod"}); len(errs) != 1 {
		t.Errorf("Validate(Pod) = %v, want one error", errs)
	}
	if errs := Validate(Object{Kind: KindService}); len(errs) != 1 {
		t.Errorf("Validate(Service without object) = %v, want one error", errs)
	}
}

func TestDecodeKeepsStoredStatefulSetMetadata(t *testing.T) {
	objs, err := Parse([]byte(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: db, image: busybox}]
`), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	st := objs[0].StatefulSet
	st.CreationTimestamp = metav1.NewTime(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	st.Generation = 3
	st.UID = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
	b, err := Encode(objs[0])
	if err != nil {
		t.Fatal(err)
	}
	o, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.StatefulSet; got.Generation != 3 || !got.CreationTimestamp.Equal(&st.CreationTimestamp) || got.UID != st.UID {
		t.Fatalf("stored metadata lost: generation %d, created %v, uid %q", got.Generation, got.CreationTimestamp, got.UID)
	}
}

// TestAnExternalNameServiceIsADNSName: type ExternalName needs a DNS name
// and takes no ClusterIP; externalName belongs to that type alone.
func TestAnExternalNameServiceIsADNSName(t *testing.T) {
	svc := func(spec string) string {
		return "apiVersion: v1\nkind: Service\nmetadata: {name: search}\nspec: " + spec + "\n"
	}
	if _, err := Parse([]byte(svc("{type: ExternalName, externalName: search.example.com}")), "s.yaml"); err != nil {
		t.Errorf("an ExternalName Service: %v", err)
	}
	for spec, want := range map[string]string{
		"{type: ExternalName}":                                               "spec.externalName: Required value",
		"{type: ExternalName, externalName: Not_A_Name}":                     "spec.externalName: Invalid value",
		"{type: ExternalName, externalName: a.example.com, clusterIP: None}": "spec.clusterIP: Forbidden",
		"{externalName: a.example.com, ports: [{port: 80}]}":                 "spec.externalName: Forbidden",
	} {
		if _, err := Parse([]byte(svc(spec)), "s.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", spec, err, want)
		}
	}
}
