package gossip

import (
	"fmt"
	"log"
	"log/slog"
	"net/netip"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// Alive is an alive message for a member, as Config.CheckAlive sees it:
// a peer's untrusted bytes.
type Alive struct {
	Name string
	Addr netip.AddrPort // the address and gossip port it gives (IPv4 unmapped)
	Meta []byte         // its metadata (at most 512 bytes)
	// HeldAddr and HeldMeta are what this node holds of the member (the
	// zero AddrPort and nil when it knows none).
	HeldAddr netip.AddrPort
	HeldMeta []byte
}

// Config configures a Cluster. Start from DefaultConfig; for the failure
// detection and gossip knobs a zero value means "the default".
type Config struct {
	// Name identifies the node in the cluster: unique, 1 to 255 bytes of
	// UTF-8 without control characters (the same rule as crdt.Record.Origin).
	Name string

	// BindAddr is the IP address memberlist listens on (UDP and TCP).
	BindAddr string
	// BindPort is the port memberlist listens on, UDP and TCP; 0 picks a free
	// port (tests). Ignored when Transport is set.
	BindPort int
	// AdvertiseAddr is the address other nodes reach this one at; "" lets
	// memberlist choose (the bound address, or a private IP when bound to
	// 0.0.0.0).
	AdvertiseAddr string
	// AdvertisePort goes with AdvertiseAddr; 0 means the bound port.
	AdvertisePort int

	// SecretKey is the AES key (16, 24 or 32 bytes) that encrypts and
	// authenticates all gossip; nil disables encryption (tests only). Nodes
	// with different keys cannot join each other.
	SecretKey []byte
	// ExtraKeys are further keys accepted on receipt (never used to
	// send), for a key rotation in progress (Cluster.InstallKey,
	// UseKey, RemoveKey; memberlist's keyring, as Consul and serf do).
	ExtraKeys [][]byte

	// Meta is small node metadata (at most 512 bytes, memberlist.MetaMaxSize)
	// gossiped with membership, e.g. the node's API address.
	Meta []byte

	// ProbeInterval is the time between failure-detection probes of a random
	// member.
	ProbeInterval time.Duration
	// ProbeTimeout is how long to wait for a probe's ack before asking other
	// nodes to probe indirectly; about the 99th percentile of RTT.
	ProbeTimeout time.Duration
	// SuspicionMult scales how long a suspect node has to refute before it
	// is declared dead: SuspicionMult * max(1, log10(N)) * ProbeInterval.
	SuspicionMult int
	// GossipInterval is the time between gossip rounds, each sending queued
	// deltas and membership changes to GossipNodes random members.
	GossipInterval time.Duration
	// GossipNodes is the number of members each gossip round sends to.
	GossipNodes int
	// RetransmitMult: each membership message (alive, suspect, dead),
	// delta or have message is sent RetransmitMult * ceil(log10(N+1))
	// times by every node that queues it. Gossip where every node that
	// learns a message sends it k times leaves about e^-k of the nodes
	// unreached (Demers et al. 1987), and fewer sends save no bytes
	// worth the stragglers: with records sent 8 times at 300 nodes
	// (memberlist's 4 gives 12), one write in ten missed a node until
	// the next digest exchange, up to 12 s later.
	RetransmitMult int
	// AnnounceAbove: a record whose encoding is longer, in bytes, is
	// announced (a have message of about 50 bytes) and pulled once by
	// each node with one packet each way, rather than gossiped whole.
	// Every node sends every message it learns k times (RetransmitMult:
	// 16 at 1,000 nodes), so a delta costs the cluster N * k * its size,
	// an announcement N * k * 50 plus N pulls: for a 400-byte node record
	// at 1,000 nodes 6.3 MB against 1.2 MB. Shorter records spread as
	// deltas, without a pull's round trip per hop. Default 256 (a node
	// record is 350 bytes and more). Records too large for a packet are
	// always announced, and pulled over TCP.
	AnnounceAbove int
	// PushPullInterval is the time between anti-entropy exchanges with a
	// random member. memberlist scales it by ceil(log2(N) - log2(32)) + 1
	// beyond 32 nodes (pushPullScale, memberlist util.go): 30 s becomes
	// 90 s at 100 nodes, 150 s at 500 and 180 s at 1,000, the wait for a
	// lost delta's repair.
	PushPullInterval time.Duration
	// DigestInterval is the time between digest exchanges this node
	// starts with a random live member, besides memberlist's push/pull:
	// it sends its fixed-size digest (2 KiB, whatever the number of
	// records) and the member syncs the buckets that differ (digest.go).
	// It is not scaled with the cluster, so a lost delta is repaired in
	// about this time at any size (memberlist's push/pull takes 180 s at
	// 1,000 nodes). Negative turns the exchanges off.
	DigestInterval time.Duration
	// TCPTimeout bounds each reliable (TCP) exchange: push/pull, syncs and
	// pulls of announced records too large for a packet.
	TCPTimeout time.Duration
	// ReconnectInterval is the time between attempts to rejoin a random dead
	// member. memberlist stops talking to dead members, so without this two
	// halves of a healed partition would stay apart (serf does the same).
	ReconnectInterval time.Duration
	// ReconnectTimeout is how long after its death a member stops being
	// retried.
	ReconnectTimeout time.Duration
	// UDPBufferSize is the largest gossip packet memberlist sends, in bytes;
	// it must fit the path MTU. Records whose encoding does not fit one
	// packet (see maxDeltaLen) are sent directly over TCP instead.
	UDPBufferSize int

	// Transport, when set, replaces memberlist's network transport (tests
	// use it to count bytes and drop traffic between groups).
	Transport memberlist.Transport

	// Clock, when set, observes the Version of every record received from
	// another node (hlc.Clock.Update), so that the node's next write is
	// ordered after what it has seen. A record more than hlc.MaxOffset ahead
	// of the local clock is then dropped and logged instead of applied.
	Clock *hlc.Clock

	// Accept, when set, is asked about every record received from another
	// node before it is applied: a record it returns an error for is
	// neither stored nor forwarded (the caller logs and counts the
	// refusal; the error is logged here only at debug level). It runs on
	// memberlist's goroutines and must be quick and safe for concurrent
	// use. Every byte from a peer is untrusted: this is where the layer
	// above checks a record against what its writer may say.
	Accept func(crdt.Record) error

	// CheckAlive, when set, is asked about every alive message (and each
	// member of a push/pull) before memberlist applies it (Alive: what
	// the message says and what this node holds). A message it
	// returns an error for is ignored (memberlist.AliveDelegate): the
	// member's address, metadata and state stay as they were, and it is
	// counted (Cluster.RefusedAlive). It runs on memberlist's goroutines
	// with memberlist's node lock held: it must be quick and must not
	// call into the Cluster. Every byte is untrusted: this is where the
	// layer above binds a name to what may speak for it. With it set, a
	// member declared dead may come back at another address at once
	// (memberlist's DeadNodeReclaimTime), since the check, not the
	// address, tells the member from an impostor.
	CheckAlive func(Alive) error

	// SignMeta, when set, makes the metadata this node gossips: it is
	// called once memberlist has chosen the address and port its alive
	// messages give (New), and its result replaces Meta, so the layer
	// above can sign the address (CheckAlive checks it on the peers).
	SignMeta func(addr netip.AddrPort) []byte

	// Answer, when set, answers the questions of other members (Ask):
	// from is the asker's name, q its payload; the answer's payload (at
	// most 1 KiB; nil: no answer) goes back to it. It runs on
	// memberlist's packet goroutine and must be quick. q is untrusted.
	Answer func(from string, q []byte) []byte

	// Logger receives the package's logs and memberlist's; nil means
	// slog.Default().
	Logger *slog.Logger

	// wireV0 makes the node speak and read delegate protocol version 0
	// only, like a node from before compressed records (tests of a mixed
	// cluster).
	wireV0 bool
	// noPush makes the node read delegate protocol versions up to protoS2
	// only, like a node from before push messages.
	noPush bool
	// noGossip makes the node gossip none of its deltas and
	// announcements (tests of the paths that do not gossip).
	noGossip bool
}

// DefaultConfig returns the defaults: memberlist's DefaultLANConfig knobs,
// bound to 0.0.0.0:7946, no encryption, no name (the caller must set Name).
func DefaultConfig() Config {
	lan := memberlist.DefaultLANConfig()
	return Config{
		BindAddr:         lan.BindAddr,
		BindPort:         lan.BindPort,
		ProbeInterval:    lan.ProbeInterval,
		ProbeTimeout:     lan.ProbeTimeout,
		SuspicionMult:    lan.SuspicionMult,
		GossipInterval:   lan.GossipInterval,
		GossipNodes:      lan.GossipNodes,
		RetransmitMult:   lan.RetransmitMult,
		AnnounceAbove:    256,
		PushPullInterval: lan.PushPullInterval,
		DigestInterval:   10 * time.Second,
		TCPTimeout:       lan.TCPTimeout,
		UDPBufferSize:    lan.UDPBufferSize,
		// serf's defaults (serf config.go): ReconnectInterval 30 s,
		// ReconnectTimeout 24 h.
		ReconnectInterval: 30 * time.Second,
		ReconnectTimeout:  24 * time.Hour,
	}
}

// withDefaults returns c with zero knobs replaced by DefaultConfig's.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.BindAddr == "" {
		c.BindAddr = d.BindAddr
	}
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setInt := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setDur(&c.ProbeInterval, d.ProbeInterval)
	setDur(&c.ProbeTimeout, d.ProbeTimeout)
	setInt(&c.SuspicionMult, d.SuspicionMult)
	setDur(&c.GossipInterval, d.GossipInterval)
	setInt(&c.GossipNodes, d.GossipNodes)
	setInt(&c.RetransmitMult, d.RetransmitMult)
	setInt(&c.AnnounceAbove, d.AnnounceAbove)
	setDur(&c.PushPullInterval, d.PushPullInterval)
	setDur(&c.DigestInterval, d.DigestInterval)
	setDur(&c.TCPTimeout, d.TCPTimeout)
	setInt(&c.UDPBufferSize, d.UDPBufferSize)
	setDur(&c.ReconnectInterval, d.ReconnectInterval)
	setDur(&c.ReconnectTimeout, d.ReconnectTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// minUDPBufferSize leaves room for a useful delta after memberlist's and our
// own overheads (deltaOverhead).
const minUDPBufferSize = 576 // the IPv4 minimum datagram size every host must accept (RFC 791)

func (c Config) validate() error {
	if err := validateName(c.Name); err != nil {
		return fmt.Errorf("%w: Name: %v", ErrConfig, err)
	}
	switch len(c.SecretKey) {
	case 0, 16, 24, 32:
	default:
		return fmt.Errorf("%w: SecretKey is %d bytes, want 16, 24 or 32", ErrConfig, len(c.SecretKey))
	}
	if len(c.Meta) > memberlist.MetaMaxSize {
		return fmt.Errorf("%w: Meta is %d bytes, max %d", ErrConfig, len(c.Meta), memberlist.MetaMaxSize)
	}
	if c.BindPort < 0 || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return fmt.Errorf("%w: port out of range", ErrConfig)
	}
	for _, d := range []time.Duration{c.ProbeInterval, c.ProbeTimeout, c.GossipInterval, c.PushPullInterval, c.TCPTimeout, c.ReconnectInterval, c.ReconnectTimeout} {
		if d < 0 {
			return fmt.Errorf("%w: negative interval %s", ErrConfig, d)
		}
	}
	if c.SuspicionMult < 0 || c.GossipNodes < 0 || c.RetransmitMult < 0 || c.AnnounceAbove < 0 {
		return fmt.Errorf("%w: negative multiplier", ErrConfig)
	}
	if c.UDPBufferSize != 0 && c.UDPBufferSize < minUDPBufferSize {
		return fmt.Errorf("%w: UDPBufferSize %d, min %d", ErrConfig, c.UDPBufferSize, minUDPBufferSize)
	}
	return nil
}

