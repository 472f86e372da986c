package reconcile

import (
	"encoding/base64"
	"testing"
)

// TestRegistryCredsReadDockerConfigs: a kubernetes.io/dockerconfigjson
// Secret's auths (user and password, or "auth"), a legacy .dockercfg,
// Docker Hub's URL as its pull host, the first Secret winning, a
// missing Secret or a bad entry skipped.
func TestRegistryCredsReadDockerConfigs(t *testing.T) {
	auth := base64.StdEncoding.EncodeToString([]byte("bob:pw2"))
	src := fakeConfig{secrets: map[string]map[string][]byte{
		"ns/reg": {".dockerconfigjson": []byte(`{"auths":{"reg.lan:5000":{"username":"alice","password":"pw1"},"https://index.docker.io/v1/":{"auth":"` + auth + `"},"bad.example":{"auth":"!!"}}}`)},
		"ns/old": {".dockercfg": []byte(`{"reg.lan:5000":{"username":"eve","password":"x"},"old.example":{"username":"carol","password":"pw3"}}`)},
	}}
	got := RegistryCreds([]string{"missing", "reg", "old"}, "ns", src)
	want := map[string]RegistryCred{"reg.lan:5000": {"alice", "pw1"}, "registry-1.docker.io": {"bob", "pw2"}, "old.example": {"carol", "pw3"}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for h, c := range want {
		if got[h] != c {
			t.Errorf("%s: %+v, want %+v", h, got[h], c)
		}
	}
	if RegistryCreds(nil, "ns", src) != nil {
		t.Error("no pull secrets: credentials")
	}
}
