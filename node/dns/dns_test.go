package dns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// testInput is a cluster of a ClusterIP Service with a named port, a
// headless Service of a StatefulSet (two ordinals, by hostname) and of
// an endpoint without one, and an ExternalName Service.
func testInput() Input {
	return Input{Domain: "cluster.local", Services: []Service{
		{Name: "hello", Namespace: "default", ClusterIP: netip.MustParseAddr("10.96.0.10"),
			Ports: []Port{{Name: "http", Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 53}}},
		{Name: "db", Namespace: "shop", Headless: true, Ports: []Port{{Name: "pg", Protocol: "TCP", Port: 5432}},
			Endpoints: []Endpoint{
				{IP: netip.MustParseAddr("10.22.1.5"), Hostname: "db-0"},
				{IP: netip.MustParseAddr("10.22.2.7"), Hostname: "db-1"},
				{IP: netip.MustParseAddr("10.22.3.9")},
			}},
		{Name: "search", Namespace: "shop", ExternalName: "search.example.com"},
	}}
}

func ask(t *testing.T, z *Zone, name string, qtype uint16) (string, int, bool) {
	t.Helper()
	answer, authority, rcode, ok := z.Answer(dns.Question{Name: dns.Fqdn(name), Qtype: qtype, Qclass: dns.ClassINET})
	var lines []string
	for _, rr := range answer {
		f := strings.Fields(rr.String())
		lines = append(lines, strings.Join(append([]string{f[3]}, f[4:]...), " "))
	}
	slices.Sort(lines)
	if len(answer) == 0 && ok && len(authority) != 1 {
		t.Errorf("%s: no answer and %d authority records, want the SOA", name, len(authority))
	}
	return strings.Join(lines, "; "), rcode, ok
}

// zoneCase is a question and the answer the zone gives: its records
// (as ask lists them) and rcode.
type zoneCase struct {
	name  string
	qtype uint16
	want  string
	rcode int
}

// expect checks that z answers each case from the zone, as it says.
func expect(t *testing.T, z *Zone, cases []zoneCase) {
	t.Helper()
	for _, tc := range cases {
		got, rcode, ok := ask(t, z, tc.name, tc.qtype)
		if !ok || got != tc.want || rcode != tc.rcode {
			t.Errorf("%s %s: %q %s (ours %v), want %q %s", tc.name, dns.TypeToString[tc.qtype], got, dns.RcodeToString[rcode], ok, tc.want, dns.RcodeToString[tc.rcode])
		}
	}
}