// validateName applies crdt's Origin rule to node names, since the node layer
// uses its name as the Origin of its writes and our messages carry it.
func validateName(name string) error {
	if name == "" || len(name) > crdt.MaxOriginLen {
		return fmt.Errorf("%d bytes, want 1 to %d", len(name), crdt.MaxOriginLen)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("%q is not valid UTF-8", name)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%q has control character %U", name, r)
		}
	}
	return nil
}

// memberlistConfig translates c (with defaults applied) for memberlist.
func (c Config) memberlistConfig(d *delegate, logw *logWriter) (*memberlist.Config, error) {
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.Name
	mc.BindAddr = c.BindAddr
	mc.BindPort = c.BindPort
	mc.AdvertiseAddr = c.AdvertiseAddr
	mc.AdvertisePort = c.AdvertisePort
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = c.BindPort
	}
	mc.ProbeInterval = c.ProbeInterval
	mc.ProbeTimeout = c.ProbeTimeout
	mc.SuspicionMult = c.SuspicionMult
	mc.GossipInterval = c.GossipInterval
	mc.GossipNodes = c.GossipNodes
	mc.RetransmitMult = c.RetransmitMult
	mc.PushPullInterval = c.PushPullInterval
	mc.TCPTimeout = c.TCPTimeout
	mc.UDPBufferSize = c.UDPBufferSize
	// memberlist's LZW compression allocates a dictionary per message:
	// on small packets (probes, questions, most deltas) it costs far more
	// CPU than it saves bytes (the scale simulation spent 29 % of its CPU
	// in it at 100 nodes), and large records are pulled once per node.
	mc.EnableCompression = false
	// This version reads compressed records (compress.go) and push
	// messages (push.go) and still speaks version 0, which every earlier
	// node reads.
	mc.DelegateProtocolMin, mc.DelegateProtocolVersion, mc.DelegateProtocolMax = 0, 0, protoPush
	switch {
	case c.wireV0:
		mc.DelegateProtocolMax = 0
	case c.noPush:
		mc.DelegateProtocolMax = protoS2
	}
	mc.Transport = c.Transport
	if len(c.SecretKey) > 0 {
		kr, err := memberlist.NewKeyring(c.ExtraKeys, c.SecretKey)
		if err != nil {
			return nil, fmt.Errorf("%w: SecretKey: %v", ErrConfig, err)
		}
		mc.Keyring = kr
		mc.GossipVerifyIncoming = true
		mc.GossipVerifyOutgoing = true
	}
	mc.Delegate = d
	mc.Events = d
	mc.Alive = d // each member's delegate protocol maximum, as it restarts; CheckAlive
	if c.CheckAlive != nil {
		// Any positive time: a dead member's name may be taken at a new
		// address as soon as it is dead (a node back from a crash at a new
		// DHCP lease), since CheckAlive refuses what its key did not sign.
		// Without it memberlist kept the old address until it reaped the
		// member (memberlist.Config.GossipToTheDeadTime, 30 s on a LAN) and the node was
		// "a second node" meanwhile.
		mc.DeadNodeReclaimTime = time.Nanosecond
	}
	mc.Ping = d
	mc.Conflict = d
	mc.Logger = log.New(logw, "", 0)
	return mc, nil
}
