package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

// TestShortImageNamesMatch: a 'docker save'-style tarball tagged with a
// short name ("echo:short") is stored under its full name
// (docker.io/library/echo:short), and a Deployment that names the image
// as users write it ("echo:short") runs on every node: on the importing
// node from its store, on the other from the peer, fetched by the full
// name. An image no node has gets an error that names it as written and
// says how to get it onto a node.
func TestShortImageNamesMatch(t *testing.T) {
	t.Parallel() // long and mostly waiting: runs beside another such test
	c := newCluster(t, 2)
	n1 := c.Nodes[0]
	waitReadyNodes(t, n1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mod, err := harness.ModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	tar := filepath.Join(t.TempDir(), "short.tar")
	if err := imagebuild.Echo(ctx, mod, "echo:short", "short", tar); err != nil {
		t.Fatal(err)
	}
	out, err := n1.CLI("image", "import", tar)
	if err != nil || !strings.Contains(out, "docker.io/library/echo:short") {
		t.Fatalf("image import: %v\n%s", err, out)
	}
	apply(t, n1, harness.App{Name: "short", Replicas: 4, Image: "echo:short", Ports: harness.Port8080}.Deployment())
	waitFor(t, 90*time.Second, func() error {
		cs := harness.TakeCensus(c.Nodes, "default", "short")
		if cs.Available != 4 || len(cs.ReadyByNode) != 2 {
			return fmt.Errorf("want 4 ready on both nodes: %v", cs.Copies)
		}
		return nil
	})
	apply(t, n1, harness.App{Name: "missing", Replicas: 1, Container: "c", Image: "nosuch:1.0"}.Deployment())
	waitFor(t, 60*time.Second, func() error {
		out, err := n1.CLI("describe", "deployment", "missing")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "image nosuch:1.0 (docker.io/library/nosuch:1.0) is not on this node") || !strings.Contains(out, "starling image import") || strings.Contains(out, "dummy://") {
			return fmt.Errorf("describe shows no clear image error yet:\n%s", out)
		}
		return nil
	})
}

// TestEnvAsTheKubeletGivesIt: downward API fields (valueFrom.fieldRef)
// and $(VAR) references in env values, by the kubelet's rules: a value
// sees the variables defined before it, "$$" escapes, an unknown
// reference stays as written. The echo server answers with its MESSAGE
// and listens on the PORT built from a reference.
func TestEnvAsTheKubeletGivesIt(t *testing.T) {
	n1 := echoNode(t)
	env := []corev1.EnvVar{harness.FieldEnv("IP", "status.podIP"), harness.FieldEnv("ME", "metadata.name"), harness.FieldEnv("NODE", "spec.nodeName")}
	env = append(env, harness.Env("HALF", "80", "PORT", "$(HALF)80", "MESSAGE", "ip=$(IP) me=$(ME) node=$(NODE) lit=$$(ME) unknown=$(NOPE)")...)
	apply(t, n1, harness.App{Name: "env", Replicas: 1, Env: env, Ports: harness.Port8080}.Deployment())
	var r replica
	waitFor(t, 60*time.Second, func() error {
		items, err := apiReplicas(n1)
		if err != nil {
			return err
		}
		for _, x := range items {
			if x.Workload == "env" && x.Phase == api.PhaseRunning && x.PodIP != "" {
				r = x
				return nil
			}
		}
		return fmt.Errorf("no running replica of env yet: %+v", items)
	})
	want := fmt.Sprintf("message=ip=%s me=%s node=n1 lit=$(ME) unknown=$(NOPE)", r.PodIP, r.Name)
	waitFor(t, 20*time.Second, func() error {
		body, err := harness.HTTPGet(n1.NetNS, "http://"+r.PodIP+":8080/", time.Second)
		if err != nil || !strings.Contains(body, want) {
			return fmt.Errorf("GET / on port 8080 (PORT=$(HALF)80): %q %v, want %q", body, err, want)
		}
		return nil
	})
}

// TestPodFilesAsTheKubeletMakesThem: a replica gets its own /etc/hosts
// (localhost, its address under its hostname and FQDN, hostAliases),
// /etc/hostname and /etc/resolv.conf (the node's resolver plus
// dnsConfig), so an exec readiness probe that talks to localhost passes.
func TestPodFilesAsTheKubeletMakesThem(t *testing.T) {
	n1 := echoNode(t)
	apply(t, n1, harness.App{Name: "files", Namespace: "podfiles", Replicas: 1, Ports: harness.Port8080,
		Readiness: harness.ExecProbe(0, "/echo", "check", "-get", "http://localhost:8080/healthz"),
		Pod: func(p *corev1.PodSpec) {
			p.Hostname, p.Subdomain = "web", "sub"
			p.HostAliases = []corev1.HostAlias{{IP: "10.9.9.9", Hostnames: []string{"db.lan"}}}
			ndots := "2"
			p.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"192.0.2.53"}, Searches: []string{"lan"},
				Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: &ndots}}}
		}}.Deployment())
	var r replica
	waitFor(t, 60*time.Second, func() error {
		items, err := apiReplicas(n1)
		if err != nil {
			return err
		}
		for _, x := range items {
			if x.Workload == "files" {
				r = x
			}
		}
		if !r.Ready {
			return fmt.Errorf("not ready (the probe talks to localhost): %+v", r)
		}
		return nil
	})
	get := func(name string) string {
		body, err := harness.HTTPGet(n1.NetNS, "http://"+r.PodIP+":8080/etc?name="+name, 2*time.Second)
		if err != nil {
			t.Fatalf("/etc/%s: %v", name, err)
		}
		return body
	}
	hosts := get("hosts")
	for _, want := range []string{"127.0.0.1\tlocalhost", r.PodIP + "\tweb.sub.podfiles.svc.cluster.local\tweb", "10.9.9.9\tdb.lan"} {
		if !strings.Contains(hosts, want) {
			t.Errorf("/etc/hosts lacks %q:\n%s", want, hosts)
		}
	}
	if h := get("hostname"); h != "web\n" {
		t.Errorf("/etc/hostname = %q, want web", h)
	}
	resolv := get("resolv.conf")
	for _, want := range []string{"nameserver 192.0.2.53", "lan", "options ndots:2"} {
		if !strings.Contains(resolv, want) {
			t.Errorf("/etc/resolv.conf lacks %q:\n%s", want, resolv)
		}
	}
	if strings.Contains(resolv, "nameserver 127.") {
		t.Errorf("/etc/resolv.conf names a loopback server (it answers only in the node's namespace):\n%s", resolv)
	}
	body, err := harness.HTTPGet(n1.NetNS, "http://"+r.PodIP+":8080/", 2*time.Second)
	if err != nil || !strings.Contains(body, "hostname=web\n") {
		t.Errorf("GET /: %q %v, want hostname=web", body, err)
	}
}
