package logfile

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"slices"
	"time"
)

// ReadOptions select and shape what Read sends, as `kubectl logs` flags
// do.
type ReadOptions struct {
	// Tail sends only the last Tail lines (-1: all).
	Tail int
	// Since sends only entries written at or after it (zero: all).
	Since time.Time
	// Timestamps starts each line with its time (RFC 3339, nanoseconds)
	// and a space.
	Timestamps bool
	// Follow, when set, keeps Read waiting for more at the end of the
	// log, through rotations, for as long as it returns true (it is
	// asked at each end reached); what was written up to then is sent.
	Follow func() bool
	// Poll is how often a followed log is checked (default 250 ms).
	Poll time.Duration
	// Settle is how long a followed log must stay unchanged after Follow
	// said stop before Read ends (default and at least Poll).
	Settle time.Duration
}

// Read sends the log at path (its rotated files first) to out as plain
// lines, without the CRI prefix: stdout and stderr interleaved in the
// order written, the partial pieces of a long line joined within their
// stream (a line goes out when its last piece comes). ErrNoLog when
// there is none.
func Read(ctx context.Context, path string, o ReadOptions, out io.Writer) error {
	files := Files(path)
	if len(files) == 0 {
		return ErrNoLog
	}
	p := &printer{o: o, out: out}
	if o.Tail >= 0 {
		p.ring = &ring{max: o.Tail}
	}
	for _, f := range files[:len(files)-1] {
		if err := p.file(f); err != nil {
			return err
		}
	}
	cur, err := os.Open(files[len(files)-1])
	if err != nil {
		return err
	}
	defer func() { cur.Close() }()
	br := bufio.NewReader(cur)
	if o.Follow == nil {
		if err := p.rest(br); err != nil {
			return err
		}
		if err := p.flushRing(); err != nil {
			return err
		}
		return p.finish()
	}
	if err := p.lines(br); err != nil {
		return err
	}
	if err := p.flushRing(); err != nil {
		return err
	}
	poll := o.Poll
	if poll <= 0 {
		poll = 250 * time.Millisecond
	}
	for {
		if f, ok := out.(interface{ Flush() }); ok {
			f.Flush()
		}
		running := o.Follow()
		// Rotated away: the rest of the old file, then the new one.
		if rotated(cur, path) {
			if err := p.rest(br); err != nil {
				return err
			}
			next, err := os.Open(path)
			if err != nil {
				if !running {
					return nil
				}
			} else {
				cur.Close()
				cur, br = next, bufio.NewReader(next)
			}
		}
		if err := p.lines(br); err != nil {
			return err
		}
		if !running {
			// The log writer is a process of its own, reading the
			// container's pipes: its last lines may land just after the
			// exit. They are taken until the file stays quiet.
			quietFor := max(o.Settle, poll)
			for quiet, waited := time.Duration(0), time.Duration(0); quiet < quietFor && waited < 4*quietFor; waited += poll {
				time.Sleep(poll)
				before := p.read
				if err := p.lines(br); err != nil {
					return err
				}
				if p.read == before {
					quiet += poll
				} else {
					quiet = 0
				}
			}
			if err := p.rest(br); err != nil {
				return err
			}
			return p.finish()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(poll):
		}
	}
}

// ErrNoLog: there is no log file at the path.
var ErrNoLog = errors.New("no log")

func rotated(cur *os.File, path string) bool {
	a, err1 := cur.Stat()
	b, err2 := os.Stat(path)
	return err1 == nil && (err2 != nil || !os.SameFile(a, b))
}

type printer struct {
	o       ReadOptions
	out     io.Writer
	ring    *ring
	pending []byte // an unterminated line read at the end of a file
	read    int64  // bytes read so far
	// open holds, by stream, the line whose partial pieces have come so
	// far (its timestamp first): a long line is joined from the pieces
	// of its own stream, whatever the other stream wrote between them.
	// A stream is present while it is in the middle of a line.
	open map[string][]byte
}

// maxJoined bounds a line joined from partial pieces: a longer one goes
// out in pieces of about this size (unterminated but for the last), so a
// program that never ends its line cannot hold a reader's memory.
const maxJoined = 64 * MaxLineBytes

func (p *printer) file(path string) error {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil // rotated away meanwhile
		}
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	if err := p.lines(br); err != nil {
		return err
	}
	return p.rest(br)
}

// lines handles the complete lines br has now; an unterminated one is
// kept for the next call (a writer may be in the middle of it).
func (p *printer) lines(br *bufio.Reader) error {
	for {
		b, err := br.ReadBytes('\n')
		if len(b) > 0 {
			p.pending = append(p.pending, b...)
			p.read += int64(len(b))
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		line := bytes.TrimSuffix(p.pending, []byte{'\n'})
		if err := p.entry(line); err != nil {
			return err
		}
		p.pending = p.pending[:0]
	}
}

// rest handles what is left at the end of a file that will not grow.
func (p *printer) rest(br *bufio.Reader) error {
	if err := p.lines(br); err != nil {
		return err
	}
	if len(p.pending) > 0 {
		err := p.entry(p.pending)
		p.pending = p.pending[:0]
		return err
	}
	return nil
}

func (p *printer) entry(line []byte) error {
	e, _ := Parse(line)
	if !p.o.Since.IsZero() && !e.Time.IsZero() && e.Time.Before(p.o.Since) {
		return nil
	}
	b, mid := p.open[e.Stream]
	if p.o.Timestamps && !mid {
		b = e.Time.UTC().AppendFormat(b, time.RFC3339Nano)
		b = append(b, ' ')
	}
	b = append(b, e.Content...)
	if e.Partial {
		if p.open == nil {
			p.open = map[string][]byte{}
		}
		if len(b) < maxJoined {
			p.open[e.Stream] = b
			return nil
		}
		p.open[e.Stream] = []byte{} // still in the line; its time is out
		return p.emit(b)
	}
	delete(p.open, e.Stream)
	return p.emit(append(b, '\n'))
}

// emit sends b (a line, or a piece of one over maxJoined) to out, or to
// the ring while the tail is being found.
func (p *printer) emit(b []byte) error {
	if p.ring == nil {
		_, err := p.out.Write(b)
		return err
	}
	p.ring.push(b)
	return nil
}

func (p *printer) flushRing() error {
	if p.ring == nil {
		return nil
	}
	for _, l := range p.ring.lines() {
		if _, err := p.out.Write(l); err != nil {
			return err
		}
	}
	p.ring = nil
	return nil
}

// finish sends the lines left unterminated at the end of the log (the
// writer stopped in the middle of them), stdout's first.
func (p *printer) finish() error {
	rank := func(s string) int {
		if s == "stdout" {
			return 0
		}
		return 1
	}
	streams := slices.SortedFunc(maps.Keys(p.open), func(a, b string) int { return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(a, b)) })
	for _, s := range streams {
		if b := p.open[s]; len(b) > 0 {
			if _, err := p.out.Write(b); err != nil {
				return err
			}
		}
		delete(p.open, s)
	}
	return nil
}

// ring keeps the last max lines.
type ring struct {
	max  int
	buf  [][]byte
	next int
	full bool
}

func (r *ring) push(l []byte) {
	if r.max == 0 {
		return
	}
	if len(r.buf) < r.max {
		r.buf = append(r.buf, l)
		return
	}
	r.buf[r.next] = l
	r.next = (r.next + 1) % r.max
	r.full = true
}

func (r *ring) lines() [][]byte {
	if !r.full {
		return r.buf
	}
	return append(append([][]byte{}, r.buf[r.next:]...), r.buf[:r.next]...)
}
