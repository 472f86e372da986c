package e2e

import (
	"bufio"
	encbin "encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// A TCP segment from a backend far outside the window is conntrack-INVALID:
// it skips the reverse NAT and reaches the client from the backend's own
// address. The client, which has no connection to that address, answers
// with a reset, which closes the backend's side of the connection, and the
// client's next request on its keep-alive connection to the ClusterIP is
// reset (kubernetes#74839; reproduced here 3 of 3 before the fix). The
// agent drops INVALID packets in the forward path, as kube-proxy does, and
// the connection survives.
func TestOutOfWindowSegmentDoesNotResetAServiceConnection(t *testing.T) {
	c := newCluster(t, 2)
	n1 := c.Nodes[0]
	importEcho(t, n1)
	webApp := harness.App{Name: "invalid-web", Replicas: 1, Grace: harness.Seconds(1), Ports: harness.HTTPPort}
	apply(t, n1, harness.Manifests(webApp.Deployment(),
		harness.App{Name: "invalid-client", Replicas: 1, Grace: harness.Seconds(1)}.Deployment(),
		webApp.Service("invalid-web", []corev1.ServicePort{harness.ServicePort(80, "http")})))
	var web, client replica
	var placed string // the placement seen, and since when
	var since time.Time
	_, err := eventually(60*time.Second, func() error {
		all, err := replicas(n1)
		if err != nil {
			return err
		}
		// Settled: one copy of each, running (a copy handed off from the
		// first node to join would stop, and reset its connections).
		listed := map[string]int{}
		web, client = replica{}, replica{}
		for _, r := range all {
			listed[r.Workload]++
			if r.Phase == api.PhaseRunning && r.Ready && r.PodIP != "" {
				switch r.Workload {
				case "invalid-web":
					web = r
				case "invalid-client":
					client = r
				}
			}
		}
		if web.Name == "" || client.Name == "" || listed["invalid-web"] != 1 || listed["invalid-client"] != 1 {
			return fmt.Errorf("web %q and client %q not both running alone (%v)", web.Name, client.Name, listed)
		}
		// And for 5 s: the second node's join moves replicas to it.
		if now := web.Name + web.Node + client.Name + client.Node; now != placed {
			placed, since = now, time.Now()
		}
		if time.Since(since) < 5*time.Second {
			return fmt.Errorf("placement not stable for 5 s yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	nodeOf := func(r replica) *harness.Node {
		for _, n := range c.Nodes {
			if n.Name == r.Node {
				return n
			}
		}
		t.Fatalf("no node %s", r.Node)
		return nil
	}
	webNS := filepath.Join(nodeOf(web).DataDir, "netns", "default_"+web.Name)
	clientNS := filepath.Join(nodeOf(client).DataDir, "netns", "default_"+client.Name)
	vip := clusterIP(t, n1, "invalid-web")
	t.Logf("client %s on %s, backend %s on %s, ClusterIP %s", client.PodIP, client.Node, web.PodIP, web.Node, vip)

	// Five keep-alive connections from the client pod to the ClusterIP
	// (the reset does not follow every out-of-window segment: 3 of 5
	// connections survived one before the fix), each hit by one segment.
	for i := range 5 {
		if err := outOfWindow(t, clientNS, webNS, vip, web.PodIP); err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
	}
}

// outOfWindow opens a keep-alive connection from the client's namespace
// to vip:80, makes a request, has the backend (backendIP:8080, namespace
// webNS) send a segment far outside the client's window with an
// acknowledgement the backend would accept a reset for, and makes a
// second request on the same connection.
func outOfWindow(t *testing.T, clientNS, webNS, vip, backendIP string) error {
	var conn net.Conn
	if _, err := eventually(20*time.Second, func() (err error) {
		conn, err = harness.DialInPath(clientNS)(t.Context(), "tcp", vip+":80")
		return err
	}); err != nil {
		return err
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	get := func() error {
		conn.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", vip); err != nil {
			return err
		}
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var body strings.Builder
		if _, err := bufio.NewReader(resp.Body).WriteTo(&body); err != nil {
			return err
		}
		if !strings.Contains(body.String(), "podIP="+backendIP) {
			return fmt.Errorf("unexpected answer %q", body.String())
		}
		return nil
	}
	// Watch the connection from inside the backend's namespace while a
	// request goes over it: the client's next sequence number, what the
	// backend acknowledges.
	clientAddr := netip.MustParseAddrPort(conn.LocalAddr().String())
	backend := netip.AddrPortFrom(netip.MustParseAddr(backendIP), 8080)
	var seqs tcpSeqs
	stop, err := seqs.watch(webNS, clientAddr, backend)
	if err != nil {
		return err
	}
	err = get()
	time.Sleep(200 * time.Millisecond)
	stop()
	if err != nil {
		return fmt.Errorf("first request: %w", err)
	}
	clientNext, backendNext, ok := seqs.next()
	if !ok {
		return fmt.Errorf("saw no packet of the connection in the backend's namespace")
	}
	if err := inNetns(webNS, func() error {
		return sendTCP(backend, clientAddr, backendNext+1<<30, clientNext, []byte("out of window"))
	}); err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	if err := get(); err != nil {
		return fmt.Errorf("after an out-of-window segment from the backend, the keep-alive connection to the ClusterIP failed: %w", err)
	}
	return nil
}

// tcpSeqs follows one TCP connection's sequence numbers from packets seen
// in a namespace.
type tcpSeqs struct {
	mu                      sync.Mutex
	clientNext, backendNext uint32
	seen                    bool
}

func (s *tcpSeqs) next() (uint32, uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientNext, s.backendNext, s.seen
}

// watch reads the IPv4 packets of namespace ns (an AF_PACKET socket)
// until stop is called, noting the next sequence number of each side of
// the connection between client and backend.
func (s *tcpSeqs) watch(ns string, client, backend netip.AddrPort) (stop func(), err error) {
	fdc := make(chan int, 1)
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := setns(ns); err != nil {
			errc <- err
			return
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(htons(unix.ETH_P_IP)))
		if err != nil {
			errc <- fmt.Errorf("packet socket: %w", err)
			return
		}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
		fdc <- fd
		buf := make([]byte, 65536)
		for {
			select {
			case <-done:
				unix.Close(fd)
				return
			default:
			}
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil || n < 40 || buf[0]>>4 != 4 || buf[9] != unix.IPPROTO_TCP {
				continue
			}
			ihl := int(buf[0]&0x0f) * 4
			total := int(encbin.BigEndian.Uint16(buf[2:4]))
			if n < ihl+20 || total > n {
				continue
			}
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[12:16])), encbin.BigEndian.Uint16(buf[ihl:]))
			dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[16:20])), encbin.BigEndian.Uint16(buf[ihl+2:]))
			tcp := buf[ihl:total]
			seq := encbin.BigEndian.Uint32(tcp[4:8])
			payload := uint32(len(tcp) - int(tcp[12]>>4)*4)
			if tcp[13]&0x03 != 0 { // SYN or FIN count as one
				payload++
			}
			s.mu.Lock()
			switch {
			case src == client && dst == backend:
				s.clientNext, s.seen = seq+payload, true
			case src == backend && dst == client:
				s.backendNext = seq + payload
			}
			s.mu.Unlock()
		}
	}()
	select {
	case err := <-errc:
		return nil, err
	case <-fdc:
	}
	return func() { close(done) }, nil
}

