package gossip

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// Every node picks the same resyncers for a returning member, whatever
// order it lists the members in; never the member itself; the work of
// many returns is spread over the cluster.
func TestResyncersAreFewAgreedAndSpread(t *testing.T) {
	var live []string
	for i := range 100 {
		live = append(live, nodeName(i))
	}
	got := resyncers("n07", live, resyncPeers)
	if len(got) != resyncPeers || slices.Contains(got, "n07") {
		t.Fatalf("resyncers of n07: %v", got)
	}
	reversed := slices.Clone(live)
	slices.Reverse(reversed)
	if other := resyncers("n07", reversed, resyncPeers); fmt.Sprint(other) != fmt.Sprint(got) {
		t.Fatalf("another order of members gave %v, not %v", other, got)
	}
	load := map[string]int{}
	for _, back := range live {
		for _, r := range resyncers(back, live, resyncPeers) {
			load[r]++
		}
	}
	// 300 resyncs over 100 nodes: none should carry more than ~4x its share.
	for n, l := range load {
		if l > 12 {
			t.Errorf("%s resyncs %d of 100 returns", n, l)
		}
	}
	if got := resyncers("n00", []string{"n00", "n01"}, resyncPeers); fmt.Sprint(got) != "[n01]" {
		t.Errorf("two nodes: %v", got)
	}
}

// A member back from a partition is resynced by resyncPeers members, not
// by every node that saw it gone (issue 12: 2(N-1) push/pulls on one node).
func TestReturningMemberIsResyncedByAFew(t *testing.T) {
	// No periodic push/pull. Digest exchanges run as in production
	// (every 2 s here): with none, a delta broadcast lost inside the
	// majority under the load of `make test` was never repaired, and the
	// test failed on a record n00 had nothing to do with (CI, stop 46).
	// The resyncs counted below are the return's own (resyncWith), which
	// the periodic exchanges do not touch.
	tc := newTCluster(t, 8, func(i int, cfg *Config) { cfg.DigestInterval, cfg.PushPullInterval = 2*time.Second, time.Hour })
	tc.joinAll()
	partitionFirst(t, tc)
	resyncs := func() int {
		n := 0
		for _, nd := range tc.nodes[1:] {
			nd.c.resyncMu.Lock()
			n += nd.c.resyncs["n00"]
			nd.c.resyncMu.Unlock()
		}
		return n
	}
	before := resyncs()
	written := tc.nodes[0].publish(t, "test/while/away", "x")
	stayed := tc.nodes[3].publish(t, "test/while/gone", "y")
	tc.net.Heal()
	// Membership heals with no periodic push/pull here: on a machine
	// busy with the rest of `make test`, false suspicions during the
	// partition can take longer than 20 s to clear (seen once). What
	// the test asserts is the count of resyncs, not their speed.
	tc.waitMembers(8, 45*time.Second)
	m := tc.waitConverged(10 * time.Second)
	if got := m["test/while/away"]; !got.Equal(written) {
		t.Fatalf("the returning member's write did not spread: %v", got)
	}
	if got := m["test/while/gone"]; !got.Equal(stayed) {
		t.Fatalf("a write made while it was away did not reach it: %v", got)
	}
	time.Sleep(4 * time.Second) // the resyncs run 1 s and 3 s after the return
	if n := resyncs() - before; n < 1 || n > resyncPeers {
		t.Fatalf("%d members resynced with n00, want 1 to %d", n, resyncPeers)
	}
}

// A record too large for a delta reaches every node while its writer
// answers only a few pulls (each holder serves some): not one connection
// per member (issue 12: 999 per write at 1,000 nodes).
func TestBigRecordSpreadsWithoutTheWriterSendingToAll(t *testing.T) {
	const n = 16
	tc := newTCluster(t, n, nil)
	tc.joinAll()
	writer := tc.nodes[0]
	base := writer.c.pullsAnswered.Load()
	big := writer.publishSized(t, "test/big/manifest", 8<<10)
	took := tc.spread(big, time.Now(), 20*time.Second)
	served := writer.c.pullsAnswered.Load() - base
	total := int64(0)
	for _, nd := range tc.nodes {
		total += nd.c.pullsAnswered.Load()
	}
	t.Logf("8 KiB record reached %d nodes in %s; the writer answered %d pulls, all nodes %d", n, took, served, total)
	if served >= n/2 {
		t.Fatalf("the writer answered %d pulls of %d nodes", served, n-1)
	}
}

