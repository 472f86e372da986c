package e2e

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/test/harness"
)

// TestImagePullSecretsPullFromAPrivateRegistry: an image that no node
// holds lives only in a private registry on the LAN (basic auth, plain
// HTTP allowed by --insecure-registry). A Deployment without
// imagePullSecrets waits with a REASON saying the registry asked for
// credentials (containerd's "authorization failed");
// with a kubernetes.io/dockerconfigjson Secret in imagePullSecrets it
// pulls and runs. The credentials never show in get or the agent's log.
func TestImagePullSecretsPullFromAPrivateRegistry(t *testing.T) {
	t.Parallel()
	reg := harness.LANPrefix + ".254:5000"
	const user, password = "puller", "reg-pass-5521"
	c := newCluster(t, 1, "--insecure-registry", reg)
	n1 := c.Nodes[0]
	srv, err := harness.ServeRegistry(c.LAN, reg, user, password)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	image := reg + "/private/echo:v1"
	if err := harness.PushImage(c.LAN, echoV1Tar, image, user, password); err != nil {
		t.Fatalf("push to the test registry: %v", err)
	}
	const ns = "privreg"
	app := echoApp("private", 1, "")
	app.Namespace, app.Image = ns, image
	apply(t, n1, app.Deployment())
	waitFor(t, 60*time.Second, func() error {
		all, err := replicas(n1)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Workload == "private" && strings.Contains(r.Reason, "authorization failed") {
				t.Logf("without imagePullSecrets: %s %s", r.Phase, r.Reason)
				return nil
			}
		}
		return fmt.Errorf("no replica says the registry refused it: %+v", all)
	})

	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg, base64.StdEncoding.EncodeToString([]byte(user+":"+password)))
	apply(t, n1, "apiVersion: v1\nkind: Secret\nmetadata: {name: regcred, namespace: "+ns+"}\ntype: kubernetes.io/dockerconfigjson\n"+
		"data: {.dockerconfigjson: "+base64.StdEncoding.EncodeToString([]byte(cfg))+"}\n")
	apply(t, n1, app.Deployment(func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
	}))
	reps, took := waitRunning(t, n1, "private", 1, 90*time.Second)
	t.Logf("with imagePullSecrets: %s runs %v after the apply", reps[0].Name, took.Round(100*time.Millisecond))
	for _, args := range [][]string{{"get", "secret", "regcred", "-n", ns, "-o", "yaml"}, {"describe", "deployment", "private", "-n", ns}} {
		if out, _ := n1.CLI(args...); strings.Contains(out, password) {
			t.Errorf("%v shows the registry password:\n%s", args, out)
		}
	}
	if strings.Contains(logOf(t, n1), password) {
		t.Error("the agent's log holds the registry password")
	}
}