// inNetns runs f on a thread in the network namespace at path; the thread
// is never returned to the runtime's pool.
func inNetns(path string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := setns(path); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

func setns(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Setns(fd, unix.CLONE_NEWNET)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// sendTCP sends one TCP segment (ACK and PSH, with payload) from src to
// dst through a raw socket of the calling thread's namespace.
func sendTCP(src, dst netip.AddrPort, seq, ack uint32, payload []byte) error {
	tcp := make([]byte, 20+len(payload))
	encbin.BigEndian.PutUint16(tcp[0:], src.Port())
	encbin.BigEndian.PutUint16(tcp[2:], dst.Port())
	encbin.BigEndian.PutUint32(tcp[4:], seq)
	encbin.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12] = 5 << 4
	tcp[13] = 0x18 // PSH, ACK
	encbin.BigEndian.PutUint16(tcp[14:], 65535)
	copy(tcp[20:], payload)
	s, d := src.Addr().As4(), dst.Addr().As4()
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, unix.IPPROTO_TCP, byte(len(tcp)>>8), byte(len(tcp)))
	encbin.BigEndian.PutUint16(tcp[16:], checksum(append(pseudo, tcp...)))
	ip := make([]byte, 20)
	ip[0] = 0x45
	encbin.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
	ip[8] = 64
	ip[9] = unix.IPPROTO_TCP
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	encbin.BigEndian.PutUint16(ip[10:], checksum(ip))
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	return unix.Sendto(fd, append(ip, tcp...), 0, &unix.SockaddrInet4{Addr: d})
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(encbin.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
