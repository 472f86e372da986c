package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// podBench measures, side by side on one node, the time from `starling
// apply` to the replica Running and ready for a pod of one container
// against a pod of 3 app containers and 2 init containers with a
// ConfigMap volume and a PersistentVolumeClaim (made and bound by the
// apply), median of runs each.
func podBench(a artifacts, runs int) error {
	c, n, err := firstNode(a, "pod", "stpod", "pod1")
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := n.CLI("image", "import", a.echoTar); err != nil {
		return err
	}
	fmt.Println("Starling pod benchmark (1 node, real containerd, echo image)")
	fmt.Printf("%-62s %-34s %s\n", "pod", "apply -> Running, ready (median)", "runs")
	for k, kind := range []struct {
		what     string
		manifest func(name string) string
	}{
		{"1 container", func(name string) string { return manifest(name, 1) }},
		{"3 containers, 2 init containers, a ConfigMap volume, a claim", richPod},
		// Where the time goes: a new claim is bound after
		// volumes.ClaimSettle (2 s) without a claim held elsewhere.
		{"the same with an emptyDir for the claim", func(name string) string {
			return strings.Replace(richPod(name), "persistentVolumeClaim: {claimName: "+name+"-data}", "emptyDir: {}", 1)
		}},
	} {
		var ds []time.Duration
		for i := 0; i < runs; i++ {
			name := fmt.Sprintf("pod-%d-%d", k, i)
			start := time.Now()
			if _, err := n.CLIInput(strings.NewReader(kind.manifest(name)), "apply", "-f", "-"); err != nil {
				return err
			}
			if err := waitFor(2*time.Minute, func() (bool, error) { return availableReplica(n, name) }); err != nil {
				return fmt.Errorf("%s: %w", kind.what, err)
			}
			ds = append(ds, time.Since(start))
			if err := deleteAndWait(n, name); err != nil {
				return err
			}
		}
		fmt.Printf("%-62s %-34s %s\n", kind.what, median(ds).Round(time.Millisecond), durations(ds))
	}
	return nil
}

// availableReplica reports whether the replica of workload is Running
// and ready (every container of it).
func availableReplica(n *harness.Node, workload string) (bool, error) {
	all, err := n.Replicas()
	if err != nil {
		return false, err
	}
	for _, r := range all {
		if r.Workload == workload && r.Available() {
			return true, nil
		}
	}
	return false, nil
}

// richPod is a Deployment of one replica whose pod has two init
// containers (one writes to the claim, the next checks it), three app
// containers (echo servers on three ports) mounting a ConfigMap and the
// claim, with the ConfigMap and the claim.
func richPod(name string) string {
	return strings.NewReplacer("NAME", name, "IMAGE", harness.EchoImage).Replace(`apiVersion: v1
kind: ConfigMap
metadata: {name: NAME-conf}
data: {app.conf: "color=blue"}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: NAME-data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 16Mi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: NAME}
spec:
  replicas: 1
  strategy: {type: Recreate}
  selector: {matchLabels: {app: NAME}}
  template:
    metadata: {labels: {app: NAME}}
    spec:
      terminationGracePeriodSeconds: 2
      volumes:
      - {name: conf, configMap: {name: NAME-conf}}
      - {name: data, persistentVolumeClaim: {claimName: NAME-data}}
      initContainers:
      - {name: seed, image: IMAGE, args: [check, -write, /data/seed=1], volumeMounts: [{name: data, mountPath: /data}]}
      - {name: verify, image: IMAGE, args: [check, -exists, /data/seed], volumeMounts: [{name: data, mountPath: /data}]}
      containers:
      - name: web
        image: IMAGE
        ports: [{containerPort: 8080}]
        volumeMounts: [{name: conf, mountPath: /etc/app}, {name: data, mountPath: /data}]
      - {name: metrics, image: IMAGE, env: [{name: PORT, value: "9091"}]}
      - {name: logs, image: IMAGE, env: [{name: PORT, value: "9092"}], volumeMounts: [{name: data, mountPath: /data, readOnly: true}]}
`)
}
