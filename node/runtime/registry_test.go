package runtime

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/containerd/v2/core/remotes/docker"
)

// unreachable fails every request as a registry whose name's lookup
// times out does.
type unreachable struct{ calls atomic.Int32 }

func (u *unreachable) RoundTrip(*http.Request) (*http.Response, error) {
	u.calls.Add(1)
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "i/o timeout", Name: "registry.example", IsTimeout: true}}
}

// TestUnreachableRegistryIsTriedOnce: containerd 2's resolver tries a
// request that timed out 5 times; a registry that cannot be connected to
// is tried once (as with containerd 1.7), with the lookup's message.
func TestUnreachableRegistryIsTriedOnce(t *testing.T) {
	for _, tt := range []struct {
		name  string
		wrap  func(http.RoundTripper) http.RoundTripper
		calls int32
	}{
		{"as containerd 2 does", func(rt http.RoundTripper) http.RoundTripper { return rt }, 5},
		{"connectOnce", func(rt http.RoundTripper) http.RoundTripper { return connectOnce{rt} }, 1},
	} {
		u := &unreachable{}
		hosts := docker.ConfigureDefaultRegistries(docker.WithClient(&http.Client{Transport: tt.wrap(u)}))
		_, _, err := docker.NewResolver(docker.ResolverOptions{Hosts: hosts}).Resolve(context.Background(), "registry.example/app:v1")
		if err == nil || u.calls.Load() != tt.calls {
			t.Errorf("%s: %d requests (want %d), err %v", tt.name, u.calls.Load(), tt.calls, err)
		}
		var dnsErr *net.DNSError
		if tt.name == "connectOnce" && (errors.As(err, &dnsErr) || !strings.Contains(err.Error(), "lookup registry.example: i/o timeout")) {
			t.Errorf("connectOnce: %v, want the lookup's message without its type", err)
		}
	}
}
