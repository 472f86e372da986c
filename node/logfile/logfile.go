// Package logfile writes and reads container logs in the CRI log format
// the kubelet reads (k8s.io/cri-api, pkg/kubelet/kuberuntime/logs):
// one entry per line,
//
//	<time RFC 3339, nanoseconds> <stdout|stderr> <F|P> <content>\n
//
// where P marks a partial line (a line longer than MaxLineBytes is cut
// into pieces, the last one F). A container's log is a file and its
// rotated predecessors, "<path>.1" (newest) to "<path>.<n>" (oldest),
// rotated by size as the kubelet's --container-log-max-size and
// --container-log-max-files do.
//
// The writer runs in the log driver process containerd's shim starts for
// each container (Drive, Main), so logs keep flowing while the agent is
// down; the agent reads them (Read).
package logfile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of the kubelet's containerLogMaxSize and containerLogMaxFiles,
// and containerd's max_container_log_line_size.
const (
	DefaultMaxSize  = 10 << 20 // bytes
	DefaultMaxFiles = 5
	MaxLineBytes    = 16 << 10
)

// Stream names, as the format spells them.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// Entry is one log line, or one piece of a long one (Partial).
type Entry struct {
	Time    time.Time
	Stream  string // Stdout or Stderr
	Partial bool   // more of the same line follows
	Content []byte // without the newline
}

// Append appends e in the CRI format to b.
func (e Entry) Append(b []byte) []byte {
	b = e.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, ' ')
	b = append(b, e.Stream...)
	if e.Partial {
		b = append(b, " P "...)
	} else {
		b = append(b, " F "...)
	}
	b = append(b, e.Content...)
	return append(b, '\n')
}

// Parse reads one line (without its newline) in the CRI format. A line
// that is not in it (a log written before Starling used the format) is
// returned whole as a full stdout line with a zero Time, ok false.
func Parse(line []byte) (e Entry, ok bool) {
	plain := Entry{Stream: Stdout, Content: line}
	ts, rest, found := bytes.Cut(line, []byte{' '})
	if !found {
		return plain, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return plain, false
	}
	stream, rest, found := bytes.Cut(rest, []byte{' '})
	if !found || string(stream) != Stdout && string(stream) != Stderr {
		return plain, false
	}
	tag, content, found := bytes.Cut(rest, []byte{' '})
	if !found && len(rest) > 0 && rest[0] == 'F' && len(rest) == 1 {
		tag, content = rest, nil // an empty line
	} else if !found {
		return plain, false
	}
	// Tags are ':'-separated; the first says partial or full.
	first, _, _ := bytes.Cut(tag, []byte{':'})
	switch string(first) {
	case "P":
		e.Partial = true
	case "F":
	default:
		return plain, false
	}
	e.Time, e.Stream, e.Content = t, string(stream), content
	return e, true
}

// Files returns the files of the log at path, oldest first: the rotated
// ones ("<path>.<n>", highest n first) and then path itself, those that
// exist.
func Files(path string) []string {
	matches, _ := filepath.Glob(globEscape(path) + ".*")
	type rotated struct {
		n    int
		path string
	}
	var rs []rotated
	for _, m := range matches {
		if n, err := strconv.Atoi(strings.TrimPrefix(m, path+".")); err == nil && n > 0 {
			rs = append(rs, rotated{n, m})
		}
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].n > rs[j].n })
	var out []string
	for _, r := range rs {
		out = append(out, r.path)
	}
	if _, err := os.Stat(path); err == nil {
		out = append(out, path)
	}
	return out
}

// Rename moves the log at from (and its rotated files) to to, replacing
// what was there; Remove removes the log at path and its rotated files.
func Rename(from, to string) error {
	if err := Remove(to); err != nil {
		return err
	}
	for _, f := range Files(from) {
		if err := os.Rename(f, to+strings.TrimPrefix(f, from)); err != nil {
			return err
		}
	}
	return nil
}

// Remove removes the log at path and its rotated files.
func Remove(path string) error {
	for _, f := range Files(path) {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}

func globEscape(p string) string {
	r := strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `\`, `\\`)
	return r.Replace(p)
}

// Writer appends entries to a log file and rotates it by size: once the
// file holds maxSize bytes, it becomes "<path>.1" (the older ones move up
// by one; the oldest beyond maxFiles-1 rotated files is removed) and a
// new file is started. Safe for concurrent use.
type Writer struct {
	path     string
	maxSize  int64
	maxFiles int

	mu   sync.Mutex
	f    *os.File
	size int64
	buf  []byte
}

// NewWriter opens (appends to) the log at path. maxSize is in bytes (at
// least 1 KiB), maxFiles counts the current file (at least 1: no
// rotated files are kept).
func NewWriter(path string, maxSize int64, maxFiles int) (*Writer, error) {
	if maxSize < 1<<10 {
		return nil, fmt.Errorf("log max size %d bytes: must be at least 1024", maxSize)
	}
	if maxFiles < 1 {
		return nil, fmt.Errorf("log max files %d: must be at least 1", maxFiles)
	}
	w := &Writer{path: path, maxSize: maxSize, maxFiles: maxFiles}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *Writer) open() error {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	w.f, w.size = f, st.Size()
	return nil
}

// Write appends e, rotating first when the file is full.
func (w *Writer) Write(e Entry) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = e.Append(w.buf[:0])
	if w.size > 0 && w.size+int64(len(w.buf)) > w.maxSize {
		if err := w.rotate(); err != nil {
			return err
		}
	}
	n, err := w.f.Write(w.buf)
	w.size += int64(n)
	return err
}

func (w *Writer) rotate() error {
	if err := w.f.Close(); err != nil {
		return err
	}
	keep := w.maxFiles - 1
	os.Remove(fmt.Sprintf("%s.%d", w.path, keep))
	for n := keep - 1; n >= 1; n-- {
		if err := os.Rename(fmt.Sprintf("%s.%d", w.path, n), fmt.Sprintf("%s.%d", w.path, n+1)); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	var err error
	if keep > 0 {
		err = os.Rename(w.path, w.path+".1")
	} else {
		err = os.Remove(w.path)
	}
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	return w.open()
}

// Close closes the file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Close()
}
