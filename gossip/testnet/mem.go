package testnet

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Mem is an in-memory network for memberlist transports: packets go
// through channels and streams through net.Pipe, never through a socket.
// Every blocking operation of a cluster on it is then a channel operation
// or a timer, so a whole cluster can run inside a testing/synctest bubble,
// on virtual time: a slow or overloaded machine makes the run take longer,
// but never makes a probe late in the cluster's own time.
//
// Packets are delivered after Latency (0: at once) into the receiver's
// queue of MemQueue packets; a full queue drops them, as a socket's
// receive buffer does. Partition and Heal cut traffic as Network's do.
type Mem struct {
	// Latency is the one-way delay of every packet and of every dial.
	Latency time.Duration

	mu     sync.Mutex
	byAddr map[string]*MemTransport
	ips    map[string]net.IP // a node keeps its address across restarts
	group  map[string]int
	cut    bool
	next   int
	// strip holds, by receiving node, the memberlist message types taken
	// out of the packets sent to it (Strip); noStreams the pairs of
	// nodes whose first cannot dial the second (CutStreams).
	strip     map[string]map[byte]bool
	noStreams map[[2]string]bool
}

// MemQueue is the number of packets a MemTransport holds for its reader.
const MemQueue = 4096

// NewMem returns an empty in-memory network with the given one-way latency.
func NewMem(latency time.Duration) *Mem {
	return &Mem{Latency: latency, byAddr: map[string]*MemTransport{}, ips: map[string]net.IP{}, group: map[string]int{}}
}

// MemTransport is a memberlist.NodeAwareTransport on a Mem network. Its
// address is a distinct 10.x.y.z:7946, so the layers above see one IP
// address per node, as on a LAN.
type MemTransport struct {
	net  *Mem
	name string
	ip   net.IP
	addr string

	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	done     chan struct{}
	once     sync.Once

	packetBytes, packets, streamBytes, streams, dropped atomic.Int64
	// kinds counts dialled streams by their first byte (memberlist's
	// message type: 6 push/pull, 8 user message, 0 TCP ping; with
	// encryption or a label every stream is 10 or 244), and kindBytes
	// what they carried both ways.
	kinds, kindBytes [256]atomic.Int64
	// packetKinds counts the bytes of the packets t sent by what they
	// carry (countPacket), and packetMsgs the messages of each kind.
	packetKinds, packetMsgs [512]atomic.Int64
	// sentTo counts the stream bytes t wrote, by the peer's address
	// (*atomic.Int64).
	sentTo sync.Map
}