// A large record written again while nodes pull the previous version
// reaches them at its last version at once, not at the next anti-entropy
// exchange (a node status grows past a packet and changes with every
// replica: the e2e failover test found nodes stuck on an old one).
func TestBigRecordRewrittenQuicklyConvergesOnTheLastWrite(t *testing.T) {
	tc := newTCluster(t, 5, func(i int, cfg *Config) { cfg.PushPullInterval = time.Hour })
	tc.joinAll()
	writer := tc.nodes[1]
	var last crdt.Record
	for i := range 5 {
		last = writer.publishSized(t, "test/big/status", 4<<10+i)
		time.Sleep(15 * time.Millisecond)
	}
	took := tc.spread(last, time.Now(), 5*time.Second)
	t.Logf("the 5th of 5 quick writes of a 4 KiB record reached every node in %s", took)
}

// After a partition heals, every member of each side is resynced by a few
// members of the other side: at least one (the members that come back
// with it, its own side, saw nothing to resync and are not counted on),
// at most 2*resyncPeers (members whose views of who stayed up differ,
// one having been suspected during the cut, may each pick another).
func TestHealedPartitionResyncsEveryMemberByAFew(t *testing.T) {
	tc := newTCluster(t, 8, nil)
	tc.joinAll()
	a, b := []string{"n00", "n01", "n02", "n03"}, []string{"n04", "n05", "n06", "n07"}
	tc.net.Partition(a, b)
	eventually(t, 15*time.Second, func() (bool, string) {
		for _, nd := range tc.nodes {
			if nd.c.NumMembers() != 4 {
				return false, fmt.Sprintf("%s sees %d live members, want 4", nd.name, nd.c.NumMembers())
			}
		}
		return true, ""
	})
	count := func(x string, by []string) int {
		n := 0
		for _, nd := range tc.nodes {
			if slices.Contains(by, nd.name) {
				nd.c.resyncMu.Lock()
				n += nd.c.resyncs[x]
				nd.c.resyncMu.Unlock()
			}
		}
		return n
	}
	before := map[string]int{}
	for _, x := range a {
		before[x] = count(x, b)
	}
	for _, x := range b {
		before[x] = count(x, a)
	}
	tc.net.Heal()
	tc.waitMembers(8, 20*time.Second)
	time.Sleep(4 * time.Second)
	for _, x := range a {
		if n := count(x, b) - before[x]; n < 1 || n > 2*resyncPeers {
			t.Errorf("%s was resynced by %d members of the other side, want 1 to %d", x, n, 2*resyncPeers)
		}
	}
	for _, x := range b {
		if n := count(x, a) - before[x]; n < 1 || n > 2*resyncPeers {
			t.Errorf("%s was resynced by %d members of the other side, want 1 to %d", x, n, 2*resyncPeers)
		}
	}
}

// A dead member draws reconnect attempts from reconnectPeers members a
// ReconnectInterval, not from every member (serf's way: N-1 per interval,
// and a push/pull from each member whose tick fell before it heard the
// member was back).
func TestDeadMemberIsReconnectedByAFew(t *testing.T) {
	tc := newTCluster(t, 10, nil)
	tc.joinAll()
	partitionFirst(t, tc)
	attempts := func() (n int64) {
		for _, nd := range tc.nodes[1:] {
			n += nd.c.reconnects.Load()
		}
		return n
	}
	before, t0 := attempts(), time.Now()
	time.Sleep(3 * time.Second)
	got := attempts() - before
	intervals := time.Since(t0).Seconds() / fastConfig("x").ReconnectInterval.Seconds()
	t.Logf("%d reconnect attempts to one dead member by the 9 live members over %.0f intervals", got, intervals)
	if limit := int64(reconnectPeers * (intervals + 3)); got > limit || got == 0 {
		t.Fatalf("%d reconnect attempts over %.0f intervals, want 1 to %d (%d members each interval)", got, intervals, limit, reconnectPeers)
	}
	tc.net.Heal()
	tc.waitMembers(10, 20*time.Second)
}

