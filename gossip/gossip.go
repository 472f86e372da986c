// Package gossip spreads cluster membership and a replicated map of
// crdt.Record between Starling nodes, over hashicorp/memberlist (SWIM: Das,
// Gupta and Motivala, "SWIM: Scalable Weakly-consistent Infection-style
// Process Group Membership Protocol", DSN 2002, with Lifeguard's extensions).
//
// It knows nothing about containers: records are opaque last-writer-wins
// registers keyed "kind/namespace/name", and the State that holds them is
// supplied by the caller (the node's durable store, or MemState in tests).
//
// A write travels three ways:
//
//   - Deltas. Publish queues a short record (Config.AnnounceAbove, 256
//     bytes) on a memberlist
//     TransmitLimitedQueue; memberlist piggybacks it on its gossip and probe
//     packets. A node that receives a delta which changes its State queues it
//     again (memberlist does not re-gossip user messages; serf does the same),
//     so a write reaches every node epidemically in O(log N) gossip rounds.
//   - Announcements. A longer record is sent by its writer over
//     memberlist's reliable stream (TCP) to 3 random members, and
//     announced: a small have message (its entry and the announcer) is
//     gossiped, a node that lacks the record pulls it from an announcer
//     and then announces it itself. A record that fits a packet (a node
//     record) is pulled with one packet each way, a larger one over TCP,
//     so no node opens more than a few connections per write. Every
//     node sends each gossiped message RetransmitMult * ceil(log10(N+1))
//     times: 16 at 1,000 nodes, where a 50-byte have in place of a
//     400-byte delta cut what one node record costs the cluster from 6.3
//     to 1.2 MB.
//   - Anti-entropy. Every DigestInterval (10 s, whatever the cluster's
//     size) a node sends a fixed-size digest of its map (2 KiB, see
//     digest.go) to a random live member, which syncs the buckets that
//     differ: per-key entries, then the records one side lacks. memberlist's
//     push/pull swaps the same digests too (on Join, and every
//     PushPullInterval, which memberlist scales with the cluster: x1 up to
//     32 nodes, x3 at 100, x6 at 1,000, so 30 s to 180 s with the LAN
//     default: too slow alone, as 312 of 1,000 records missing at one node
//     after 4 min of forming showed). Idle cost does not grow with the
//     number of records.
//
// Membership (alive, suspect, dead, left) comes from memberlist's failure
// detector; round-trip times from Vivaldi network coordinates (Dabek, Cox,
// Kaashoek and Morris, "Vivaldi: A Decentralized Network Coordinate System",
// SIGCOMM 2004) computed by serf's coordinate package from memberlist's probes.
package gossip

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// State is where replicated records live. The node's durable store implements
// it; tests use MemState. Its methods are called concurrently, but never
// concurrently for the same key (Cluster serialises Apply per key), and never
// after Cluster.Shutdown or Cluster.Leave has returned.
//
// While a Cluster runs, records must change only through it (Publish and what
// it receives): the Cluster keeps a summary of every record (key, version,
// hash) to answer anti-entropy digests without reading the store. After
// changing the State behind its back (for example purging expired
// tombstones), call Cluster.Reindex.
type State interface {
	// Apply merges r by crdt.Record.Wins and reports whether it changed
	// anything (r's key was absent or r won). The change is durable when
	// Apply returns.
	Apply(r crdt.Record) (bool, error)
	// Get returns the record held for key; ok is false if there is none.
	Get(key string) (r crdt.Record, ok bool, err error)
	// Snapshot returns every record held. The Cluster reads it once in New
	// and in Reindex; the map is not modified.
	Snapshot() (crdt.Map, error)
}

// MemberState is a member's state in this node's view (Member.State).
type MemberState string

// Member states.
const (
	StateAlive   MemberState = "alive"   // answering probes
	StateSuspect MemberState = "suspect" // missed a probe, not yet declared dead (see Member)
	StateDead    MemberState = "dead"    // declared failed by the failure detector
	StateLeft    MemberState = "left"    // announced a graceful leave
)

// Up reports whether s counts as up: alive or suspect (suspect alone
// moves nothing).
func (s MemberState) Up() bool { return s == StateAlive || s == StateSuspect }

// Member is one node as seen by the local node.
type Member struct {
	Name string
	Addr string // IP address memberlist reaches it at
	Port uint16 // memberlist (gossip) port
	// State is StateAlive, StateSuspect, StateDead or StateLeft.
	//
	// StateSuspect is this node's own view: its last probe of the member,
	// direct and indirect, went unanswered, and the member has not since
	// answered a probe, sent an update, or been declared dead. memberlist
	// does not expose suspicion (no EventDelegate call; the Node.State
	// that Members returns is never set, an unexported field shadows it), so
	// a suspicion raised only by other nodes does not show here.
	//
	// StateLeft versus StateDead: memberlist reports both through
	// NotifyLeave alike; a leave intent that Leave gossips first (as serf
	// does) tells them apart.
	State MemberState
	Meta  []byte    // the member's metadata (Config.Meta), at most 512 bytes
	Since time.Time // when it entered State, by the local clock
	// dmax is the highest delegate protocol version the member reads
	// (memberlist.Node.DMax; protoS2: compressed records, protoPush: push
	// messages).
	dmax uint8
	// node is the member as memberlist sends to it (Addr parsed, Port,
	// dmax), made again when one of them changes: peer returns it on
	// every question and ping.
	node *memberlist.Node
}

// setNode makes m.node from m's address, port and dmax.
func (m *Member) setNode(ip net.IP) {
	m.node = &memberlist.Node{Name: m.Name, Addr: ip, Port: m.Port, DMax: m.dmax}
}

// Errors returned (wrapped; match with errors.Is).
var (
	// ErrKeyMismatch: Join reached seeds but no exchange could be
	// decrypted, on one side or the other: the keys differ, or one side has
	// encryption and the other does not.
	ErrKeyMismatch = errors.New("no peer could decrypt our messages: is this node's gossip key the cluster's? (a node that missed a key rotation takes the new key from a peer)")
	// ErrNameTaken: Join found a live member with this node's name at
	// another address. Nothing was displaced; the node should not run.
	ErrNameTaken = errors.New("another node already uses this name")
	// ErrClosed: the Cluster was shut down or left.
	ErrClosed = errors.New("gossip: cluster is shut down")
	// ErrConfig: a Config field is out of range.
	ErrConfig = errors.New("gossip: invalid config")

	errBusy = errors.New("gossip: busy")
)

// MemState is an in-memory State for tests and tools. It is safe for
// concurrent use. The zero value is not usable: call NewMemState.
type MemState struct {
	mu sync.Mutex
	m  crdt.Map
}

// NewMemState returns an empty MemState.
func NewMemState() *MemState { return &MemState{m: crdt.Map{}} }

// NewMemStateFrom returns a MemState holding a copy of m.
func NewMemStateFrom(m crdt.Map) *MemState { return &MemState{m: m.Clone()} }

// Apply merges r (crdt.Map.Apply). It never fails.
func (s *MemState) Apply(r crdt.Record) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Apply(r), nil
}

// Get returns the record held for key.
func (s *MemState) Get(key string) (crdt.Record, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.m[key]
	return r, ok, nil
}

// Snapshot returns a copy of the map (Values shared).
func (s *MemState) Snapshot() (crdt.Map, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Clone(), nil
}

// Len returns the number of records held.
func (s *MemState) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
