package dns

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The node's DNS against a trivial responder (a miekg/dns server that
// answers every query with one fixed A record, no lookup at all), on the
// loopback, one UDP socket per client goroutine: queries per second of
// a cluster name, an upstream name from the cache, and a search-path
// miss (NXDOMAIN from the zone). `make bench` runs them side by side:
//
//	go test -run=NONE -bench=DNS -benchtime=3s ./node/dns

// benchZone is 500 Services in 50 namespaces, each with a named port.
func benchZone() Input {
	in := Input{Domain: "cluster.local"}
	for i := range 500 {
		in.Services = append(in.Services, Service{Name: fmt.Sprintf("svc%d", i), Namespace: fmt.Sprintf("ns%d", i%50),
			ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i / 256), byte(i % 256)}), Ports: []Port{{Name: "http", Protocol: "TCP", Port: 80}}})
	}
	return in
}

// serve runs h on a loopback UDP address until the benchmark ends.
func serve(b *testing.B, h dns.Handler) string {
	b.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: h}
	go srv.ActivateAndServe()
	b.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

// benchQueries asks name (type A) at addr from parallel clients and
// reports queries per second; every answer must have rcode want.
func benchQueries(b *testing.B, addr, name string, want int) {
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		conn, err := dns.Dial("udp", addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer conn.Close()
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		for pb.Next() {
			m.Id = dns.Id()
			if err := conn.WriteMsg(m); err != nil {
				b.Error(err)
				return
			}
			r, err := conn.ReadMsg()
			if err != nil || r.Rcode != want {
				b.Errorf("%s: %v %v", name, r, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "queries/s")
}

func BenchmarkDNSTrivialResponder(b *testing.B) {
	addr := serve(b, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.IPv4(10, 96, 0, 1)}}
		w.WriteMsg(m)
	}))
	benchQueries(b, addr, "svc7.ns7.svc.cluster.local.", dns.RcodeSuccess)
}

// nodeDNS is a Server of benchZone whose upstream is a trivial
// responder for example.com.
func nodeDNS(b *testing.B) string {
	up := serve(b, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.IPv4(192, 0, 2, 1)}}
		w.WriteMsg(m)
	}))
	s := NewServer(Config{Upstreams: []string{up}}, Build(benchZone()))
	return serve(b, s)
}

func BenchmarkDNSClusterName(b *testing.B) {
	benchQueries(b, nodeDNS(b), "svc7.ns7.svc.cluster.local.", dns.RcodeSuccess)
}

func BenchmarkDNSCachedUpstreamName(b *testing.B) {
	benchQueries(b, nodeDNS(b), "www.example.com.", dns.RcodeSuccess)
}

func BenchmarkDNSSearchPathMiss(b *testing.B) {
	benchQueries(b, nodeDNS(b), "www.example.com.ns7.svc.cluster.local.", dns.RcodeNameError)
}