func TestTheZoneFollowsTheKubernetesDNSSchema(t *testing.T) {
	z := Build(testInput())
	expect(t, z, []zoneCase{
		{"hello.default.svc.cluster.local", dns.TypeA, "A 10.96.0.10", dns.RcodeSuccess},
		{"HELLO.Default.svc.cluster.local", dns.TypeA, "A 10.96.0.10", dns.RcodeSuccess},
		{"hello.default.svc.cluster.local", dns.TypeAAAA, "", dns.RcodeSuccess}, // NODATA
		{"_http._tcp.hello.default.svc.cluster.local", dns.TypeSRV, "SRV 0 100 80 hello.default.svc.cluster.local.", dns.RcodeSuccess},
		{"db.shop.svc.cluster.local", dns.TypeA, "A 10.22.1.5; A 10.22.2.7; A 10.22.3.9", dns.RcodeSuccess},
		{"db-1.db.shop.svc.cluster.local", dns.TypeA, "A 10.22.2.7", dns.RcodeSuccess},
		{"10-22-3-9.db.shop.svc.cluster.local", dns.TypeA, "A 10.22.3.9", dns.RcodeSuccess},
		{"_pg._tcp.db.shop.svc.cluster.local", dns.TypeSRV, "SRV 0 100 5432 10-22-3-9.db.shop.svc.cluster.local.; SRV 0 100 5432 db-0.db.shop.svc.cluster.local.; SRV 0 100 5432 db-1.db.shop.svc.cluster.local.", dns.RcodeSuccess},
		{"search.shop.svc.cluster.local", dns.TypeA, "CNAME search.example.com.", dns.RcodeSuccess},
		{"5.1.22.10.in-addr.arpa", dns.TypePTR, "PTR db-0.db.shop.svc.cluster.local.", dns.RcodeSuccess},
		{"10.0.96.10.in-addr.arpa", dns.TypePTR, "PTR hello.default.svc.cluster.local.", dns.RcodeSuccess},
		{"shop.svc.cluster.local", dns.TypeA, "", dns.RcodeSuccess}, // a namespace: NODATA
		{"nope.default.svc.cluster.local", dns.TypeA, "", dns.RcodeNameError},
		// A search-path miss of an outside name, answered here.
		{"example.com.default.svc.cluster.local", dns.TypeA, "", dns.RcodeNameError},
		{"db-2.db.shop.svc.cluster.local", dns.TypeA, "", dns.RcodeNameError},
		// A PTR query for a forward name is NODATA (not its A record),
		// and one for a cluster name that does not exist is NXDOMAIN,
		// never forwarded.
		{"hello.default.svc.cluster.local", dns.TypePTR, "", dns.RcodeSuccess},
		{"nope.default.svc.cluster.local", dns.TypePTR, "", dns.RcodeNameError},
		// A name between an SRV record and its Service exists (RFC 8020).
		{"_tcp.hello.default.svc.cluster.local", dns.TypeA, "", dns.RcodeSuccess},
		{"_udp.hello.default.svc.cluster.local", dns.TypeA, "", dns.RcodeNameError},
		// The apex has its SOA.
		{"cluster.local", dns.TypeSOA, "SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5", dns.RcodeSuccess},
	})
	// Another type for a reverse name the zone holds is NODATA, not
	// forwarded.
	if answer, _, rcode, ok := z.Answer(dns.Question{Name: "10.0.96.10.in-addr.arpa.", Qtype: dns.TypeTXT, Qclass: dns.ClassINET}); !ok || rcode != dns.RcodeSuccess || len(answer) != 0 {
		t.Errorf("TXT of a reverse name held: %v %s (answered here: %v), want NODATA", answer, dns.RcodeToString[rcode], ok)
	}
	if _, _, rcode, ok := z.Answer(dns.Question{Name: "hello.default.svc.cluster.local.", Qtype: dns.TypeA, Qclass: dns.ClassCHAOS}); !ok || rcode != dns.RcodeRefused {
		t.Errorf("a CH-class query: rcode %s (answered here: %v), want REFUSED", dns.RcodeToString[rcode], ok)
	}
	for _, name := range []string{"example.com", "1.1.168.192.in-addr.arpa"} {
		qtype := dns.TypeA
		if strings.HasSuffix(name, "arpa") {
			qtype = dns.TypePTR
		}
		if _, _, ok := ask(t, z, name, qtype); ok {
			t.Errorf("%s: answered from the zone, want it forwarded", name)
		}
	}
}

