package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/test/harness"
)

// fakeUpstream is a resolver in the LAN namespace, as a home router is:
// every name under example.com has 192.0.2.7 (TTL 30 s) and no other
// record (NODATA), every other name none (NXDOMAIN), negative answers
// with an SOA (negative TTL 30 s); it counts the queries it gets by name
// and type ("www.example.com./A").
type fakeUpstream struct {
	mu   sync.Mutex
	asks map[string]int
}

func (u *fakeUpstream) count(name, qtype string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.asks[dns.Fqdn(name)+"/"+qtype]
}

func startFakeUpstream(t *testing.T, lan string) *fakeUpstream {
	t.Helper()
	pc, err := harness.ListenPacketIn(lan, harness.LANPrefix+".254:53")
	if err != nil {
		t.Fatal(err)
	}
	u := &fakeUpstream{asks: map[string]int{}}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		q := r.Question[0]
		u.mu.Lock()
		u.asks[strings.ToLower(q.Name)+"/"+dns.TypeToString[q.Qtype]]++
		u.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(r)
		soa := &dns.SOA{Hdr: dns.RR_Header{Name: "example.com.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 30},
			Ns: "ns.example.com.", Mbox: "hostmaster.example.com.", Serial: 1, Refresh: 3600, Retry: 600, Expire: 86400, Minttl: 30}
		switch {
		case strings.HasSuffix(strings.ToLower(q.Name), "example.com.") && q.Qtype == dns.TypeA:
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(192, 0, 2, 7)}}
		case strings.HasSuffix(strings.ToLower(q.Name), "example.com."):
			m.Ns = []dns.RR{soa}
		default:
			m.Rcode, m.Ns = dns.RcodeNameError, []dns.RR{soa}
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return u
}

