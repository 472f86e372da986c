// Package testnet provides memberlist transports for tests of Starling's
// gossip and node layers: real UDP and TCP on 127.0.0.1 (memberlist.NetTransport), wrapped so that a
// test can count the bytes each node sends and cut all traffic between groups
// of nodes.
//
// A cut is applied at the sender: packets to a node across the cut are
// silently dropped (as a lossy network would) and dials fail (as a firewall
// that rejects would). Since every node of a test uses a wrapped transport,
// that cuts both directions.
package testnet

import (
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Network is a set of transports that know each other by address.
type Network struct {
	mu     sync.Mutex
	byAddr map[string]string // "127.0.0.1:port" -> node name
	group  map[string]int    // node name -> group; absent = group 0
	cut    bool
	// noStreams are the (from, to) node pairs whose dials fail
	// (CutStreams).
	noStreams map[[2]string]bool
}

// New returns an empty Network.
func New() *Network {
	return &Network{byAddr: map[string]string{}, group: map[string]int{}}
}

// Counters are the bytes and messages a transport has sent.
type Counters struct {
	PacketBytes int64 // UDP payload bytes written
	Packets     int64
	StreamBytes int64 // TCP bytes written, on dialled and accepted connections
	Streams     int64 // connections dialled
}

// Total returns PacketBytes + StreamBytes.
func (c Counters) Total() int64 { return c.PacketBytes + c.StreamBytes }

// Transport is a memberlist.NodeAwareTransport on 127.0.0.1.
type Transport struct {
	net  *Network
	name string
	addr string
	nt   *memberlist.NetTransport

	packetBytes, packets, streamBytes, streams atomic.Int64

	streamCh chan net.Conn
	done     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// Transport starts a transport for the node name on 127.0.0.1 and a free
// port. The node must use it through gossip.Config.Transport.
func (n *Network) Transport(name string) (*Transport, error) {
	var nt *memberlist.NetTransport
	var err error
	// Binding UDP and TCP to one free port races with other tests; retry as
	// memberlist itself does (memberlist.go, newMemberlist).
	for range 10 {
		nt, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{"127.0.0.1"},
			BindPort:  0,
			Logger:    log.New(io.Discard, "", 0),
		})
		if err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("testnet: %w", err)
	}
	t := &Transport{
		net:      n,
		name:     name,
		addr:     net.JoinHostPort("127.0.0.1", strconv.Itoa(nt.GetAutoBindPort())),
		nt:       nt,
		streamCh: make(chan net.Conn),
		done:     make(chan struct{}),
	}
	n.mu.Lock()
	n.byAddr[t.addr] = name
	n.mu.Unlock()
	t.wg.Add(1)
	go t.forwardStreams()
	return t, nil
}

// Addr returns the transport's "127.0.0.1:port".
func (t *Transport) Addr() string { return t.addr }

// Counters returns what t has sent so far.
func (t *Transport) Counters() Counters {
	return Counters{
		PacketBytes: t.packetBytes.Load(),
		Packets:     t.packets.Load(),
		StreamBytes: t.streamBytes.Load(),
		Streams:     t.streams.Load(),
	}
}

// Partition cuts all traffic between nodes of different groups. Nodes not
// named in any group form one more group together.
func (n *Network) Partition(groups ...[]string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.group = map[string]int{}
	for i, g := range groups {
		for _, name := range g {
			n.group[name] = i + 1
		}
	}
	n.cut = true
}

// Heal removes every cut.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = false
}

// CutStreams makes node from's dials to node to fail until
// RestoreStreams (the other way, and packets, still go through).
func (n *Network) CutStreams(from, to string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.noStreams == nil {
		n.noStreams = map[[2]string]bool{}
	}
	n.noStreams[[2]string{from, to}] = true
}

// RestoreStreams undoes CutStreams(from, to).
func (n *Network) RestoreStreams(from, to string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.noStreams, [2]string{from, to})
}

// streamCut reports whether from's dials to the node at addr fail
// (CutStreams).
func (n *Network) streamCut(from, addr string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	to, ok := n.byAddr[addr]
	return ok && n.noStreams[[2]string{from, to}]
}

// blocked reports whether from may not send to the node at addr.
func (n *Network) blocked(from, addr string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.cut {
		return false
	}
	to, ok := n.byAddr[addr]
	if !ok {
		return false
	}
	return n.group[from] != n.group[to]
}

func (t *Transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.nt.FinalAdvertiseAddr(ip, port)
}

func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.net.blocked(t.name, a.Addr) {
		return time.Now(), nil
	}
	t.packetBytes.Add(int64(len(b)))
	t.packets.Add(1)
	return t.nt.WriteToAddress(b, a)
}

func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.nt.PacketCh() }

func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.net.blocked(t.name, a.Addr) || t.net.streamCut(t.name, a.Addr) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("testnet: %s cut off from %s", t.name, a.Addr)}
	}
	conn, err := t.nt.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	t.streams.Add(1)
	return &countingConn{Conn: conn, n: &t.streamBytes}, nil
}

func (t *Transport) StreamCh() <-chan net.Conn { return t.streamCh }

// forwardStreams wraps accepted connections to count what t writes on them.
func (t *Transport) forwardStreams() {
	defer t.wg.Done()
	for {
		select {
		case conn := <-t.nt.StreamCh():
			select {
			case t.streamCh <- &countingConn{Conn: conn, n: &t.streamBytes}:
			case <-t.done:
				conn.Close()
				return
			}
		case <-t.done:
			return
		}
	}
}

func (t *Transport) Shutdown() error {
	var err error
	t.once.Do(func() {
		// The inner transport's listeners block handing over accepted
		// connections: keep forwarding them until it has shut down.
		err = t.nt.Shutdown()
		close(t.done)
		t.wg.Wait()
		t.net.mu.Lock()
		delete(t.net.byAddr, t.addr)
		t.net.mu.Unlock()
	})
	return err
}

type countingConn struct {
	net.Conn
	n  *atomic.Int64
	to *atomic.Int64 // also counts here, if set: the writer's bytes to this peer
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.Add(int64(n))
	if c.to != nil {
		c.to.Add(int64(n))
	}
	return n, err
}