// A record longer than AnnounceAbove but short enough for a packet (a
// node record) is announced, and each node that was not sent it
// directly pulls it with one packet each way: every node sending every
// 350-byte delta 16 times made the deltas 6.3 of the 10.4 MB a node's
// return cost at 1,000 nodes. A shorter record still spreads as a
// delta, with no pull.
func TestMidSizeRecordIsAnnouncedAndPulledByPacket(t *testing.T) {
	const n = 10
	// No anti-entropy: its syncs pull too.
	tc := newTCluster(t, n, func(i int, cfg *Config) { cfg.PushPullInterval, cfg.DigestInterval = time.Hour, -1 })
	tc.joinAll()
	answers := func() (pulls, packets int64) {
		for _, nd := range tc.nodes {
			pulls += nd.c.pullsAnswered.Load()
			packets += nd.c.packetAnswers.Load()
		}
		return pulls, packets
	}
	writer := tc.nodes[0]
	pulls0, packets0 := answers()
	mid := writer.publishSized(t, "test/mid/status", 400)
	took := tc.spread(mid, time.Now(), 10*time.Second)
	pulls, packets := answers()
	t.Logf("a 400-byte record reached %d nodes in %s: %d pulls answered, %d by packet", n, took, pulls-pulls0, packets-packets0)
	// The writer sends it directly to directPeers members; the others
	// pull it.
	if want := int64(n - 1 - directPeers); pulls-pulls0 < want || packets-packets0 != pulls-pulls0 {
		t.Fatalf("%d pulls answered, %d by packet; want at least %d, all by packet", pulls-pulls0, packets-packets0, want)
	}

	pulls0, _ = answers()
	small := writer.publishSized(t, "test/small/status", 100)
	tc.spread(small, time.Now(), 10*time.Second)
	if pulls, _ := answers(); pulls != pulls0 {
		t.Fatalf("a 100-byte record was pulled %d times, want 0 (a delta)", pulls-pulls0)
	}
}

// Pulls answered with a packet are answered on memberlist's packet
// handler: a flood of them, forged or replayed, is bounded (the rest go
// to the TCP path, itself bounded), and a pull from a stranger reads
// nothing.
func TestPacketPullsAreBounded(t *testing.T) {
	tc := newTCluster(t, 2, nil)
	tc.joinAll()
	holder := tc.nodes[0]
	r := holder.publishSized(t, "test/mid/flood", 400)
	base := holder.c.packetAnswers.Load()
	if !holder.c.answerPullByPacket(pull{From: "stranger", Keys: []string{r.Key}}) || holder.c.packetAnswers.Load() != base {
		t.Fatalf("a stranger's pull was answered")
	}
	// A record too big for a packet goes to the TCP path and spends none
	// of the rate.
	big := holder.publishSized(t, "test/mid/big", 4*holder.c.maxDelta)
	for range 2 * packetPullRate {
		if holder.c.answerPullByPacket(pull{From: tc.nodes[1].name, Keys: []string{big.Key}}) {
			t.Fatalf("a record of %d bytes was answered by packet", len(big.Value))
		}
	}
	if tokens := holder.c.packetPulls.Tokens(); tokens < packetPullRate-1 {
		t.Fatalf("pulls of a record too big for a packet left %.0f of %d tokens", tokens, packetPullRate)
	}
	byPacket := 0
	for range 5 * packetPullRate {
		if holder.c.answerPullByPacket(pull{From: tc.nodes[1].name, Keys: []string{r.Key}}) {
			byPacket++
		}
	}
	// The loop takes well under a second: the burst, and what the rate
	// refilled meanwhile.
	if byPacket < packetPullRate/2 || byPacket > 2*packetPullRate {
		t.Fatalf("%d of %d pulls answered by packet, want about %d (packetPullRate)", byPacket, 5*packetPullRate, packetPullRate)
	}
	if holder.c.answerPullByPacket(pull{From: tc.nodes[1].name, Keys: []string{"test/a/b", r.Key}}) {
		t.Fatalf("a pull of two keys was answered by packet")
	}
}