// TestPodRecordsAreVerified: a pod's a-b-c-d.NS.pod name answers only
// for a pod of that namespace with that address (CoreDNS's "pods
// verified"), NXDOMAIN for a wrong namespace or an address no pod has;
// a pod's address has a PTR, to its name under a headless Service when
// it is a ready endpoint of one, else to its pod name.
func TestPodRecordsAreVerified(t *testing.T) {
	in := testInput()
	in.Pods = []Pod{
		{IP: netip.MustParseAddr("10.22.4.2"), Namespace: "shop"},
		{IP: netip.MustParseAddr("10.22.1.5"), Namespace: "shop"}, // db-0
		{IP: netip.MustParseAddr("10.22.3.9"), Namespace: "shop"}, // an endpoint of db without a hostname
		{IP: netip.MustParseAddr("10.22.4.3"), Namespace: "Web"},
		{IP: netip.MustParseAddr("fd00:22::7"), Namespace: "web"},
		{Namespace: "web"}, // no address: no record
	}
	z := Build(in)
	expect(t, z, []zoneCase{
		{"10-22-4-2.shop.pod.cluster.local", dns.TypeA, "A 10.22.4.2", dns.RcodeSuccess},
		{"10-22-4-2.SHOP.pod.cluster.local", dns.TypeA, "A 10.22.4.2", dns.RcodeSuccess},
		{"10-22-4-2.shop.pod.cluster.local", dns.TypeAAAA, "", dns.RcodeSuccess}, // NODATA
		{"10-22-1-5.shop.pod.cluster.local", dns.TypeA, "A 10.22.1.5", dns.RcodeSuccess},
		{"10-22-4-3.web.pod.cluster.local", dns.TypeA, "A 10.22.4.3", dns.RcodeSuccess},
		{"fd00-22--7.web.pod.cluster.local", dns.TypeAAAA, "AAAA fd00:22::7", dns.RcodeSuccess},
		{"10-22-4-2.web.pod.cluster.local", dns.TypeA, "", dns.RcodeNameError},  // another namespace's pod
		{"10-22-4-9.shop.pod.cluster.local", dns.TypeA, "", dns.RcodeNameError}, // no pod has it
		{"10-22-4-2.nosuch.pod.cluster.local", dns.TypeA, "", dns.RcodeNameError},
		{"shop.pod.cluster.local", dns.TypeA, "", dns.RcodeSuccess}, // NODATA
		{"pod.cluster.local", dns.TypeA, "", dns.RcodeSuccess},
		{"2.4.22.10.in-addr.arpa", dns.TypePTR, "PTR 10-22-4-2.shop.pod.cluster.local.", dns.RcodeSuccess},
		{"5.1.22.10.in-addr.arpa", dns.TypePTR, "PTR db-0.db.shop.svc.cluster.local.", dns.RcodeSuccess},
		{"9.3.22.10.in-addr.arpa", dns.TypePTR, "PTR 10-22-3-9.db.shop.svc.cluster.local.", dns.RcodeSuccess},
		{"7.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.2.2.0.0.0.0.d.f.ip6.arpa", dns.TypePTR, "PTR fd00-22--7.web.pod.cluster.local.", dns.RcodeSuccess},
	})
	// The address of no pod is not the zone's: forwarded.
	if _, _, _, ok := z.Answer(dns.Question{Name: "9.4.22.10.in-addr.arpa.", Qtype: dns.TypePTR, Qclass: dns.ClassINET}); ok {
		t.Error("the PTR of an address no pod has was answered from the zone, want it forwarded")
	}
}

// TestTheZoneFileIsReadAcrossVersions: a server reads a zone file with
// a field it does not know (an upgraded agent's, beside the server
// process of the binary before) and one without the pods (the agent of
// the binary before).
func TestTheZoneFileIsReadAcrossVersions(t *testing.T) {
	dir := t.TempDir()
	for file, want := range map[string]string{
		`{"domain":"cluster.local","services":[],"pods":[{"ip":"10.22.1.5","namespace":"shop"}],"ingresses":[{"host":"x"}]}`: "10-22-1-5.shop.pod.cluster.local. 5 IN A 10.22.1.5\n5.1.22.10.in-addr.arpa. 5 IN PTR 10-22-1-5.shop.pod.cluster.local.",
		`{"domain":"cluster.local","services":[{"name":"a","namespace":"b","clusterIP":"10.96.0.9"}]}`:                       "9.0.96.10.in-addr.arpa. 5 IN PTR a.b.svc.cluster.local.\na.b.svc.cluster.local. 5 IN A 10.96.0.9",
	} {
		path := filepath.Join(dir, "zone.json")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		z, err := Load(path)
		if err != nil || z.String() != want {
			t.Errorf("%s: %v\n%s\nwant\n%s", file, err, z, want)
		}
	}
}

