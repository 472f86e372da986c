package sealed

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// Records lists the records a Resealer reads.
type Records interface {
	List(prefix string) ([]crdt.Record, error)
}

// Publisher signs, stores and gossips records (the agent's writer).
type Publisher interface {
	PublishDurable(recs ...crdt.Record) error
}

// Resealer seals Secrets again under the key in use: a key rotation
// ('starling keys rotate') calls Reseal once every node uses the new key
// and before any removes the old one, so no Secret is left sealed under
// a key the cluster no longer holds.
type Resealer struct {
	Box     *Box
	Records Records
	Writer  Publisher
	Clock   *hlc.Clock
	Self    string // this node's name, the new records' origin
	Log     *slog.Logger
}

// Reseal writes, as new versions, the Secret records sealed under a key
// other than the one in use, sealed under it, and returns how many. A
// record that does not open (sealed under a key this node no longer
// holds) is left as it is and logged: a rotation cannot mend it, and
// must not be held back by it.
func (r *Resealer) Reseal(ctx context.Context) (int, error) {
	keys := r.Box.keys.Keys()
	if len(keys) == 0 {
		return 0, nil
	}
	cur, err := r.Box.derive(keys[0])
	if err != nil {
		return 0, err
	}
	recs, err := r.Records.List("secret/")
	if err != nil {
		return 0, err
	}
	var out []crdt.Record
	for _, rec := range recs {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if rec.Deleted || !strings.HasPrefix(rec.Key, "secret/") {
			continue
		}
		var e envelope
		if json.Unmarshal(rec.Value, &e) != nil || e.SealedData == nil || len(e.SealedData) < Overhead ||
			bytes.Equal(e.SealedData[len(magic):len(magic)+kidLen], cur.kid[:]) {
			continue // in clear (an --insecure writer), malformed, or under the key in use
		}
		plain, err := r.Box.Open(rec.Key, rec.Value)
		if err != nil {
			r.Log.Warn("a Secret does not open: not sealed again", "key", rec.Key, "err", err)
			continue
		}
		value, err := r.Box.Seal(rec.Key, plain)
		if err != nil {
			return 0, err
		}
		r.Clock.Update(rec.Version) // the new version wins over the old
		out = append(out, crdt.Record{Key: rec.Key, Value: value, Version: r.Clock.Now(), Origin: r.Self})
	}
	if len(out) > 0 {
		if err := r.Writer.PublishDurable(out...); err != nil {
			return 0, fmt.Errorf("write the Secrets sealed again: %w", err)
		}
		r.Log.Info("sealed Secrets again under the key in use", "secrets", len(out))
	}
	return len(out), nil
}
