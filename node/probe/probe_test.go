package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// step is one moment of a scenario: at that time (seconds after the
// container started) Due must return due; the due probes are observed
// (failing where fail says so, unknown where unknown says so); then
// readiness and the failure are checked.
type step struct {
	at      float64
	due     []Kind
	fail    []Kind
	unknown []Kind
	ready   bool
	failed  string // substring of Status.Failed ("" : not failed)
}

func spec(period, delay, success, failure int) *Spec {
	return &Spec{Exec: []string{"check"}, Period: time.Duration(period) * time.Second, InitialDelay: time.Duration(delay) * time.Second,
		SuccessThreshold: success, FailureThreshold: failure}
}

func TestProbeScenarios(t *testing.T) {
	cases := []struct {
		name   string
		probes Probes
		steps  []step
	}{
		{
			name:   "no probes: ready when running",
			probes: Probes{},
			steps:  []step{{at: 0, ready: true}, {at: 100, ready: true}},
		},
		{
			name:   "liveness only: ready when running, restarted after failureThreshold failures in a row",
			probes: Probes{Liveness: spec(2, 0, 1, 3)},
			steps: []step{
				{at: 0, due: []Kind{Liveness}, fail: []Kind{Liveness}, ready: true},
				{at: 1, ready: true},
				{at: 2, due: []Kind{Liveness}, fail: []Kind{Liveness}, ready: true},
				{at: 4, due: []Kind{Liveness}, ready: true}, // a success resets the count
				{at: 6, due: []Kind{Liveness}, fail: []Kind{Liveness}, ready: true},
				{at: 8, due: []Kind{Liveness}, fail: []Kind{Liveness}, ready: true},
				{at: 10, due: []Kind{Liveness}, fail: []Kind{Liveness}, failed: "liveness probe failed: boom"},
				{at: 12, failed: "liveness"}, // on hold until the container restarts
			},
		},
		{
			name:   "readiness: initial delay, success and failure thresholds",
			probes: Probes{Readiness: spec(2, 5, 2, 3)},
			steps: []step{
				{at: 4},
				{at: 5, due: []Kind{Readiness}},
				{at: 6},
				{at: 7, due: []Kind{Readiness}, ready: true},
				{at: 9, due: []Kind{Readiness}, fail: []Kind{Readiness}, ready: true},
				{at: 11, due: []Kind{Readiness}, fail: []Kind{Readiness}, ready: true},
				{at: 13, due: []Kind{Readiness}, fail: []Kind{Readiness}},
				{at: 15, due: []Kind{Readiness}},
				{at: 17, due: []Kind{Readiness}, ready: true},
				{at: 19, due: []Kind{Readiness}, fail: []Kind{Readiness}, ready: true}, // never a restart
			},
		},
		{
			name:   "startup holds liveness and readiness, then never runs again",
			probes: Probes{Startup: spec(1, 0, 1, 10), Liveness: spec(1, 0, 1, 1), Readiness: spec(1, 0, 1, 1)},
			steps: []step{
				{at: 0, due: []Kind{Startup}, fail: []Kind{Startup}},
				{at: 1, due: []Kind{Startup}, fail: []Kind{Startup}},
				{at: 2, due: []Kind{Startup}},
				// Started: liveness and readiness run at once (never run yet).
				{at: 2, due: []Kind{Liveness, Readiness}, ready: true},
				{at: 3, due: []Kind{Liveness, Readiness}, fail: []Kind{Readiness}},
				{at: 4, due: []Kind{Liveness, Readiness}, ready: true},
			},
		},
		{
			name:   "startup failing failureThreshold times fails the run",
			probes: Probes{Startup: spec(1, 0, 1, 2), Readiness: spec(1, 0, 1, 1)},
			steps: []step{
				{at: 0, due: []Kind{Startup}, fail: []Kind{Startup}},
				{at: 1, due: []Kind{Startup}, fail: []Kind{Startup}, failed: "startup probe failed: boom"},
				{at: 2, failed: "startup"},
			},
		},
		{
			name:   "liveness initial delay counts from the container start, not the startup success",
			probes: Probes{Startup: spec(1, 0, 1, 5), Liveness: spec(1, 3, 1, 1)},
			steps: []step{
				{at: 0, due: []Kind{Startup}, fail: []Kind{Startup}},
				{at: 1, due: []Kind{Startup}, ready: true},
				{at: 2, ready: true},
				{at: 3, due: []Kind{Liveness}, ready: true},
			},
		},
		{
			name:   "unknown results are thrown away",
			probes: Probes{Liveness: spec(1, 0, 1, 2), Readiness: spec(1, 0, 1, 1)},
			steps: []step{
				{at: 0, due: []Kind{Liveness, Readiness}, ready: true},
				{at: 1, due: []Kind{Liveness, Readiness}, fail: []Kind{Liveness}, unknown: []Kind{Readiness}, ready: true},
				{at: 2, due: []Kind{Liveness, Readiness}, unknown: []Kind{Liveness, Readiness}, ready: true},
				{at: 3, due: []Kind{Liveness, Readiness}, fail: []Kind{Liveness}, failed: "liveness"},
			},
		},
		{
			name:   "zero period and thresholds take Kubernetes' defaults",
			probes: Probes{Liveness: &Spec{Port: 80}},
			steps: []step{
				{at: 0, due: []Kind{Liveness}, fail: []Kind{Liveness}, ready: true},
				{at: 9.9, ready: true},
				{at: 10, due: []Kind{Liveness}, fail: []Kind{Liveness}, ready: true},
				{at: 20, due: []Kind{Liveness}, fail: []Kind{Liveness}, failed: "liveness"},
			},
		},
	}
	t0 := time.Unix(1000, 0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.probes.Initial()
			for i, st := range tc.steps {
				now := t0.Add(time.Duration(st.at * float64(time.Second)))
				if due := tc.probes.Due(s, t0, now); !reflect.DeepEqual(due, st.due) {
					t.Fatalf("step %d (t=%vs): due %v, want %v", i, st.at, due, st.due)
				}
				for _, k := range st.due {
					var err error
					if contains(st.fail, k) {
						err = errors.New("boom")
					}
					if contains(st.unknown, k) {
						err = fmt.Errorf("%w: gone", ErrUnknown)
					}
					s = tc.probes.Observe(s, k, err, now)
				}
				if got := tc.probes.Ready(s); got != st.ready {
					t.Fatalf("step %d (t=%vs): ready %v, want %v (%+v)", i, st.at, got, st.ready, s)
				}
				if st.failed == "" && s.Failed != "" || !strings.Contains(s.Failed, st.failed) {
					t.Fatalf("step %d (t=%vs): failed %q, want %q", i, st.at, s.Failed, st.failed)
				}
				if (tc.probes.NotReadyReason(s) == "") != st.ready {
					t.Fatalf("step %d: not-ready reason %q with ready %v", i, tc.probes.NotReadyReason(s), st.ready)
				}
			}
		})
	}
}

