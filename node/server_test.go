package node

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/apiserver"
	"github.com/starling-orchestrator/starling/node/logfile"
)

func TestCheckRefRefusesPathsAndBadNames(t *testing.T) {
	for _, tc := range []struct {
		ns, name string
		ok       bool
	}{
		{"default", "hello-abc123-0", true},
		{"default", "x/../../../../var/log/dpkg", false},
		{"..", "x", false},
		{"default", "", false},
		{"Default", "x", false},
	} {
		if err := apiserver.CheckRef(tc.ns, tc.name); (err == nil) != tc.ok {
			t.Errorf("apiserver.CheckRef(%q, %q) = %v, want ok=%v", tc.ns, tc.name, err, tc.ok)
		}
	}
}

// TestTailOfALogWrittenBeforeTheCRIFormat: a log file of raw lines (a
// container created before Starling wrote the CRI format) still tails by
// lines, with and without a final newline, across read blocks.
func TestTailOfALogWrittenBeforeTheCRIFormat(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("x", 40<<10)
	for _, tt := range []struct {
		content string
		n       int
		want    string
	}{
		{"a\nb\nc\n", 2, "b\nc\n"},
		{"a\nb\nc", 2, "b\nc\n"},
		{"a\nb\nc\n", 5, "a\nb\nc\n"},
		{"a\nb\nc\n", 0, ""},
		{"", 3, ""},
		{"a\n" + long + "\nz\n", 2, long + "\nz\n"},
	} {
		p := filepath.Join(dir, "log")
		os.WriteFile(p, []byte(tt.content), 0o600)
		var b strings.Builder
		err := logfile.Read(context.Background(), p, logfile.ReadOptions{Tail: tt.n}, &b)
		if err != nil || b.String() != tt.want {
			t.Errorf("tail %d of %.20q: %.20q, want %.20q (%v)", tt.n, tt.content, b.String(), tt.want, err)
		}
	}
}

func TestLogOptionsNameTheBadParameter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	logOptions := func(q url.Values, now time.Time) (logfile.ReadOptions, error) {
		o, err := api.ParseLogOptions(q)
		return readOptions(o, now), err
	}
	o, err := logOptions(url.Values{"tail": {"3"}, "sinceSeconds": {"60"}, "timestamps": {"true"}}, now)
	if err != nil || o.Tail != 3 || !o.Since.Equal(now.Add(-time.Minute)) || !o.Timestamps {
		t.Fatalf("%+v %v", o, err)
	}
	if o, err := logOptions(url.Values{"sinceTime": {"2026-12-01T11:00:00Z"}}, now); err != nil || !o.Since.Equal(now.Add(-time.Hour)) || o.Tail != -1 {
		t.Fatalf("sinceTime: %+v %v", o, err)
	}
	for q, want := range map[string]string{
		"tail=-1":             "tail:",
		"sinceSeconds=abc":    "sinceSeconds:",
		"sinceTime=yesterday": "sinceTime:",
		"sinceSeconds=5&sinceTime=2026-12-01T11:00:00Z": "give one of them",
	} {
		v, _ := url.ParseQuery(q)
		if _, err := logOptions(v, now); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", q, err, want)
		}
	}
}
