package logfile

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 11, 0, 0, 123456789, time.UTC)

// newWriter returns a Writer of c.log in a fresh directory, and its path.
func newWriter(t *testing.T, maxSize int64, maxFiles int) (string, *Writer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.log")
	w, err := NewWriter(path, maxSize, maxFiles)
	if err != nil {
		t.Fatal(err)
	}
	return path, w
}

// readLog returns what Read writes of the log at path with o.
func readLog(t *testing.T, path string, o ReadOptions) string {
	t.Helper()
	var out bytes.Buffer
	if err := Read(context.Background(), path, o, &out); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestEntryRoundTripsAndForeignLinesStayWhole(t *testing.T) {
	for _, e := range []Entry{
		{Time: t0, Stream: Stdout, Content: []byte("hello world")},
		{Time: t0, Stream: Stderr, Partial: true, Content: []byte("a piece ")},
		{Time: t0, Stream: Stdout, Content: nil},
	} {
		b := e.Append(nil)
		got, ok := Parse(bytes.TrimSuffix(b, []byte("\n")))
		if !ok || !got.Time.Equal(e.Time) || got.Stream != e.Stream || got.Partial != e.Partial || string(got.Content) != string(e.Content) {
			t.Errorf("%q parsed as %+v, %v", b, got, ok)
		}
	}
	// kubelet's own sample, with a tag list.
	if e, ok := Parse([]byte("2016-10-06T00:17:09.669794202Z stdout P:x log content 1")); !ok || !e.Partial || string(e.Content) != "log content 1" {
		t.Errorf("kubelet sample: %+v %v", e, ok)
	}
	for _, raw := range []string{"plain old line", "2026-13-01T00:00:00Z stdout F x", "2026-12-01T00:00:00Z stdin F x", "2026-12-01T00:00:00Z stdout Q x", ""} {
		e, ok := Parse([]byte(raw))
		if ok || string(e.Content) != raw || !e.Time.IsZero() {
			t.Errorf("%q: %+v %v, want the line whole, not parsed", raw, e, ok)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("2016-10-06T00:17:09.669794202Z stdout F log content"))
	f.Add([]byte("2016-10-06T00:17:09Z stderr P"))
	f.Add([]byte("x y z"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, ok := Parse(b)
		if ok {
			again, ok2 := Parse(bytes.TrimSuffix(e.Append(nil), []byte("\n")))
			if !ok2 || string(again.Content) != string(e.Content) || again.Partial != e.Partial {
				t.Fatalf("%q: re-encoded entry does not parse back", b)
			}
		}
	})
}

// The kubelet's rotation: files never grow past maxSize, at most maxFiles
// are kept, and together they hold the newest lines in order.
func TestWriterRotatesBySizeAndKeepsMaxFiles(t *testing.T) {
	path, w := newWriter(t, 1024, 3)
	for i := 0; i < 200; i++ {
		if err := w.Write(Entry{Time: t0, Stream: Stdout, Content: []byte(fmt.Sprintf("line %03d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	files := Files(path)
	if len(files) != 3 || files[2] != path || files[0] != path+".2" {
		t.Fatalf("files %v, want %s.2, .1 and the current one", files, path)
	}
	for _, f := range files {
		if st, _ := os.Stat(f); st.Size() > 1024 {
			t.Errorf("%s is %d bytes, over the 1024 max", f, st.Size())
		}
	}
	lines := strings.Split(strings.TrimSuffix(readLog(t, path, ReadOptions{Tail: -1}), "\n"), "\n")
	if lines[len(lines)-1] != "line 199" || len(lines) < 60 {
		t.Fatalf("read %d lines ending %q", len(lines), lines[len(lines)-1])
	}
	for i := 1; i < len(lines); i++ {
		if lines[i] <= lines[i-1] {
			t.Fatalf("out of order at %d: %q after %q", i, lines[i], lines[i-1])
		}
	}
}

// The driver cuts long lines into partial entries and keeps an
// unterminated last line; the reader joins them again.
func TestDriveAndReadJoinLongLines(t *testing.T) {
	path, w := newWriter(t, DefaultMaxSize, DefaultMaxFiles)
	long := strings.Repeat("x", MaxLineBytes*2+10)
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	go func() {
		fmt.Fprintf(outW, "first\n%s\nno newline at the end", long)
		outW.Close()
	}()
	go func() {
		fmt.Fprint(errW, "oops\n")
		errW.Close()
	}()
	// Drive reads stdout and stderr concurrently: the clock is shared.
	var mu sync.Mutex
	tick := t0
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		tick = tick.Add(time.Second)
		return tick
	}
	if err := Drive(context.Background(), outR, errR, w, now); err != nil {
		t.Fatal(err)
	}
	w.Close()
	raw, _ := os.ReadFile(path)
	if n := strings.Count(string(raw), " stdout P "); n != 2 {
		t.Errorf("%d partial entries, want 2 for a line of 2 x 16 KiB + 10", n)
	}
	got := readLog(t, path, ReadOptions{Tail: -1})
	for _, want := range []string{"first\n", long + "\n", "oops\n", "no newline at the end\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("read log lacks %.40q", want)
		}
	}
}

func TestReadTailSinceTimestamps(t *testing.T) {
	path, w := newWriter(t, 1024, 4)
	for i := 0; i < 60; i++ {
		w.Write(Entry{Time: t0.Add(time.Duration(i) * time.Second), Stream: Stdout, Content: []byte(fmt.Sprintf("l%02d", i))})
	}
	w.Write(Entry{Time: t0.Add(70 * time.Second), Stream: Stderr, Partial: true, Content: []byte("half ")})
	w.Write(Entry{Time: t0.Add(71 * time.Second), Stream: Stderr, Content: []byte("and half")})
	if n := len(Files(path)); n < 2 {
		t.Fatalf("%d files: the test wants rotated ones", n)
	}
	w.Close()
	read := func(o ReadOptions) string { return readLog(t, path, o) }
	if got := read(ReadOptions{Tail: 3}); got != "l58\nl59\nhalf and half\n" {
		t.Errorf("tail 3 across rotated files: %q", got)
	}
	if got := read(ReadOptions{Tail: 0}); got != "" {
		t.Errorf("tail 0: %q", got)
	}
	if got := read(ReadOptions{Tail: -1, Since: t0.Add(59 * time.Second)}); got != "l59\nhalf and half\n" {
		t.Errorf("since: %q", got)
	}
	want := t0.Add(59*time.Second).Format(time.RFC3339Nano) + " l59\n" + t0.Add(70*time.Second).Format(time.RFC3339Nano) + " half and half\n"
	if got := read(ReadOptions{Tail: 2, Timestamps: true}); got != want {
		t.Errorf("timestamps:\n got %q\nwant %q", got, want)
	}
	if err := Read(context.Background(), path+"x", ReadOptions{Tail: -1}, io.Discard); err != ErrNoLog {
		t.Errorf("missing log: %v", err)
	}
}

// Following reads through a rotation and ends, with everything written,
// when the container stops.
func TestFollowThroughRotationToTheEnd(t *testing.T) {
	path, w := newWriter(t, 1024, 5)
	w.Write(Entry{Time: t0, Stream: Stdout, Content: []byte("start")})
	running := true
	written := make(chan struct{})
	go func() {
		for i := 0; i < 100; i++ {
			w.Write(Entry{Time: t0, Stream: Stdout, Content: []byte(fmt.Sprintf("line %03d", i))})
			if i%10 == 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}
		close(written)
	}()
	follow := func() bool {
		select {
		case <-written:
			running = false
		default:
		}
		return running
	}
	out := readLog(t, path, ReadOptions{Tail: -1, Follow: follow, Poll: time.Millisecond})
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 101 || lines[0] != "start" || lines[100] != "line 099" {
		t.Fatalf("followed %d lines (%q ... %q), want all 101 through the rotations", len(lines), lines[0], lines[len(lines)-1])
	}
}

// A long line's pieces are joined within their own stream: a line the
// other stream writes between them comes out whole, before it, and the
// long line whole when its last piece comes; with --tail too, and a line
// left unfinished at the end of the log still comes out.
func TestLongLinesJoinWithinTheirStream(t *testing.T) {
	path, w := newWriter(t, DefaultMaxSize, DefaultMaxFiles)
	at := t0
	for _, e := range []Entry{
		{Stream: "stdout", Partial: true, Content: []byte("long-")},
		{Stream: "stderr", Content: []byte("oops")},
		{Stream: "stdout", Partial: true, Content: []byte("line-")},
		{Stream: "stderr", Partial: true, Content: []byte("unfinished-")},
		{Stream: "stdout", Content: []byte("end")},
		{Stream: "stderr", Partial: true, Content: []byte("to the end")},
	} {
		at = at.Add(time.Second)
		e.Time = at
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	for _, tc := range []struct {
		o    ReadOptions
		want string
	}{
		{ReadOptions{Tail: -1}, "oops\nlong-line-end\nunfinished-to the end"},
		{ReadOptions{Tail: 1}, "long-line-end\nunfinished-to the end"},
		{ReadOptions{Tail: -1, Timestamps: true}, t0.Add(2*time.Second).UTC().Format(time.RFC3339Nano) + " oops\n" +
			t0.Add(time.Second).UTC().Format(time.RFC3339Nano) + " long-line-end\n" +
			t0.Add(4*time.Second).UTC().Format(time.RFC3339Nano) + " unfinished-to the end"},
	} {
		if got := readLog(t, path, tc.o); got != tc.want {
			t.Errorf("%+v: read %q, want %q", tc.o, got, tc.want)
		}
	}
}