// to is the counter of the stream bytes t writes to the node at addr.
func (t *MemTransport) to(addr string) *atomic.Int64 {
	c, _ := t.sentTo.LoadOrStore(addr, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// StreamBytesTo is how many bytes t wrote on streams (dialled or
// accepted) with the node at addr (its Addr).
func (t *MemTransport) StreamBytesTo(addr string) int64 { return t.to(addr).Load() }

var _ memberlist.NodeAwareTransport = (*MemTransport)(nil)

// Transport returns a new transport for node name, at the address name
// had before if it had one (a node that restarts). Create it inside the
// synctest bubble that runs the node (its channels must belong to it).
func (m *Mem) Transport(name string) *MemTransport {
	m.mu.Lock()
	defer m.mu.Unlock()
	ip, ok := m.ips[name]
	if !ok {
		m.next++
		ip = net.IPv4(10, byte(m.next>>16), byte(m.next>>8), byte(m.next))
		m.ips[name] = ip
	}
	t := &MemTransport{
		net:      m,
		name:     name,
		ip:       ip,
		addr:     net.JoinHostPort(ip.String(), "7946"),
		packetCh: make(chan *memberlist.Packet, MemQueue),
		streamCh: make(chan net.Conn),
		done:     make(chan struct{}),
	}
	m.byAddr[t.addr] = t
	return t
}

// Partition cuts all traffic between nodes of different groups. Nodes not
// named in any group form one more group together.
func (m *Mem) Partition(groups ...[]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.group = map[string]int{}
	for i, g := range groups {
		for _, name := range g {
			m.group[name] = i + 1
		}
	}
	m.cut = true
}

// Heal removes every cut, and every Strip and CutStreams.
func (m *Mem) Heal() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cut = false
	m.strip, m.noStreams = nil, nil
}

// Strip takes every memberlist message of type kind (4: alive) out of
// the packets sent to node to from then on, as if each were lost alone:
// a compound packet keeps its other parts (its CRC header, if any, is
// computed again), and a packet left with nothing is lost. A node
// stripped of alive messages misses members' joins as one that missed
// every retransmission of them does. Only unencrypted packets (the
// agents' --insecure) can be read: an encrypted packet's first byte is
// its encryption version, which Strip would take for a message type.
func (m *Mem) Strip(to string, kind byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.strip == nil {
		m.strip = map[string]map[byte]bool{}
	}
	kinds := maps.Clone(m.strip[to]) // senders read the old one unlocked
	if kinds == nil {
		kinds = map[byte]bool{}
	}
	kinds[kind] = true
	m.strip[to] = kinds
}

// CutStreams makes node from's dials to node to fail from then on (the
// other way still works); packets still go through.
func (m *Mem) CutStreams(from, to string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.noStreams == nil {
		m.noStreams = map[[2]string]bool{}
	}
	m.noStreams[[2]string{from, to}] = true
}

// stripped returns the kinds Strip takes out of packets to node name
// (nil: none); the map is never written after it is stored.
func (m *Mem) stripped(name string) map[byte]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.strip[name]
}

// without returns packet b with its messages of the given kinds taken
// out (nil when none is left). A packet it cannot parse is kept whole.
func without(b []byte, kinds map[byte]bool) []byte {
	if len(b) == 0 {
		return b
	}
	switch b[0] {
	case hasCrcMsg:
		if len(b) < 5 {
			return b
		}
		rest := without(b[5:], kinds)
		if rest == nil {
			return nil
		}
		out := append([]byte{hasCrcMsg, 0, 0, 0, 0}, rest...)
		binary.BigEndian.PutUint32(out[1:5], crc32.ChecksumIEEE(rest))
		return out
	case compoundMsg:
		if len(b) < 2 || len(b) < 2+2*int(b[1]) {
			return b
		}
		n := int(b[1])
		var parts [][]byte
		off := 2 + 2*n
		for i := range n {
			l := int(binary.BigEndian.Uint16(b[2+2*i:]))
			if off+l > len(b) {
				return b
			}
			if part := b[off : off+l]; len(part) > 0 && !kinds[part[0]] {
				parts = append(parts, part)
			}
			off += l
		}
		if len(parts) == 0 {
			return nil
		}
		return compound(parts...)
	default:
		if kinds[b[0]] {
			return nil
		}
		return b
	}
}

// peer returns the live transport at addr that from may send to.
func (m *Mem) peer(from, addr string) (*MemTransport, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	to, ok := m.byAddr[addr]
	if !ok {
		return nil, false
	}
	if m.cut && m.group[from] != m.group[to.name] {
		return nil, false
	}
	return to, true
}

