package node

import (
	"bytes"
	"crypto/ed25519"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/testnet"
	"github.com/starling-orchestrator/starling/node/member"
	"github.com/starling-orchestrator/starling/node/store"
	"github.com/starling-orchestrator/starling/node/view"
)

// A node that missed a member's alive message (every copy lost: at 300
// simulated nodes one node saw 299 members for 2 m 46 s) learns of the
// member from the member's record within seconds: on its join, and on
// its restart after a leave, which leaves it held "left" (no
// failure detector looks at it again). memberlist's periodic push/pulls,
// which would repair it in the end (30 s here, 180 s at 1,000 nodes),
// are an hour apart in this test.
func TestAMemberMissedByGossipIsLearnedFromItsRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &simCluster{t: t, mem: testnet.NewMem(time.Millisecond), pool: store.NewPool()}
		defer c.stopAll()
		add := func(name string, join []string) *simNode {
			nd := &simNode{name: name, rt: newFakeRuntime(), store: store.NewMemoryPooled(c.pool)}
			nd.conf = func(cfg *testSetup) {
				tune := cfg.tuneGossip
				cfg.tuneGossip = func(g *gossip.Config) { tune(g); g.PushPullInterval = time.Hour }
			}
			c.startNode(nd, join)
			c.nodes = append(c.nodes, nd)
			return nd
		}
		seed := add("i0", nil)
		x := add("i1", []string{seed.tr.Addr()})
		if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool { return x.agent.mem.cluster.NumMembers() == 2 }); !ok {
			t.Fatal("i1 did not join i0")
		}
		c.mem.Strip("i1", 4) // i1 hears no alive message from now on
		// A name minted with a record (a join token's holder can) that
		// never joins costs questions, never a push/pull.
		pushPulls := func() int64 {
			a, _ := seed.tr.StreamKinds()
			b, _ := x.tr.StreamKinds()
			return a[6] + b[6]
		}
		ghost := statusRecord(t, view.NodeStatus{Name: "ghost", Started: time.Now().UTC().Truncate(time.Second)}, "ghost")
		ghost.Version = x.agent.clock.Now()
		_, key, _ := ed25519.GenerateKey(nil)
		ghost, err := crdt.Sign(ghost, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.agent.mem.cluster.Publish(ghost); err != nil {
			t.Fatal(err)
		}
		was := pushPulls()
		time.Sleep(gossip.IntroduceGap + 2*introduceEvery)
		if _, held := seed.agent.views.View().Statuses["ghost"]; !held {
			t.Fatal("i0 does not hold the ghost's record")
		}
		if n := pushPulls() - was; n != 0 {
			t.Fatalf("a record of a node that never joined made %d push/pulls", n)
		}
		m := add("i2", []string{seed.tr.Addr()})
		learns := func(what string) {
			t.Helper()
			if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool {
				s := x.agent.views.View().Statuses["i2"]
				return s.Started.Equal(m.agent.own.status.started.UTC().Truncate(time.Second)) && seed.agent.mem.cluster.NumMembers() == 3
			}); !ok {
				t.Fatalf("%s: i1 never got i2's record of this run, or i0 never saw i2", what)
			}
			if st, _ := x.agent.mem.cluster.State("i2"); st.Up() {
				t.Fatalf("%s: i1 holds i2 %s before anything could tell it: the test lets alive messages through", what, st)
			}
			took, ok := wait(2*time.Minute, 100*time.Millisecond, func() bool {
				st, _ := x.agent.mem.cluster.State("i2")
				return st == gossip.StateAlive
			})
			if limit := 2*introduceEvery + time.Second; !ok || took > limit {
				t.Fatalf("%s: i1 learned of i2 after %v (learned: %v), want within %v of holding its record", what, took, ok, limit)
			}
			t.Logf("%s: i1 learned of i2 %v after holding its record", what, took)
		}
		learns("join")
		// A leave (a dry run's stop, or gossip's Leave), then a prompt
		// restart: every node holds i2 "left".
		time.Sleep(gossip.IntroduceGap)
		m.cancel()
		m.wg.Wait()
		m.agent.stop()
		if err := m.agent.mem.cluster.Leave(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		m.agent.work.replicas.wg.Wait()
		m.agent.mem.cluster.Shutdown()
		m.tr.Shutdown()
		if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool {
			st, _ := x.agent.mem.cluster.State("i2")
			return st == gossip.StateLeft
		}); !ok {
			t.Fatal("i1 does not hold i2 left")
		}
		// A restarted node joins its seeds and the peers it saw last
		// (members.targets): not i1, which would learn of it then.
		c.mem.CutStreams("i2", "i1")
		c.startNode(m, []string{seed.tr.Addr()})
		learns("restart after a leave")
	})
}