func TestTheCacheKeepsAnswersForTheirTTL(t *testing.T) {
	c := NewCache(2)
	now := time.Unix(1_000_000, 0)
	q := dns.Question{Name: "example.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET}
	m := new(dns.Msg)
	m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "example.com.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(192, 0, 2, 1)}}
	if !c.Put(q, false, m, now) {
		t.Fatal("a positive answer was not kept")
	}
	got, ok := c.Get(dns.Question{Name: "EXAMPLE.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, false, now.Add(10*time.Second))
	if !ok || got.Answer[0].Header().Ttl != 20 {
		t.Fatalf("after 10 s: %v %v, want the answer with 20 s left", got, ok)
	}
	if _, ok := c.Get(q, false, now.Add(30*time.Second)); ok {
		t.Error("kept past its TTL")
	}
	neg := new(dns.Msg)
	neg.Rcode = dns.RcodeNameError
	neg.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: "com.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 900}, Minttl: 60}}
	nq := dns.Question{Name: "nx.example.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET}
	c.Put(nq, false, neg, now)
	if _, ok := c.Get(nq, false, now.Add(59*time.Second)); !ok {
		t.Error("a negative answer not kept for its SOA minimum")
	}
	if _, ok := c.Get(nq, false, now.Add(61*time.Second)); ok {
		t.Error("a negative answer kept past its SOA minimum")
	}
	fail := new(dns.Msg)
	fail.Rcode = dns.RcodeServerFailure
	if c.Put(q, true, fail, now) {
		t.Error("a failure was kept")
	}
	for i := range 5 {
		c.Put(dns.Question{Name: strings.Repeat("a", i+1) + ".", Qtype: dns.TypeA, Qclass: dns.ClassINET}, false, m, now)
	}
	if c.Len() != 2 {
		t.Errorf("%d entries, want the bound, 2", c.Len())
	}
}

// upstream is a fake resolver on the loopback: every A query for a name
// under example.com gets 192.0.2.1 with a TTL of 60 s; it counts the
// queries it answers.
type upstream struct {
	addr string
	mu   sync.Mutex
	asks map[string]int
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{asks: map[string]int{}}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		u.mu.Lock()
		u.asks[r.Question[0].Name]++
		u.mu.Unlock()
		time.Sleep(20 * time.Millisecond) // concurrent asks meet
		m := new(dns.Msg)
		m.SetReply(r)
		if strings.HasSuffix(r.Question[0].Name, "example.com.") {
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)}}
		} else {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return u
}

func (u *upstream) count(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.asks[name]
}

// TestTheServerAnswersTheClusterAndForwardsTheRestOnce: cluster names
// from the zone (never upstream, search-path misses included), an
// outside name asked upstream once however many pods ask, a new zone
// file answered within the reload, over UDP and TCP.
func TestTheServerAnswersTheClusterAndForwardsTheRestOnce(t *testing.T) {
	up := startUpstream(t)
	zoneFile := t.TempDir() + "/zone.json"
	if _, err := Write(zoneFile, testInput()); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.LocalAddr().String()
	l.Close()
	s := NewServer(Config{Addr: addr, ZoneFile: zoneFile, Upstreams: []string{up.addr}}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	query := func(network, name string, qtype uint16) (*dns.Msg, error) {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		c := &dns.Client{Net: network, Timeout: 2 * time.Second}
		var r *dns.Msg
		var err error
		for range 50 { // the server may still be starting
			if r, _, err = c.Exchange(m, addr); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		return r, err
	}
	for _, network := range []string{"udp", "tcp"} {
		r, err := query(network, "hello.default.svc.cluster.local", dns.TypeA)
		if err != nil || len(r.Answer) != 1 || !r.Authoritative {
			t.Fatalf("%s: %v %v", network, r, err)
		}
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := query("udp", "www.example.com", dns.TypeA); err != nil || len(r.Answer) != 1 || r.Rcode != dns.RcodeSuccess {
				t.Errorf("www.example.com: %v %v", r, err)
			}
		}()
	}
	wg.Wait()
	if n := up.count("www.example.com."); n != 1 {
		t.Errorf("20 lookups of www.example.com asked upstream %d times, want 1 (one flight, then the cache)", n)
	}
	// An ExternalName: the CNAME, chased to its target's address.
	if r, err := query("udp", "search.shop.svc.cluster.local", dns.TypeA); err != nil || len(r.Answer) != 2 || r.Answer[1].(*dns.A).A.String() != "192.0.2.1" {
		t.Errorf("an ExternalName Service: %v %v, want its CNAME and the target's address", r, err)
	}
	if r, err := query("udp", "www.example.com.default.svc.cluster.local", dns.TypeA); err != nil || r.Rcode != dns.RcodeNameError {
		t.Errorf("a search-path miss: %v %v, want NXDOMAIN", r, err)
	}
	if n := up.count("www.example.com.default.svc.cluster.local."); n != 0 {
		t.Errorf("a search-path miss went upstream %d times", n)
	}
	in := testInput()
	in.Services = in.Services[1:] // hello deleted
	if _, err := Write(zoneFile, in); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second)
	for {
		r, err := query("udp", "hello.default.svc.cluster.local", dns.TypeA)
		if err == nil && r.Rcode == dns.RcodeNameError {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a deleted Service still answers 1 s after its zone was written: %v %v", r, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNameserverIsThePodSubnetsGateway(t *testing.T) {
	if ns, err := Nameserver(netip.MustParsePrefix("10.22.7.0/24")); err != nil || ns != netip.MustParseAddr("10.22.7.1") {
		t.Errorf("Nameserver = %v %v, want 10.22.7.1", ns, err)
	}
	if _, err := Nameserver(netip.Prefix{}); err == nil {
		t.Error("no subnet: want an error")
	}
}

// TestTheServerListensBeforeItsAddressExists: the node's DNS server
// starts on the bridge's address before the bridge has it (no pod yet),
// instead of failing and being started again at every view change.
func TestTheServerListensBeforeItsAddressExists(t *testing.T) {
	zoneFile := t.TempDir() + "/zone.json"
	if _, err := Write(zoneFile, testInput()); err != nil {
		t.Fatal(err)
	}
	// 192.0.2.0/24 (TEST-NET-1) is on no interface of this machine.
	s := NewServer(Config{Addr: "192.0.2.53:53535", ZoneFile: zoneFile}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("the server stopped: %v, want it listening until the address comes", err)
	case <-time.After(500 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("stopped with %v", err)
	}
}

// TestTheCacheIsBoundedInBytes: many large answers (TXT of 20 KB each,
// what a pod can make an upstream send over TCP) are kept only up to
// MaxBytes, whatever the entry bound.
func TestTheCacheIsBoundedInBytes(t *testing.T) {
	c := NewCache(DefaultCacheSize)
	now := time.Unix(1_000_000, 0)
	for i := range 400 {
		name := fmt.Sprintf("n%d.example.com.", i)
		m := new(dns.Msg)
		for range 40 { // 20 KB
			m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 300},
				Txt: []string{strings.Repeat("x", 250), strings.Repeat("y", 250)}})
		}
		c.Put(dns.Question{Name: name, Qtype: dns.TypeTXT, Qclass: dns.ClassINET}, false, m, now)
	}
	if c.Bytes() > MaxBytes || c.Len() == 400 {
		t.Errorf("%d entries, %d bytes kept; want at most %d bytes", c.Len(), c.Bytes(), MaxBytes)
	}
}

// TestDeadUpstreamsCostOneTimeout: with its first upstream dead, the
// server answers from the second, and the next query asks the second
// first (no timeout again); a query no upstream answers is SERVFAIL,
// and asked again within FailTTL is SERVFAIL at once. An answer carries
// an OPT record only if the query had one, and it is the server's.
func TestDeadUpstreamsCostOneTimeout(t *testing.T) {
	dead, err := net.ListenPacket("udp", "127.0.0.1:0") // reads nothing, answers nothing
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	up := startUpstream(t)
	s := NewServer(Config{Upstreams: []string{dead.LocalAddr().String(), up.addr}}, Build(testInput()))
	s.client.Timeout = 300 * time.Millisecond
	ask := func(name string, edns bool) (*dns.Msg, time.Duration) {
		r := new(dns.Msg)
		r.SetQuestion(name, dns.TypeA)
		if edns {
			r.SetEdns0(4096, true)
		}
		start := time.Now()
		return s.answer(r), time.Since(start)
	}
	if m, took := ask("a.example.com.", false); m.Rcode != dns.RcodeSuccess || took < 300*time.Millisecond {
		t.Errorf("first query: %s after %v, want an answer after the dead upstream's timeout", dns.RcodeToString[m.Rcode], took)
	}
	if m, took := ask("b.example.com.", false); m.Rcode != dns.RcodeSuccess || took > 250*time.Millisecond {
		t.Errorf("second query: %s after %v, want an answer from the live upstream first", dns.RcodeToString[m.Rcode], took)
	}
	all := NewServer(Config{Upstreams: []string{dead.LocalAddr().String()}}, Build(testInput()))
	all.client.Timeout = 300 * time.Millisecond
	for i, want := range []time.Duration{300 * time.Millisecond, 0} {
		r := new(dns.Msg)
		r.SetQuestion("c.example.com.", dns.TypeA)
		start := time.Now()
		m := all.answer(r)
		took := time.Since(start)
		if m.Rcode != dns.RcodeServerFailure || want > 0 && took < want || want == 0 && took > 100*time.Millisecond {
			t.Errorf("query %d with every upstream dead: %s after %v", i, dns.RcodeToString[m.Rcode], took)
		}
	}
	// EDNS: through ServeDNS, as a client sees it.
	for _, edns := range []bool{false, true} {
		for _, name := range []string{"d.example.com.", "hello.default.svc.cluster.local."} {
			r := new(dns.Msg)
			r.SetQuestion(name, dns.TypeA)
			if edns {
				r.SetEdns0(4096, true)
			}
			w := &recorder{}
			s.ServeDNS(w, r)
			opt := w.msg.IsEdns0()
			if (opt != nil) != edns || opt != nil && (opt.UDPSize() != ednsSize || !opt.Do()) {
				t.Errorf("%s, EDNS asked %v: OPT %v", name, edns, opt)
			}
		}
	}
}

// recorder is a dns.ResponseWriter that keeps the message written.
type recorder struct {
	dns.ResponseWriter
	msg *dns.Msg
}

func (r *recorder) WriteMsg(m *dns.Msg) error { r.msg = m; return nil }
func (r *recorder) RemoteAddr() net.Addr      { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5353} }

// TestAChainOfExternalNamesIsFollowed: an ExternalName naming another
// ExternalName of the cluster is followed to the end; a loop stops.
func TestAChainOfExternalNamesIsFollowed(t *testing.T) {
	in := testInput()
	in.Services = append(in.Services,
		Service{Name: "alias", Namespace: "shop", ExternalName: "alias2.shop.svc.cluster.local"},
		Service{Name: "alias2", Namespace: "shop", ExternalName: "hello.default.svc.cluster.local"},
		Service{Name: "loop1", Namespace: "shop", ExternalName: "loop2.shop.svc.cluster.local"},
		Service{Name: "loop2", Namespace: "shop", ExternalName: "loop1.shop.svc.cluster.local"})
	s := NewServer(Config{}, Build(in))
	r := new(dns.Msg)
	r.SetQuestion("alias.shop.svc.cluster.local.", dns.TypeA)
	m := s.answer(r)
	if len(m.Answer) != 3 || m.Answer[2].(*dns.A).A.String() != "10.96.0.10" {
		t.Errorf("alias -> alias2 -> hello: %v", m.Answer)
	}
	r.SetQuestion("loop1.shop.svc.cluster.local.", dns.TypeA)
	if m := s.answer(r); len(m.Answer) > maxChase+1 {
		t.Errorf("a loop of ExternalNames: %d records", len(m.Answer))
	}
}

// TestReverseLookupsOfClusterAddressesStayHere: the reverse name of an
// address of the cluster's ranges that no Service or pod holds is
// NXDOMAIN from the zone (not asked upstream, where it would leak and
// wait); another address's is forwarded.
func TestReverseLookupsOfClusterAddressesStayHere(t *testing.T) {
	in := testInput()
	in.Reverse = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.22.0.0/16")}
	z := Build(in)
	for name, want := range map[string]int{
		"11.0.96.10.in-addr.arpa.":  dns.RcodeNameError, // a ClusterIP no Service has
		"1.1.22.10.in-addr.arpa.":   dns.RcodeNameError, // a bridge's address
		"10.0.96.10.in-addr.arpa.":  dns.RcodeSuccess,   // hello's
		"1.1.168.192.in-addr.arpa.": -1,                 // not the cluster's: forwarded
		"22.10.in-addr.arpa.":       -1,                 // not an address
	} {
		_, _, rcode, ok := z.Answer(dns.Question{Name: name, Qtype: dns.TypePTR, Qclass: dns.ClassINET})
		if want == -1 && ok || want != -1 && (!ok || rcode != want) {
			t.Errorf("%s: %s (answered here: %v), want %d", name, dns.RcodeToString[rcode], ok, want)
		}
	}
}
