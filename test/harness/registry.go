package harness

import (
	"crypto/subtle"
	"net/http"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ServeRegistry serves an OCI registry (go-containerregistry's
// pkg/registry, in memory) over plain HTTP on addr inside network
// namespace ns, answering only requests with basic auth user and
// password (401 with a challenge otherwise, as a private registry does);
// Close stops it.
func ServeRegistry(ns, addr, user, password string) (*http.Server, error) {
	l, err := ListenIn(ns, addr)
	if err != nil {
		return nil, err
	}
	reg := registry.New()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="starling-test"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	})}
	go srv.Serve(l)
	return srv, nil
}

// PushImage pushes the image of tarball tar (a docker-archive, as
// imagebuild writes) as ref ("host:port/repo:tag") to a plain-HTTP
// registry inside network namespace ns, with basic auth user and
// password.
func PushImage(ns, tar, ref, user, password string) error {
	img, err := tarball.ImageFromPath(tar, nil)
	if err != nil {
		return err
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return err
	}
	tr := &http.Transport{DialContext: DialInPath("/run/netns/" + ns)}
	return remote.Write(r, img, remote.WithAuth(&authn.Basic{Username: user, Password: password}), remote.WithTransport(tr))
}