func contains(ks []Kind, k Kind) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

func TestNotReadyReasonSaysWhichProbe(t *testing.T) {
	p := Probes{Startup: spec(1, 0, 1, 5), Readiness: spec(1, 0, 1, 1)}
	t0 := time.Unix(1000, 0)
	s := p.Initial()
	if r := p.NotReadyReason(s); r != "startup probe has not succeeded yet" {
		t.Fatalf("initial: %q", r)
	}
	s = p.Observe(s, Startup, errors.New("command exited with code 1"), t0)
	if r := p.NotReadyReason(s); r != "startup probe has not succeeded yet: command exited with code 1" {
		t.Fatalf("after a startup failure: %q", r)
	}
	s = p.Observe(s, Startup, nil, t0)
	if r := p.NotReadyReason(s); r != "readiness probe has not succeeded yet" {
		t.Fatalf("started: %q", r)
	}
	s = p.Observe(s, Readiness, errors.New("HTTP 503"), t0)
	if r := p.NotReadyReason(s); r != "readiness probe failed: HTTP 503" {
		t.Fatalf("readiness failing: %q", r)
	}
	long := p.Observe(s, Readiness, errors.New(strings.Repeat("é", 500)), t0)
	if r := p.NotReadyReason(long); len(r) > 300 || !strings.HasSuffix(r, "...") {
		t.Fatalf("long message not shortened: %d bytes", len(r))
	}
}

