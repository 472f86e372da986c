package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Questions: one node asks another a small question over memberlist's
// best-effort (UDP, encrypted) user messages and gets one small answer:
// what the layer above needs for its own protocols (the node's quorum
// counts, subnet claim checks, which members a peer holds up) without a
// connection per question. The asker matches answers
// by sequence number and by the answerer's name; an answer that comes
// late or from elsewhere is dropped. The answerer is Config.Answer.
//
//	ask     8, string from, uint64 seq, bytes payload
//	answer  9, string from, uint64 seq, bytes payload

// ErrNoAnswer is returned by Ask when no answer came in time (or the
// member is not live).
var ErrNoAnswer = errors.New("gossip: no answer")

// maxQuestionLen bounds a question's or an answer's payload, in bytes: it
// must fit one gossip packet.
const maxQuestionLen = 1024

// question is an ask or an answer.
type question struct {
	From    string
	Seq     uint64
	Payload []byte
}

func encodeQuestion(t msgType, q question) []byte {
	b := []byte{byte(t)}
	b = appendBytes(b, []byte(q.From))
	b = binary.BigEndian.AppendUint64(b, q.Seq)
	return appendBytes(b, q.Payload)
}

func decodeQuestion(b []byte, want msgType) (question, error) {
	if err := checkType(b, want); err != nil {
		return question{}, err
	}
	d := newReader(b[1:])
	q := question{From: d.name("from"), Seq: d.Uint64("seq")}
	q.Payload = d.Bytes("payload", maxQuestionLen)
	return q, d.Finish()
}

// Ask sends payload (at most 1 KiB) to live member name and returns its
// answer's payload and the round-trip time, or ErrNoAnswer after timeout.
func (c *Cluster) Ask(name string, payload []byte, timeout time.Duration) ([]byte, time.Duration, error) {
	if len(payload) > maxQuestionLen {
		return nil, 0, fmt.Errorf("gossip: question of %d bytes, max %d", len(payload), maxQuestionLen)
	}
	n, ok := c.peer(name)
	if !ok {
		return nil, 0, fmt.Errorf("%w: %s is not a live member", ErrNoAnswer, name)
	}
	ch := make(chan []byte, 1)
	c.askMu.Lock()
	c.askSeq++
	seq := c.askSeq
	c.asks[seq] = pendingAsk{to: name, ch: ch}
	c.askMu.Unlock()
	defer func() {
		c.askMu.Lock()
		delete(c.asks, seq)
		c.askMu.Unlock()
	}()
	start := time.Now()
	if err := c.ml.SendBestEffort(n, encodeQuestion(msgAsk, question{From: c.cfg.Name, Seq: seq, Payload: payload})); err != nil {
		return nil, 0, err
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case b := <-ch:
		return b, time.Since(start), nil
	case <-timer.C:
		return nil, 0, ErrNoAnswer
	case <-c.ctx.Done():
		return nil, 0, ErrNoAnswer
	}
}

// pendingAsk is a question waiting for its answer.
type pendingAsk struct {
	to string
	ch chan []byte
}

// onAsk answers a question of a live member with Config.Answer.
func (c *Cluster) onAsk(q question) {
	if c.cfg.Answer == nil {
		return
	}
	n, ok := c.peer(q.From)
	if !ok {
		c.dropped("question from a non-member", errNotMember, "from", q.From)
		return
	}
	ans := c.cfg.Answer(q.From, q.Payload)
	if ans == nil || len(ans) > maxQuestionLen {
		return
	}
	c.ml.SendBestEffort(n, encodeQuestion(msgAnswer, question{From: c.cfg.Name, Seq: q.Seq, Payload: ans}))
}

// onAnswer hands an answer to the Ask waiting for it.
func (c *Cluster) onAnswer(q question) {
	c.askMu.Lock()
	p, ok := c.asks[q.Seq]
	c.askMu.Unlock()
	if !ok || p.to != q.From {
		return // late, or not from whom it was asked
	}
	select {
	case p.ch <- append([]byte(nil), q.Payload...):
	default:
	}
}
