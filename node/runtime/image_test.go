package runtime

import "testing"

// TestNormalizeImage: references as containerd and Docker store them.
func TestNormalizeImage(t *testing.T) {
	for in, want := range map[string]string{
		"nginx":                     "docker.io/library/nginx:latest",
		"nginx:1.22":                "docker.io/library/nginx:1.22",
		"library/nginx:1.22":        "docker.io/library/nginx:1.22",
		"docker.io/nginx":           "docker.io/library/nginx:latest",
		"bitnami/redis:7":           "docker.io/bitnami/redis:7",
		"starling.local/echo:v1":    "starling.local/echo:v1",
		"localhost:5000/app":        "localhost:5000/app:latest",
		"ghcr.io/a/b@sha256:" + sha: "ghcr.io/a/b@sha256:" + sha,
		"nginx:1.22@sha256:" + sha:  "docker.io/library/nginx@sha256:" + sha,
		"NotValid":                  "NotValid", // refused at apply; passed through
	} {
		if got := NormalizeImage(in); got != want {
			t.Errorf("NormalizeImage(%q) = %q, want %q", in, got, want)
		}
	}
	if got := imageName("nginx:1.22"); got != "nginx:1.22 (docker.io/library/nginx:1.22)" {
		t.Errorf("imageName: %q", got)
	}
	if got := imageName("starling.local/echo:v1"); got != "starling.local/echo:v1" {
		t.Errorf("imageName of a full name: %q", got)
	}
}

const sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