// compound is memberlist's compound packet of parts (at most 255, each
// under 64 KiB): type, count, the parts' lengths, the parts.
func compound(parts ...[]byte) []byte {
	out := []byte{compoundMsg, byte(len(parts))}
	for _, p := range parts {
		out = binary.BigEndian.AppendUint16(out, uint16(len(p)))
	}
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// streamsCut reports whether CutStreams cut node a's dials to b.
func (m *Mem) streamsCut(a, b string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.noStreams[[2]string{a, b}]
}

// Addr returns the transport's "10.x.y.z:7946".
func (t *MemTransport) Addr() string { return t.addr }

// Counters returns what t has sent so far.
func (t *MemTransport) Counters() Counters {
	return Counters{
		PacketBytes: t.packetBytes.Load(),
		Packets:     t.packets.Load(),
		StreamBytes: t.streamBytes.Load(),
		Streams:     t.streams.Load(),
	}
}

// Memberlist's packet message types that countPacket looks into.
const (
	compoundMsg = 7
	userMsg     = 8
	hasCrcMsg   = 12
)

// countPacket adds packet b's bytes to packetKinds by what it carries:
// memberlist's message type (0 ping, 2 ack, 3 suspect, 4 alive, 5 dead,
// ...), or for a user message 256 plus the first byte of its payload
// (the gossip layer's message type). A compound packet's parts count
// each under its own kind, its header under compound (7); a CRC header
// counts under 12.
func (t *MemTransport) countPacket(b []byte) {
	if len(b) == 0 {
		return
	}
	switch b[0] {
	case hasCrcMsg:
		if len(b) < 5 {
			t.packetKinds[hasCrcMsg].Add(int64(len(b)))
			return
		}
		t.packetKinds[hasCrcMsg].Add(5)
		t.countPacket(b[5:])
	case compoundMsg:
		n := 0
		if len(b) >= 2 {
			n = int(b[1])
		}
		hdr := 2 + 2*n
		if len(b) < hdr {
			t.packetKinds[compoundMsg].Add(int64(len(b)))
			return
		}
		t.packetKinds[compoundMsg].Add(int64(hdr))
		off := hdr
		for i := range n {
			l := int(binary.BigEndian.Uint16(b[2+2*i:]))
			if off+l > len(b) {
				break
			}
			t.countPacket(b[off : off+l])
			off += l
		}
		t.packetKinds[compoundMsg].Add(int64(len(b) - off))
	case userMsg:
		if len(b) < 2 {
			t.packetKinds[userMsg].Add(int64(len(b)))
			return
		}
		t.packetKinds[256+int(b[1])].Add(int64(len(b)))
		t.packetMsgs[256+int(b[1])].Add(1)
	default:
		t.packetKinds[b[0]].Add(int64(len(b)))
		t.packetMsgs[b[0]].Add(1)
	}
}

// Kind is what the packets t sent carried of one kind: the bytes, and
// the messages (a compound packet's parts count one each; headers none).
type Kind struct{ Bytes, Messages int64 }

// PacketKinds returns what the packets t sent so far carried, by kind
// (countPacket): a memberlist message type, or 256 plus the gossip
// layer's message type for a user message.
func (t *MemTransport) PacketKinds() map[int]Kind {
	out := map[int]Kind{}
	for i := range t.packetKinds {
		if n := t.packetKinds[i].Load(); n > 0 {
			out[i] = Kind{Bytes: n, Messages: t.packetMsgs[i].Load()}
		}
	}
	return out
}

// StreamKinds returns, by memberlist message type (the first byte the
// dialler wrote), how many streams t dialled and the bytes they carried
// both ways.
func (t *MemTransport) StreamKinds() (count, bytes map[byte]int64) {
	count, bytes = map[byte]int64{}, map[byte]int64{}
	for i := range t.kinds {
		if n := t.kinds[i].Load(); n > 0 {
			count[byte(i)], bytes[byte(i)] = n, t.kindBytes[i].Load()
		}
	}
	return count, bytes
}

// Dropped is the number of packets dropped because t's queue was full.
func (t *MemTransport) Dropped() int64 { return t.dropped.Load() }

func (t *MemTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.ip, 7946, nil
}

func (t *MemTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *MemTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	t.packetBytes.Add(int64(len(b)))
	t.packets.Add(1)
	t.countPacket(b)
	dest, ok := t.net.peer(t.name, a.Addr)
	if !ok {
		return now, nil // lost, as a datagram to nowhere is
	}
	if kinds := t.net.stripped(dest.name); kinds != nil {
		if b = without(b, kinds); b == nil {
			return now, nil
		}
	}
	p := &memberlist.Packet{Buf: append([]byte(nil), b...), From: &net.UDPAddr{IP: t.ip, Port: 7946}}
	deliver := func() {
		p.Timestamp = time.Now()
		select {
		case dest.packetCh <- p:
		default:
			dest.dropped.Add(1)
		}
	}
	if t.net.Latency > 0 {
		time.AfterFunc(t.net.Latency, deliver)
	} else {
		deliver()
	}
	return now, nil
}

func (t *MemTransport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

func (t *MemTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *MemTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	dest, ok := t.net.peer(t.name, a.Addr)
	if !ok || t.net.streamsCut(t.name, dest.name) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("testnet: %s cannot reach %s", t.name, a.Addr)}
	}
	if t.net.Latency > 0 {
		time.Sleep(t.net.Latency) // the handshake's first leg
	}
	lp, rp := net.Pipe()
	local, remote := &memConn{Conn: lp, local: t.ip, remote: dest.ip}, &memConn{Conn: rp, local: dest.ip, remote: t.ip}
	local.peer, remote.peer = remote, local
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case dest.streamCh <- &countingConn{Conn: remote, n: &dest.streamBytes, to: dest.to(t.addr)}:
	case <-dest.done:
		local.Close()
		remote.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("testnet: %s is shut down", a.Addr)}
	case <-timer.C:
		local.Close()
		remote.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("testnet: dial %s timed out", a.Addr)}
	}
	t.streams.Add(1)
	kc := &kindConn{Conn: &countingConn{Conn: local, n: &t.streamBytes, to: t.to(dest.addr)}, t: t}
	kc.kind.Store(-1)
	return kc, nil
}