func TestMissedMembersAreRecentNodesMembershipDoesNotHoldUp(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	run := func(started time.Time) []byte {
		return member.EncodeMeta(member.Meta{Since: 1, Started: started.UnixNano()})
	}
	members := []gossip.Member{
		{Name: "a", State: gossip.StateAlive},
		{Name: "crashed", State: gossip.StateDead, Since: now.Add(-time.Second), Meta: run(now.Add(-time.Minute))},
		// Restarted at once: its new run started before this node's
		// clock saw it leave; the run in its metadata tells.
		{Name: "left-restarted", State: gossip.StateLeft, Since: now, Meta: run(now.Add(-time.Minute))},
		{Name: "left-no-meta", State: gossip.StateLeft, Since: now.Add(-time.Minute)},
		{Name: "left-same-run", State: gossip.StateLeft, Since: now.Add(-time.Minute), Meta: run(now.Add(-time.Minute))},
		{Name: "self", State: gossip.StateAlive},
		{Name: "suspect", State: gossip.StateSuspect},
	}
	statuses := map[string]view.NodeStatus{
		"a":              {Name: "a", Started: now},
		"crashed":        {Name: "crashed", Started: now.Add(-time.Minute)},
		"left-restarted": {Name: "left-restarted", Started: now.Add(-time.Second)},
		"left-no-meta":   {Name: "left-no-meta", Started: now.Add(-time.Second)},
		"left-same-run":  {Name: "left-same-run", Started: now.Add(-time.Minute)},
		"self":           {Name: "self", Started: now},
		"suspect":        {Name: "suspect", Started: now},
		"never-heard":    {Name: "never-heard", Started: now.Add(-time.Minute)},
		"old":            {Name: "old", Started: now.Add(-introduceWindow - time.Second)},
		"future":         {Name: "future", Started: now.Add(introduceSkew + time.Second)},
		"unstated":       {Name: "unstated"},
	}
	got := missedMembers(members, statuses, "self", now)
	if want := []string{"left-no-meta", "left-restarted", "never-heard"}; !slices.Equal(got, want) {
		t.Fatalf("missedMembers = %v, want %v", got, want)
	}
}

func TestUpQuestionHoldsWhatFits(t *testing.T) {
	long := strings.Repeat("n", 256)
	names := []string{"a", long, "", "b"}
	for range 200 {
		names = append(names, "node-with-a-long-name") // 22 bytes each
	}
	q, asked := encodeUpQuestion(names)
	if len(q) > upQuestionLen || q[0] != upQuestion || asked[0] != "a" || asked[1] != "b" || len(asked) != 2+(upQuestionLen-1-4)/22 {
		t.Fatalf("question of %d bytes asks %d names (first %q)", len(q), len(asked), asked[:2])
	}
	got, ok := decodeUpQuestion(q[1:])
	if !ok || !slices.Equal(got, asked) {
		t.Fatalf("decoded %d names (ok %v), want the %d asked", len(got), ok, len(asked))
	}
	// The quorum's answerer, which takes the questions of one byte from
	// 1 to 64, answers no other question type (as at every version).
	for _, b := range [][]byte{{upQuestion}, {claimQuestion}, q} {
		if ans := (&fence{}).answer("peer", b); ans != nil {
			t.Fatalf("the fence answered question %x", b[:1])
		}
	}
	for _, bad := range [][]byte{nil, {0}, {3, 'a'}, {1, 'a', 0}} {
		if _, ok := decodeUpQuestion(bad); ok {
			t.Errorf("decodeUpQuestion(%q) parsed", bad)
		}
	}
}

// FuzzDecodeUpQuestion: a peer's question never panics the decoder, and
// what decodes encodes back to the same bytes.
func FuzzDecodeUpQuestion(f *testing.F) {
	q, _ := encodeUpQuestion([]string{"a", "node-1"})
	f.Add(q[1:])
	f.Add([]byte{5, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		names, ok := decodeUpQuestion(b)
		if !ok {
			return
		}
		again, asked := encodeUpQuestion(names)
		if !bytes.Equal(again[1:], b) || len(asked) != len(names) {
			t.Fatalf("%q decodes to %q, which encodes to %q", b, names, again[1:])
		}
	})
}