// A digest from a member this node holds dead (a resync sent from the
// other side of a healed partition before this node heard the sender's
// refutation) is answered with a push/pull, which carries the member
// lists the digest does not; a digest from a stranger is dropped.
func TestDigestFromAMemberHeldDeadRejoinsIt(t *testing.T) {
	tc := newTCluster(t, 4, nil)
	tc.joinAll()
	partitionFirst(t, tc)
	d := &delegate{c: tc.nodes[1].c}
	base := tc.nodes[1].c.rejoins.Load()
	d.NotifyMsg(encodeDigest(digest{From: "stranger"}))
	if got := tc.nodes[1].c.rejoins.Load() - base; got != 0 {
		t.Fatalf("a stranger's digest started %d rejoins", got)
	}
	d.NotifyMsg(encodeDigest(digest{From: "n00", Buckets: tc.nodes[0].c.idx.sums()}))
	if got := tc.nodes[1].c.rejoins.Load() - base; got != 1 {
		t.Fatalf("a digest from n00, held dead, started %d rejoins, want 1", got)
	}
	tc.net.Heal()
	tc.waitMembers(4, 20*time.Second)
}

// partitionFirst cuts n00 off from the rest of tc and waits until every
// other member holds it dead.
func partitionFirst(t *testing.T, tc *tcluster) {
	t.Helper()
	var rest []string
	for _, n := range tc.nodes[1:] {
		rest = append(rest, n.name)
	}
	tc.net.Partition([]string{"n00"}, rest)
	eventually(t, 15*time.Second, func() (bool, string) {
		for _, nd := range tc.nodes[1:] {
			if m, ok := nd.c.Member("n00"); !ok || m.State != StateDead {
				return false, fmt.Sprintf("%s does not see n00 dead", nd.name)
			}
		}
		return true, ""
	})
}

// A node that joins holds the records its seed held before, even when
// the seed's sync request is lost: it reaches the joiner before the
// joiner knows the seed (which drops it, having no address to answer),
// or, here, its stream fails. make demo saw a joiner miss the first
// node's record for over 3 s, until the next digest exchange (10 s); a
// get nodes there did not list that node.
func TestJoinerGetsTheSeedsRecordsWhenTheSeedsSyncIsLost(t *testing.T) {
	// No digest exchanges and no periodic push/pull: only the join's own
	// exchanges can carry the record.
	// The seed holds the record from its store, as after a restart: no
	// delta of it is queued to reach the joiner by gossip.
	written := crdt.Record{Key: "test/seed/before", Value: []byte(`"x"`), Version: hlc.Timestamp{Wall: time.Now().UnixNano()}, Origin: "n00"}
	tc := newTCluster(t, 2, func(i int, cfg *Config) { cfg.DigestInterval, cfg.PushPullInterval = -1, time.Hour }, crdt.Map{written.Key: written})
	seed, joiner := tc.nodes[0], tc.nodes[1] // the seed's name sorts first: it syncs
	tc.net.CutStreams(seed.name, joiner.name)
	if _, err := joiner.c.Join([]string{seed.tr.Addr()}); err != nil {
		t.Fatal(err)
	}
	tc.waitMembers(2, 10*time.Second)
	time.Sleep(200 * time.Millisecond) // the seed's sync has failed by now
	tc.net.RestoreStreams(seed.name, joiner.name)
	m := tc.waitConverged(5 * time.Second)
	if got := m["test/seed/before"]; !got.Equal(written) {
		t.Fatalf("the joiner holds %v, want the seed's record", got)
	}
}

// Digests after joins are bounded: one pending per member, maxAfterJoin
// in all, however many join push/pulls a holder of the gossip key opens.
func TestDigestsAfterJoinsAreBounded(t *testing.T) {
	c := newTCluster(t, 1, nil).nodes[0].c
	if !c.pendAfterJoin("a") || c.pendAfterJoin("a") {
		t.Fatal("want one digest pending for a, not two")
	}
	for i := 1; i < maxAfterJoin; i++ {
		if !c.pendAfterJoin(fmt.Sprint("m", i)) {
			t.Fatalf("digest %d refused below the bound", i)
		}
	}
	if c.pendAfterJoin("one-too-many") {
		t.Fatalf("more than %d digests pending", maxAfterJoin)
	}
}
