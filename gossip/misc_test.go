package gossip

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/serf/coordinate"
)

func newTestCoordinate() *coordinate.Coordinate {
	c := coordinate.NewCoordinate(coordinate.DefaultConfig())
	c.Vec[0], c.Vec[7] = 0.001, -0.002
	c.Adjustment, c.Height = 0.0001, 0.00002
	return c
}

func TestCoordinateRoundTrip(t *testing.T) {
	c := newTestCoordinate()
	got, err := decodeCoordinate(encodeCoordinate(c), 8)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Fatalf("got %+v, want %+v", got, c)
	}
}

func TestDecodeCoordinateRejects(t *testing.T) {
	good := encodeCoordinate(coordinate.NewCoordinate(coordinate.DefaultConfig()))
	set := func(i int, v float64) []byte {
		b := bytes.Clone(good)
		binary.BigEndian.PutUint64(b[2+8*i:], math.Float64bits(v))
		return b
	}
	for _, tt := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"unknown format", append([]byte{2}, good[1:]...)},
		{"wrong dimensions", append([]byte{1, 3}, good[2:]...)},
		{"truncated", good[:len(good)-1]},
		{"trailing byte", append(bytes.Clone(good), 0)},
		{"NaN component", set(0, math.NaN())},
		{"infinite height", set(10, math.Inf(1))},
		{"huge component", set(3, 1e9)},
		{"zero error", set(8, 0)},
		{"negative error", set(8, -1.5)},
		{"negative height", set(10, -1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if c, err := decodeCoordinate(tt.b, 8); err == nil {
				t.Fatalf("accepted %+v", c)
			}
		})
	}
}

func TestParseMemberlistLine(t *testing.T) {
	for _, tt := range []struct {
		line  string
		level slog.Level
		msg   string
	}{
		{"[DEBUG] memberlist: Stream connection from=1.2.3.4", slog.LevelDebug, "Stream connection from=1.2.3.4"},
		{"[INFO] memberlist: Suspect n1 has failed, no acks received", slog.LevelInfo, "Suspect n1 has failed, no acks received"},
		{"[WARN] memberlist: Refuting a suspect message (from: n2)", slog.LevelWarn, "Refuting a suspect message (from: n2)"},
		{"[ERR] memberlist: Failed to send gossip", slog.LevelError, "Failed to send gossip"},
		{"[ERROR] memberlist: Failed to compress payload", slog.LevelError, "Failed to compress payload"},
		{"Err: Could not set the deadline", slog.LevelInfo, "Err: Could not set the deadline"},
		{"", slog.LevelInfo, ""},
	} {
		level, msg := parseMemberlistLine(tt.line)
		if level != tt.level || msg != tt.msg {
			t.Errorf("parse(%q) = %v %q, want %v %q", tt.line, level, msg, tt.level, tt.msg)
		}
	}
}

func TestLogWriterRoutesToSlogAndSpotsSuspects(t *testing.T) {
	var buf bytes.Buffer
	var suspects []string
	w := &logWriter{
		log:       slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})),
		onSuspect: func(name string) { suspects = append(suspects, name) },
	}
	w.Write([]byte("[DEBUG] memberlist: hidden\n"))
	w.Write([]byte("[INFO] memberlist: Suspect node-7 has failed, no acks received\n"))
	w.Write([]byte("[WARN] memberlist: Suspect this has failed too but differently\n"))
	out := buf.String()
	if strings.Contains(out, "hidden") || !strings.Contains(out, "level=INFO") || !strings.Contains(out, "component=memberlist") {
		t.Errorf("log output:\n%s", out)
	}
	if len(suspects) != 1 || suspects[0] != "node-7" {
		t.Errorf("suspects %q, want [node-7]", suspects)
	}
}

func TestRateLimiterCountsSuppressed(t *testing.T) {
	l := rateLimiter{interval: time.Second}
	t0 := time.Unix(1000, 0)
	if ok, _ := l.allow(t0); !ok {
		t.Fatal("first event suppressed")
	}
	for i := range 5 {
		if ok, _ := l.allow(t0.Add(time.Duration(i) * 100 * time.Millisecond)); ok {
			t.Fatal("event within the interval allowed")
		}
	}
	if ok, n := l.allow(t0.Add(2 * time.Second)); !ok || n != 5 {
		t.Fatalf("allow after interval = %v, %d suppressed; want true, 5", ok, n)
	}
}