func TestCheckHandlers(t *testing.T) {
	var gotHost, gotHeader string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHost, gotHeader = r.Host, r.Header.Get("X-Probe")
		switch r.URL.Path {
		case "/ok":
		case "/moved":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/slow":
			time.Sleep(300 * time.Millisecond)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	var port int32
	fmt.Sscan(portStr, &port)
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedPort := int32(closed.Addr().(*net.TCPAddr).Port)
	closed.Close()

	exec := func(code int, out string, delay time.Duration, err error) ExecFunc {
		return func(ctx context.Context, argv []string, timeout time.Duration) (int, string, error) {
			select {
			case <-time.After(delay):
				return code, out, err
			case <-time.After(timeout):
				return -1, "", fmt.Errorf("killed: %w", context.DeadlineExceeded)
			case <-ctx.Done():
				return -1, "", ctx.Err()
			}
		}
	}
	ms := 100 * time.Millisecond
	cases := []struct {
		name string
		spec Spec
		exec ExecFunc
		want string // "" success; else a substring of the error
	}{
		{"http 200", Spec{HTTP: true, Port: port, HTTPPath: "/ok"}, nil, ""},
		{"http redirect followed", Spec{HTTP: true, Port: port, HTTPPath: "/moved"}, nil, ""},
		{"http 503", Spec{HTTP: true, Port: port, HTTPPath: "/bad"}, nil, "HTTP 503"},
		{"http timeout", Spec{HTTP: true, Port: port, HTTPPath: "/slow", Timeout: ms}, nil, "httpGet timed out after 100ms"},
		{"tcp open", Spec{Port: port}, nil, ""},
		{"tcp closed", Spec{Port: closedPort}, nil, "connection refused"},
		{"exec exit 0", Spec{Exec: []string{"true"}}, exec(0, "", 0, nil), ""},
		{"exec exit 1 with output", Spec{Exec: []string{"false"}}, exec(1, "not ready\n", 0, nil), "command exited with code 1: not ready"},
		{"exec timeout", Spec{Exec: []string{"sleep"}, Timeout: ms}, exec(0, "", time.Second, nil), "exec timed out after 100ms"},
		{"exec cannot start", Spec{Exec: []string{"nope"}}, exec(0, "", 0, errors.New(`exec: "nope": executable file not found in $PATH`)), "executable file not found"},
		{"exec without runtime", Spec{Exec: []string{"true"}}, nil, "not supported"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(context.Background(), tc.spec, host, tc.exec)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want success, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			case errors.Is(err, ErrUnknown):
				t.Fatalf("a failure read as unknown: %v", err)
			}
		})
	}
	t.Run("headers and Host", func(t *testing.T) {
		p := Spec{HTTP: true, Port: port, HTTPPath: "/ok", HTTPHeaders: []Header{{"Host", "example.test"}, {"X-Probe", "1"}}}
		if err := Check(context.Background(), p, host, nil); err != nil || gotHost != "example.test" || gotHeader != "1" {
			t.Fatalf("err %v host %q header %q", err, gotHost, gotHeader)
		}
	})
	t.Run("agent stopping is unknown", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := Check(ctx, Spec{Exec: []string{"true"}}, host, exec(0, "", time.Second, nil))
		if !errors.Is(err, ErrUnknown) {
			t.Fatalf("want ErrUnknown, got %v", err)
		}
	})
}
