// Package probe runs Kubernetes-style container probes: startup, liveness
// and readiness probes with exec, httpGet or tcpSocket handlers, with
// kubelet's semantics for initialDelaySeconds, periodSeconds,
// timeoutSeconds, successThreshold and failureThreshold
// (k8s.io/kubernetes/pkg/kubelet/prober/worker.go):
//
//   - startup, liveness and readiness probes of one container run
//     independently, each every Period from InitialDelay after the
//     container started;
//   - while a startup probe has not succeeded, the other probes do not run
//     and the container is not ready; after one success it never runs
//     again in that container run;
//   - a readiness probe starts failing (not ready), flips to ready after
//     SuccessThreshold consecutive successes and back after
//     FailureThreshold consecutive failures;
//   - FailureThreshold consecutive failures of a liveness or startup probe
//     fail the container run: it must be restarted, and nothing is probed
//     any more until it is (kubelet's "onHold");
//   - a result that says nothing about the container (the agent is
//     stopping, the container is already gone) is thrown away, as kubelet
//     throws away prober errors.
//
// Probes.Due, Probes.Observe and Probes.Ready are pure: the prober passes
// the clock in. Check is the I/O edge.
package probe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Kind says what a probe decides.
type Kind string

// The three probe kinds.
const (
	Startup   Kind = "startup"
	Liveness  Kind = "liveness"
	Readiness Kind = "readiness"
)

// Kubernetes' defaults (k8s.io/kubernetes/pkg/apis/core/v1/defaults.go),
// used when a Spec leaves a field zero.
const (
	DefaultPeriod  = 10 * time.Second
	DefaultTimeout = time.Second

	DefaultFailureThreshold = 3
)

// Header is one HTTP header an httpGet probe sends.
type Header struct{ Name, Value string }

// Spec is one probe, with its port resolved to a number. Exactly one
// handler is set: Exec (a command run inside the container), HTTP (a GET
// to Port), or neither (a TCP connect to Port).
type Spec struct {
	// Exec is the command (argv, no shell) run in the container; exit
	// status 0 is success.
	Exec []string
	// HTTP: GET HTTPScheme://<pod IP>:Port HTTPPath, 200-399 is success.
	HTTP        bool
	HTTPS       bool // scheme HTTPS: TLS without certificate checks, as kubelet
	HTTPPath    string
	HTTPHeaders []Header
	Port        int32
	// InitialDelay counts from the container's start.
	InitialDelay time.Duration
	Period       time.Duration // default 10 s
	Timeout      time.Duration // default 1 s; also bounds exec commands
	// SuccessThreshold is 1 for liveness and startup probes (manifest
	// validation enforces it).
	SuccessThreshold int // default 1
	FailureThreshold int // default 3
}

// Handler names the probe's handler as manifests do: "exec", "httpGet"
// or "tcpSocket".
func (p Spec) Handler() string {
	switch {
	case len(p.Exec) > 0:
		return "exec"
	case p.HTTP:
		return "httpGet"
	default:
		return "tcpSocket"
	}
}

func (p Spec) period() time.Duration {
	if p.Period <= 0 {
		return DefaultPeriod
	}
	return p.Period
}

func (p Spec) successThreshold() int { return max(p.SuccessThreshold, 1) }

func (p Spec) failureThreshold() int {
	if p.FailureThreshold <= 0 {
		return DefaultFailureThreshold
	}
	return p.FailureThreshold
}

func (p Spec) timeout() time.Duration {
	if p.Timeout <= 0 {
		return DefaultTimeout
	}
	return p.Timeout
}

// Probes are one container's probes; nil means the probe is not set.
type Probes struct {
	Startup, Liveness, Readiness *Spec
}

// Spec returns the probe of kind k (nil if not set).
func (p Probes) Spec(k Kind) *Spec {
	switch k {
	case Startup:
		return p.Startup
	case Liveness:
		return p.Liveness
	case Readiness:
		return p.Readiness
	}
	return nil
}

// State is one probe's state in one container run.
type State struct {
	// Passing is the probe's published result. It starts false for
	// readiness and startup probes and true for liveness probes
	// (kubelet's initial values).
	Passing   bool
	Successes int // consecutive
	Failures  int // consecutive
	LastRun   time.Time
	// LastError is the last failure's message ("" after a success).
	LastError string
}

// Status is what the prober knows of one container run.
type Status struct {
	Startup, Liveness, Readiness State
	// Started: the startup probe succeeded (true from the start when
	// there is none). Liveness and readiness probes run only once started.
	Started bool
	// Failed, when set, says why the run must end ("liveness probe
	// failed: HTTP 500"): its liveness or startup probe failed
	// FailureThreshold times in a row. Nothing is probed after that.
	Failed string
}

func (s *Status) state(k Kind) *State {
	switch k {
	case Startup:
		return &s.Startup
	case Liveness:
		return &s.Liveness
	default:
		return &s.Readiness
	}
}

// Initial is the status of a container run that was never probed.
func (p Probes) Initial() Status {
	return Status{Started: p.Startup == nil, Liveness: State{Passing: true}}
}

