package store

import (
	"testing"
	"time"
)

// Stores of one pool keep one copy of the bytes they share, and the pool
// forgets bytes no record uses any more: replaced, purged or dropped.
func TestPooledMemoryStoresShareBytes(t *testing.T) {
	pool := NewPool()
	a, b := NewMemoryPooled(pool), NewMemoryPooled(pool)
	r := rec("node/default/n1", 1, "n1", `{"replicas":[1,2,3]}`)
	for _, s := range []*Memory{a, b} {
		if _, err := s.Apply(r); err != nil {
			t.Fatal(err)
		}
	}
	r.Value[0] = 'X' // the caller's buffer: the stores hold their own copy
	ga, _, _ := a.Get(r.Key)
	gb, _, _ := b.Get(r.Key)
	if string(ga.Value) != `{"replicas":[1,2,3]}` || &ga.Value[0] != &gb.Value[0] {
		t.Fatalf("want one shared copy of the value: %q at %p and %p", ga.Value, &ga.Value[0], &gb.Value[0])
	}
	if len(pool.m) != 1 || pool.m[string(ga.Value)].refs != 2 {
		t.Fatalf("pool: %d entries, want 1 used twice", len(pool.m))
	}

	// A newer version replaces the old one in a: the old bytes are used
	// once (by b), the new once.
	if _, err := a.Apply(rec("node/default/n1", 2, "n1", `{"replicas":[]}`)); err != nil {
		t.Fatal(err)
	}
	if len(pool.m) != 2 || pool.m[`{"replicas":[1,2,3]}`].refs != 1 || pool.m[`{"replicas":[]}`].refs != 1 {
		t.Fatalf("after a replace: %d entries", len(pool.m))
	}
	if err := b.DropRecords(); err != nil {
		t.Fatal(err)
	}
	if _, ok := pool.m[`{"replicas":[1,2,3]}`]; ok || len(pool.m) != 1 {
		t.Fatalf("dropped bytes still pooled: %d entries", len(pool.m))
	}
	if _, err := a.Apply(tomb("node/default/n1", 3, "n1")); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Purge(time.Unix(0, 3).Add(time.Hour), time.Minute); err != nil || n != 1 {
		t.Fatalf("purge: %d %v", n, err)
	}
	if len(pool.m) != 0 {
		t.Fatalf("after purging the tombstone: %d entries, want none", len(pool.m))
	}
}
