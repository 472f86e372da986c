// Package probe runs Kubernetes-style readiness probes (httpGet and
// tcpSocket) with Kubernetes' timing semantics: initialDelaySeconds,
// periodSeconds, timeoutSeconds, successThreshold, failureThreshold.
//
// State.Observe and Due are pure; Check is the I/O edge.
package probe

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Spec is one probe, with its port resolved to a number.
type Spec struct {
	HTTPPath         string // httpGet when Port > 0 and HTTP is true
	HTTP             bool
	Port             int32
	InitialDelay     time.Duration
	Period           time.Duration // default 10 s
	Timeout          time.Duration // default 1 s
	SuccessThreshold int           // default 1
	FailureThreshold int           // default 3
}

// State is what the prober knows of one container's probe.
type State struct {
	Ready     bool
	Successes int // consecutive
	Failures  int // consecutive
	LastRun   time.Time
}

// Due reports whether the probe should run at now for a container that
// started at started: not before InitialDelay, then every Period.
func Due(s State, p Spec, started, now time.Time) bool {
	if now.Sub(started) < p.InitialDelay {
		return false
	}
	return s.LastRun.IsZero() || now.Sub(s.LastRun) >= p.Period
}

// Observe folds one probe result into the state: Ready turns on after
// SuccessThreshold consecutive successes and off after FailureThreshold
// consecutive failures (Kubernetes semantics; a new container starts not
// ready).
func (s State) Observe(ok bool, p Spec, at time.Time) State {
	s.LastRun = at
	if ok {
		s.Successes++
		s.Failures = 0
		if s.Successes >= max(p.SuccessThreshold, 1) {
			s.Ready = true
		}
	} else {
		s.Failures++
		s.Successes = 0
		if s.Failures >= max(p.FailureThreshold, 1) {
			s.Ready = false
		}
	}
	return s
}

// Check runs the probe against ip once, bounded by the probe's timeout:
// an HTTP GET must answer 200-399, a TCP connect must succeed.
func Check(ctx context.Context, p Spec, ip string) error {
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := net.JoinHostPort(ip, strconv.Itoa(int(p.Port)))
	if !p.HTTP {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+p.HTTPPath, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "starling-probe")
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}