// Due returns the probes to run at now for a container run that started
// at started and has status s: none once the run failed; only the startup
// probe until it succeeded; then liveness and readiness. Each is due from
// InitialDelay after the start, then every Period after its last run.
func (p Probes) Due(s Status, started, now time.Time) []Kind {
	if s.Failed != "" {
		return nil
	}
	kinds := []Kind{Liveness, Readiness}
	if !s.Started {
		kinds = []Kind{Startup}
	}
	var due []Kind
	for _, k := range kinds {
		spec := p.Spec(k)
		if spec == nil || now.Sub(started) < spec.InitialDelay {
			continue
		}
		if last := s.state(k).LastRun; last.IsZero() || now.Sub(last) >= spec.period() {
			due = append(due, k)
		}
	}
	return due
}

// ErrUnknown marks a result that says nothing about the container (the
// agent is stopping; the container is no longer running): Observe throws
// it away, like kubelet throws away prober errors.
var ErrUnknown = errors.New("probe result unknown")

// maxMessage bounds failure messages: they are published in the node's
// status and stored in a container label.
const maxMessage = 256

// Observe folds one result of probe k (err nil: success) at time at into
// the status and returns the new status. See the package comment for the
// rules.
func (p Probes) Observe(s Status, k Kind, err error, at time.Time) Status {
	spec := p.Spec(k)
	if spec == nil || s.Failed != "" {
		return s
	}
	st := s.state(k)
	st.LastRun = at
	switch {
	case errors.Is(err, ErrUnknown):
		return s
	case err == nil:
		st.Successes++
		st.Failures, st.LastError = 0, ""
		if st.Successes >= spec.successThreshold() {
			st.Passing = true
		}
	default:
		st.Failures++
		st.Successes, st.LastError = 0, shorten(err.Error())
		if st.Failures >= spec.failureThreshold() {
			st.Passing = false
			if k != Readiness {
				s.Failed = string(k) + " probe failed: " + st.LastError
			}
		}
	}
	if k == Startup && st.Passing {
		s.Started = true
	}
	return s
}

// Ready reports whether a container run with status s is ready: started,
// not failed, and its readiness probe (if any) passing.
func (p Probes) Ready(s Status) bool {
	return s.Started && s.Failed == "" && (p.Readiness == nil || s.Readiness.Passing)
}

// NotReadyReason says why a container run with status s is not ready
// ("" when it is).
func (p Probes) NotReadyReason(s Status) string {
	switch {
	case p.Ready(s):
		return ""
	case s.Failed != "":
		return s.Failed
	case !s.Started:
		if s.Startup.LastError != "" {
			return "startup probe has not succeeded yet: " + s.Startup.LastError
		}
		return "startup probe has not succeeded yet"
	case s.Readiness.LastError != "":
		return "readiness probe failed: " + s.Readiness.LastError
	default:
		return "readiness probe has not succeeded yet"
	}
}

func shorten(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= maxMessage {
		return s
	}
	s = s[:maxMessage]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "..."
}

// ExecFunc runs argv inside the probed container and returns its exit
// status and (the start of) its output. timeout bounds the command from
// its start (CRI's ExecSync semantics: the runtime's own calls are not
// counted); when it passes the command is killed and the error wraps
// context.DeadlineExceeded. An error wrapping ErrUnknown means the
// command could not say anything about the container.
type ExecFunc func(ctx context.Context, argv []string, timeout time.Duration) (exitCode int, output string, err error)

// execOverhead bounds the runtime's calls around an exec probe's command
// (kubelet gives CRI ExecSync the probe's timeout plus its runtime
// request timeout).
const execOverhead = 30 * time.Second

// Check runs probe p once against the container at ip and returns nil on
// success. exec runs exec probes (nil: exec probes fail). An HTTP GET
// must answer 200-399 and a TCP connect must succeed within the probe's
// timeout; a command must exit 0 within it. When ctx itself ends the
// result wraps ErrUnknown.
func Check(ctx context.Context, p Spec, ip string, exec ExecFunc) error {
	timeout := p.timeout()
	bound := timeout
	if len(p.Exec) > 0 {
		bound += execOverhead
	}
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	err := check(cctx, p, ip, exec)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %v", ErrUnknown, ctx.Err())
	case errors.Is(err, ErrUnknown):
		return err
	case cctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s timed out after %v", p.Handler(), timeout)
	}
	return err
}

func check(ctx context.Context, p Spec, ip string, exec ExecFunc) error {
	if len(p.Exec) > 0 {
		if exec == nil {
			return errors.New("exec probes are not supported here")
		}
		code, out, err := exec(ctx, p.Exec, p.timeout())
		if err != nil {
			return err
		}
		if code != 0 {
			if out = strings.TrimSpace(out); out != "" {
				return fmt.Errorf("command exited with code %d: %s", code, out)
			}
			return fmt.Errorf("command exited with code %d", code)
		}
		return nil
	}
	addr := net.JoinHostPort(ip, strconv.Itoa(int(p.Port)))
	if !p.HTTP {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	scheme := "http"
	if p.HTTPS {
		scheme = "https"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+p.HTTPPath, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "starling-probe")
	req.Header.Set("Accept", "*/*")
	for _, h := range p.HTTPHeaders {
		if http.CanonicalHeaderKey(h.Name) == "Host" {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	// kubelet does not verify probe certificates either: the pod IP is
	// not in them.
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}
