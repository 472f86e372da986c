package gossip

import (
	"bytes"
	"testing"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// Each decoder must reject bad input with an error and never panic; what it
// accepts must re-encode to the same bytes. Run one with, for example:
//
//	go test ./gossip/ -run=NONE -fuzz=FuzzDecodeRequest -fuzztime=45s

func addSeeds(f *testing.F) {
	for _, m := range validMessages() {
		f.Add(m)
	}
	for _, g := range garbage() {
		f.Add(g)
	}
}

// fuzzRoundTrip checks decode's contract on b.
func fuzzRoundTrip(t *testing.T, b []byte, decode func([]byte) ([]byte, error)) {
	got, err := decode(b)
	if err != nil {
		return
	}
	if !bytes.Equal(got, b) {
		t.Fatalf("accepted %x but re-encodes as %x", b, got)
	}
}

// fuzzCodec fuzzes decode from the seeds: what it accepts, encode must
// give back as the same bytes.
func fuzzCodec[T any](f *testing.F, decode func([]byte) (T, error), encode func(T) []byte) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzRoundTrip(t, b, func(b []byte) ([]byte, error) {
			v, err := decode(b)
			return encode(v), err
		})
	})
}

func FuzzDecodeMessage(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) { fuzzRoundTrip(t, b, decodeAny) })
}

func FuzzDecodeDelta(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzRoundTrip(t, b, func(b []byte) ([]byte, error) {
			_, enc, err := decodeDelta(b)
			return encodeDelta(enc), err
		})
	})
}

func FuzzDecodeRecords(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzRoundTrip(t, b, func(b []byte) ([]byte, error) {
			recs, encs, err := decodeRecords(b)
			if err != nil {
				return nil, err
			}
			for i, r := range recs {
				if enc, err := crdt.EncodeRecord(r); err != nil || !bytes.Equal(enc, encs[i]) {
					t.Fatalf("record %d decodes to %+v, which encodes differently (%v)", i, r, err)
				}
			}
			return decodeAny(b)
		})
	})
}

func FuzzDecodeDigest(f *testing.F) { fuzzCodec(f, decodeDigest, encodeDigest) }

func FuzzDecodeRequest(f *testing.F) { fuzzCodec(f, decodeRequest, encodeRequest) }

func FuzzDecodePull(f *testing.F) { fuzzCodec(f, decodePull, encodePull) }

func FuzzDecodeHave(f *testing.F) { fuzzCodec(f, decodeHave, encodeHave) }

func FuzzDecodeLeave(f *testing.F) { fuzzCodec(f, decodeLeave, encodeLeave) }

func FuzzDecodeCoordinate(f *testing.F) {
	c, _ := decodeCoordinate(encodeCoordinate(newTestCoordinate()), 8)
	f.Add(encodeCoordinate(c))
	f.Add([]byte{1, 8})
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzRoundTrip(t, b, func(b []byte) ([]byte, error) {
			c, err := decodeCoordinate(b, 8)
			if err != nil {
				return nil, err
			}
			if !c.IsValid() {
				t.Fatalf("accepted invalid coordinate %+v", c)
			}
			return encodeCoordinate(c), nil
		})
	})
}

// FuzzNotifyMsg feeds arbitrary bytes through the delegate of a Cluster whose
// memberlist is not started, as a peer's message would arrive: it must never
// panic, and whatever it applies must be a valid record.
func FuzzNotifyMsg(f *testing.F) {
	addSeeds(f)
	cfg := DefaultConfig()
	cfg.Name = "n99"
	cfg.Logger = testLogger()
	st := NewMemState()
	c, err := newCluster(cfg, st)
	if err != nil {
		f.Fatal(err)
	}
	d := &delegate{c}
	f.Fuzz(func(t *testing.T, b []byte) {
		d.NotifyMsg(b)
		d.MergeRemoteState(b, false)
		snap, _ := st.Snapshot()
		for _, r := range snap {
			if err := r.Validate(); err != nil {
				t.Fatalf("applied invalid record: %v", err)
			}
		}
	})
}

func FuzzDecodeQuestion(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, typ := range []msgType{msgAsk, msgAnswer} {
			fuzzRoundTrip(t, b, func(b []byte) ([]byte, error) {
				q, err := decodeQuestion(b, typ)
				return encodeQuestion(typ, q), err
			})
		}
	})
}
