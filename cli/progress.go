package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/dustin/go-humanize"
	"golang.org/x/term"
)

// uploadProgress wraps r, of total bytes, so that reading it redraws one
// line on w at most every interval: "importing FILE: 45 MB of 100 MB
// (45%)". Finish ends the line.
type uploadProgress struct {
	r        io.Reader
	w        io.Writer
	name     string
	total    int64
	read     int64
	interval time.Duration
	last     time.Time
	drawn    bool
}

func (p *uploadProgress) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.read += int64(n)
	if now := time.Now(); now.Sub(p.last) >= p.interval || err == io.EOF {
		p.last = now
		p.draw()
	}
	return n, err
}

func (p *uploadProgress) draw() {
	pct := 100
	if p.total > 0 {
		pct = int(p.read * 100 / p.total)
	}
	fmt.Fprintf(p.w, "\rimporting %s: %s of %s (%d%%)\x1b[K", p.name, humanize.Bytes(uint64(p.read)), humanize.Bytes(uint64(p.total)), pct)
	p.drawn = true
}

// Finish ends the progress line (the node then still stores the image).
func (p *uploadProgress) Finish() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}

// withUploadProgress returns f wrapped in an uploadProgress on stderr
// when stderr is a terminal (scripts get no progress lines), else f.
func withUploadProgress(f *os.File, name string) (io.Reader, func()) {
	st, err := f.Stat()
	if err != nil || !term.IsTerminal(int(os.Stderr.Fd())) {
		return f, func() {}
	}
	p := &uploadProgress{r: f, w: os.Stderr, name: name, total: st.Size(), interval: 250 * time.Millisecond}
	return p, p.Finish
}
