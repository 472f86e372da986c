package api

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// LogOptions select what GET /v1/logs/{namespace}/{name} sends, as the
// kubelet's container log options (kubectl logs) do. They travel as query
// parameters: follow, previous, tail, sinceSeconds, sinceTime, timestamps,
// container.
type LogOptions struct {
	// Follow keeps sending until the run ends.
	Follow bool
	// Previous sends the run before a restart.
	Previous bool
	// Tail sends only the last Tail lines; -1 (or any negative) sends all.
	Tail int
	// SinceSeconds sends only lines written in the last SinceSeconds
	// seconds (0: no bound); SinceTime only lines written at or after it.
	// At most one of the two.
	SinceSeconds int64
	SinceTime    time.Time
	// Timestamps starts each line with the time it was written (RFC 3339
	// with nanoseconds).
	Timestamps bool
	// Container names the container of a replica of several ("": its
	// first app container, as kubectl defaults to).
	Container string
}

// Query is o as query parameters (none for the defaults).
func (o LogOptions) Query() url.Values {
	q := url.Values{}
	if o.Follow {
		q.Set("follow", "true")
	}
	if o.Previous {
		q.Set("previous", "true")
	}
	if o.Tail >= 0 {
		q.Set("tail", strconv.Itoa(o.Tail))
	}
	if o.Timestamps {
		q.Set("timestamps", "true")
	}
	if o.SinceSeconds > 0 {
		q.Set("sinceSeconds", strconv.FormatInt(o.SinceSeconds, 10))
	}
	if !o.SinceTime.IsZero() {
		q.Set("sinceTime", o.SinceTime.Format(time.RFC3339Nano))
	}
	if o.Container != "" {
		q.Set("container", o.Container)
	}
	return q
}

// ParseLogOptions reads LogOptions from query parameters; an error names
// the parameter at fault.
func ParseLogOptions(q url.Values) (LogOptions, error) {
	o := LogOptions{Tail: -1, Follow: q.Get("follow") == "true", Previous: q.Get("previous") == "true", Timestamps: q.Get("timestamps") == "true", Container: q.Get("container")}
	if errs := validation.IsDNS1123Label(o.Container); o.Container != "" && len(errs) > 0 {
		return o, fmt.Errorf("container: %q is not a container name: %s", o.Container, strings.Join(errs, "; "))
	}
	if v := q.Get("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return o, fmt.Errorf("tail: %q is not a number of lines (0 or more)", v)
		}
		o.Tail = n
	}
	since, sinceTime := q.Get("sinceSeconds"), q.Get("sinceTime")
	switch {
	case since != "" && sinceTime != "":
		return o, errors.New("sinceSeconds and sinceTime: give one of them (--since or --since-time)")
	case since != "":
		n, err := strconv.ParseInt(since, 10, 64)
		if err != nil || n <= 0 {
			return o, fmt.Errorf("sinceSeconds: %q is not a positive number of seconds", since)
		}
		o.SinceSeconds = n
	case sinceTime != "":
		t, err := time.Parse(time.RFC3339, sinceTime)
		if err != nil {
			return o, fmt.Errorf("sinceTime: %q is not an RFC 3339 time (e.g. 2026-12-01T10:00:00Z)", sinceTime)
		}
		o.SinceTime = t
	}
	return o, nil
}
