package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestClientConfigSelectsServerPinAndToken: --config gives the server,
// CA pin and token; --server and --token override its server and token;
// a config open to others, with an unknown field or a malformed pin is
// refused naming the fix; https with no pins is refused, and so is
// http:// with a TLS cluster's config (its token would go in the clear).
func TestClientConfigSelectsServerPinAndToken(t *testing.T) {
	dir := t.TempDir()
	pin := strings.Repeat("ab", 32)
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	good := write("good", "server: https://192.0.2.1:7443\ncaPin: "+pin+"\nserverPin: "+pin+"\ntoken: tok-0123456789abcdef\n", 0o600)
	g := &globals{config: good}
	c, err := g.client()
	if err != nil || c.Base() != "https://192.0.2.1:7443" || c.Token() != "tok-0123456789abcdef" {
		t.Fatalf("config: %+v %v", c, err)
	}
	g = &globals{config: good, server: "https://192.0.2.2:7443", token: "other-token-xxxxxxxx"}
	if c, err := g.client(); err != nil || c.Base() != "https://192.0.2.2:7443" || c.Token() != "other-token-xxxxxxxx" {
		t.Fatalf("overrides: %+v %v", c, err)
	}
	for name, tc := range map[string]struct {
		body string
		mode os.FileMode
		want string
	}{
		"open":          {"server: https://192.0.2.1:7443\ncaPin: " + pin + "\n", 0o644, "chmod 600"},
		"unknown":       {"server: https://192.0.2.1:7443\ncaPin: " + pin + "\ncaPn: x\n", 0o600, "starling config"},
		"pin":           {"server: https://192.0.2.1:7443\ncaPin: abc\n", 0o600, "64 hex digits"},
		"no pin":        {"server: https://192.0.2.1:7443\n", 0o600, "has no pins"},
		"no server pin": {"server: https://192.0.2.1:7443\ncaPin: " + pin + "\n", 0o600, "has no pins"},
	} {
		g := &globals{config: write(name, tc.body, tc.mode)}
		if _, err := g.client(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
	// The config's token never goes out over plain HTTP.
	if _, err := (&globals{config: good, server: "http://192.0.2.1:7443"}).client(); err == nil || !strings.Contains(err.Error(), "use https://192.0.2.1:7443") {
		t.Errorf("http:// with a TLS cluster's config: %v", err)
	}
	if _, err := (&globals{config: filepath.Join(dir, "missing")}).client(); err == nil {
		t.Error("a missing --config was ignored")
	}
}