// TestServiceNamesResolveFromPods: from a pod, with the Kubernetes DNS
// schema, as a program resolves them (its resolv.conf: the node's DNS,
// the search path, ndots:5): a Service's full and short names (its
// ClusterIP), a headless Service of a StatefulSet (3 endpoints on two
// nodes), an ordinal by name (db-0.db), an SRV lookup, an ExternalName
// (a CNAME, its target from upstream), and an outside name, which the
// node asks its upstream (a resolver in the LAN namespace) once per TTL
// however often pods ask, its search-path misses never. A deleted
// Service is gone from answers within 1.5 s of the delete. The agent of
// the pod's node is killed and restarted while the pod resolves names
// every 100 ms: no lookup fails.
func TestServiceNamesResolveFromPods(t *testing.T) {
	t.Parallel()
	resolvConf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolvConf, []byte("nameserver "+harness.LANPrefix+".254\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 2, "--resolv-conf", resolvConf)
	n1 := c.Nodes[0]
	up := startFakeUpstream(t, c.LAN)
	for _, n := range c.Nodes {
		importEcho(t, n)
	}
	waitReadyNodes(t, n1, 2)
	const ns = "dnsnames"
	httpPort := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}
	hello := echoApp("hello", 2, "")
	hello.Namespace = ns
	db := echoApp("db", 3, "")
	db.Namespace = ns
	client := echoApp("client", 1, "")
	client.Namespace = ns
	apply(t, n1, hello.Deployment()+"---\n"+hello.Service("hello", httpPort)+"---\n"+
		db.StatefulSet("db")+"---\n"+db.Service("db", []corev1.ServicePort{{Name: "http", Port: 8080}}, func(s *corev1.ServiceSpec) { s.ClusterIP = corev1.ClusterIPNone })+"---\n"+
		client.Deployment(func(d *appsv1.Deployment) {})+"---\n"+
		"apiVersion: v1\nkind: Service\nmetadata: {name: search, namespace: "+ns+"}\nspec: {type: ExternalName, externalName: search.example.com}\n")
	hellos, _ := waitRunning(t, n1, "hello", 2, 90*time.Second)
	dbs, _ := waitRunning(t, n1, "db", 3, 120*time.Second)
	clients, _ := waitRunning(t, n1, "client", 1, 90*time.Second)
	pod := clients[0]
	// Each node's DNS server started once: it listens on the bridge's
	// address before the first pod gives the bridge that address, not
	// failing and started again at each view change until then.
	for _, n := range c.Nodes {
		log, _ := os.ReadFile(n.AgentLogPath())
		if k := strings.Count(string(log), "started the node's DNS server"); k != 1 {
			t.Errorf("%s started its DNS server %d times, want once", n.Name, k)
		}
	}
	resolve := func(name, typ string) (string, error) {
		body, err := harness.HTTPGet(n1.NetNS, "http://"+pod.PodIP+":8080/resolve?name="+url.QueryEscape(name)+"&type="+typ, 12*time.Second)
		return strings.TrimSpace(body), err
	}
	out, err := n1.CLI("get", "services", "-n", ns, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var svcs struct {
		Items []corev1.Service `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &svcs); err != nil {
		t.Fatal(err)
	}
	clusterIP := ""
	for _, s := range svcs.Items {
		if s.Name == "hello" {
			clusterIP = s.Spec.ClusterIP
		}
	}
	if clusterIP == "" {
		t.Fatalf("hello has no ClusterIP: %s", out)
	}
	resolv, err := harness.HTTPGet(n1.NetNS, "http://"+pod.PodIP+":8080/etc?name=resolv.conf", 2*time.Second)
	if err != nil || !strings.Contains(resolv, "search "+ns+".svc.cluster.local svc.cluster.local cluster.local") || !strings.Contains(resolv, "options ndots:5") {
		t.Fatalf("the pod's resolv.conf: %q %v", resolv, err)
	}
	var ips []string
	var db0 string
	for _, r := range dbs {
		ips = append(ips, r.PodIP)
		if strings.HasSuffix(r.Name, "-0") {
			db0 = r.PodIP
		}
	}
	podName := strings.ReplaceAll(hellos[0].PodIP, ".", "-") + "." + ns + ".pod.cluster.local"
	want := map[string]func(string) bool{
		"hello." + ns + ".svc.cluster.local/A": func(s string) bool { return s == clusterIP },
		"hello/A":                              func(s string) bool { return s == clusterIP },
		"db/A":                                 func(s string) bool { return sameSet(s, ips) },
		"db-0.db/A":                            func(s string) bool { return s == db0 },
		"_http._tcp.db." + ns + ".svc.cluster.local/SRV": func(s string) bool {
			return strings.Count(s, ":8080") == 3 && strings.Contains(s, "db-0.db."+ns+".svc.cluster.local.:8080")
		},
		"search/CNAME": func(s string) bool { return s == "search.example.com." },
		"search/A":     func(s string) bool { return s == "192.0.2.7" },
		// Pod records: a pod's name by its address in its namespace, the
		// PTR of its address (a headless Service's endpoint's by hostname).
		podName + "/A":           func(s string) bool { return s == hellos[0].PodIP },
		hellos[0].PodIP + "/PTR": func(s string) bool { return s == podName+"." },
		db0 + "/PTR":             func(s string) bool { return s == "db-0.db."+ns+".svc.cluster.local." },
	}
	for q, ok := range want {
		name, typ, _ := strings.Cut(q, "/")
		var got string
		if _, err := eventually(30*time.Second, func() error {
			var err error
			if got, err = resolve(name, typ); err != nil || !ok(got) {
				return fmt.Errorf("%s %s: %q %v", name, typ, got, err)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	// Pods verified: the name of a pod's address in another namespace is
	// not there.
	if got, err := resolve(strings.Replace(podName, "."+ns+".", ".default.", 1), "A"); err == nil || !strings.Contains(got, "no such host") {
		t.Errorf("a pod's address under another namespace resolved: %q %v", got, err)
	}
	for range 5 {
		if got, err := resolve("www.example.com", "A"); err != nil || got != "192.0.2.7" {
			t.Errorf("www.example.com: %q %v", got, err)
		}
	}
	for _, qtype := range []string{"A", "AAAA"} {
		if n := up.count("www.example.com", qtype); n != 1 {
			t.Errorf("5 lookups of www.example.com asked the upstream %d times for %s, want 1 (its TTL is 30 s)", n, qtype)
		}
	}
	for _, miss := range []string{"www.example.com." + ns + ".svc.cluster.local", "www.example.com.svc.cluster.local", "www.example.com.cluster.local"} {
		if n := up.count(miss, "A") + up.count(miss, "AAAA"); n != 0 {
			t.Errorf("the search-path miss %s went upstream %d times", miss, n)
		}
	}

	// starling dns lookup: as a pod of the namespace, through the node's DNS.
	if out, err := n1.CLI("dns", "lookup", "db-0.db", "-n", ns, "--from", pod.Name); err != nil ||
		!strings.Contains(out, "tried db-0.db."+ns+".svc.cluster.local.") || !strings.Contains(out, "A "+db0) {
		t.Errorf("dns lookup db-0.db: %v\n%s", err, out)
	}
	if out, err := n1.CLI("dns", "lookup", "nosuch", "-n", ns); err == nil || !strings.Contains(out+err.Error(), "NXDOMAIN") {
		t.Errorf("dns lookup of a name that is not there: %v\n%s", err, out)
	}
	// --from a replica of the other node: that node's DNS answers.
	var away *replica
	for _, r := range append(append(hellos, dbs...), clients...) {
		if r.Node != n1.Name {
			away = &r
		}
	}
	if away == nil {
		t.Errorf("no replica runs on a node but %s", n1.Name)
	} else if out, err := n1.CLI("dns", "lookup", "hello", "-n", ns, "--from", away.Name); err != nil ||
		!strings.Contains(out, "(node "+away.Node+")") || !strings.Contains(out, "tried hello."+ns+".svc.cluster.local.") || !strings.Contains(out, "A "+clusterIP) {
		t.Errorf("dns lookup hello --from %s (on node %s): %v\n%s", away.Name, away.Node, err, out)
	}

	// The agent of the pod's node dies and comes back while the pod
	// resolves names: its DNS server is a process of its own.
	var home *harness.Node
	for _, n := range c.Nodes {
		if n.Name == pod.Node {
			home = n
		}
	}
	var mu sync.Mutex
	var failures []string
	lookups := 0
	stop := every(100*time.Millisecond, func() {
		_, err := resolve("hello", "A")
		mu.Lock()
		defer mu.Unlock()
		lookups++
		if err != nil {
			failures = append(failures, err.Error())
		}
	})
	time.Sleep(500 * time.Millisecond)
	home.KillAgent(syscall.SIGKILL)
	time.Sleep(2 * time.Second)
	if err := home.RestartAgent(); err != nil {
		stop()
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	stop()
	mu.Lock()
	t.Logf("%d lookups across the agent's restart, %d failed", lookups, len(failures))
	if len(failures) > 0 {
		t.Errorf("lookups failed while the agent restarted: %q", failures)
	}
	mu.Unlock()

	// A deleted Service is gone from the answers.
	deleted := time.Now()
	if out, err := n1.CLI("delete", "service", "-n", ns, "hello"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	took, err := eventually(10*time.Second, func() error {
		if got, err := resolve("hello", "A"); err == nil {
			return fmt.Errorf("hello still resolves to %q", got)
		}
		return nil
	})
	t.Logf("the deleted Service was gone from the answers %v after the delete returned (%v after it began)", took.Round(time.Millisecond), time.Since(deleted).Round(time.Millisecond))
	if err != nil || took > 1500*time.Millisecond {
		t.Errorf("a deleted Service answered for %v (%v), want at most 1.5 s", took, err)
	}
}

// sameSet reports whether the lines of s are the addresses want, in any
// order.
func sameSet(s string, want []string) bool {
	got := strings.Fields(s)
	if len(got) != len(want) {
		return false
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || g == w
		}
		if !found {
			return false
		}
	}
	return true
}