func (t *MemTransport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown takes t off the network; packets to it are lost from then on.
func (t *MemTransport) Shutdown() error {
	t.once.Do(func() {
		close(t.done)
		t.net.mu.Lock()
		if t.net.byAddr[t.addr] == t {
			delete(t.net.byAddr, t.addr)
		}
		t.net.mu.Unlock()
	})
	return nil
}

// kindConn is a dialled stream that counts itself, on its first write,
// under that write's first byte, and its bytes both ways under it.
type kindConn struct {
	net.Conn
	t    *MemTransport
	kind atomic.Int32 // -1 until the first write
}

func (c *kindConn) Write(b []byte) (int, error) {
	if len(b) > 0 && c.kind.CompareAndSwap(-1, int32(b[0])) {
		c.t.kinds[b[0]].Add(1)
	}
	n, err := c.Conn.Write(b)
	c.count(n)
	return n, err
}

func (c *kindConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.count(n)
	return n, err
}

func (c *kindConn) count(n int) {
	if k := c.kind.Load(); k >= 0 {
		c.t.kindBytes[k].Add(int64(n))
	}
}

// memConn is one end of a pipe with TCP addresses, which memberlist logs
// and compares.
type memConn struct {
	net.Conn
	local, remote net.IP
	peer          *memConn // the pipe's other end
}

func (c *memConn) LocalAddr() net.Addr  { return &net.TCPAddr{IP: c.local, Port: 7946} }
func (c *memConn) RemoteAddr() net.Addr { return &net.TCPAddr{IP: c.remote, Port: 7946} }

// Close clears the deadlines of both ends before closing: net.Pipe's
// Close leaves a deadline's timer (time.AfterFunc) armed, and the timer
// holds the pipe until it fires (memberlist sets 10 s deadlines), so a
// simulation of 1,000 nodes pulling records kept hundreds of thousands
// of closed pipes alive at once. Both ends: a pipe refuses deadlines
// once either end is closed, so the end closed second could not clear
// its own (300 simulated nodes still held 370 MB of pipes). The other
// end's deadline no longer matters: its reads and writes now fail at
// once.
func (c *memConn) Close() error {
	c.Conn.SetDeadline(time.Time{}) //nolint:errcheck // a closed pipe's error changes nothing
	if c.peer != nil {
		c.peer.Conn.SetDeadline(time.Time{}) //nolint:errcheck // as above
	}
	return c.Conn.Close()
}
