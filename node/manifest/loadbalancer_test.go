package manifest

import (
	"net/netip"
	"strings"
	"testing"
)

// TestParseLBPool: the pool an operator gives, and the errors that say
// what would do.
func TestParseLBPool(t *testing.T) {
	for _, c := range []struct{ in, want, err string }{
		{in: "192.168.1.240/28", want: "192.168.1.240/28"},
		{in: "192.168.1.250/32", want: "192.168.1.250/32"},
		{in: "192.168.1.241/28", err: "use 192.168.1.240/28"},
		{in: "192.168.1.240", err: "must be an IPv4 CIDR"},
		{in: "fd00::/120", err: "IPv6"},
		{in: "10.0.0.0/8", err: "at most a /16"},
		{in: "127.0.0.0/24", err: "unicast range"},
		{in: "169.254.1.0/24", err: "unicast range"},
	} {
		p, err := ParseLBPool(c.in)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: error %v, want one saying %q", c.in, err, c.err)
		case c.err == "" && (err != nil || p != netip.MustParsePrefix(c.want)):
			t.Errorf("%q: %v, %v; want %s", c.in, p, err, c.want)
		}
	}
}

// FuzzParseLBPool: whatever the setting holds, a pool that parses is a
// masked IPv4 prefix of /16 to /32 that prints as it was written.
func FuzzParseLBPool(f *testing.F) {
	for _, s := range []string{"192.168.1.240/28", "1.2.3.4/32", "::/0", "", "1.2.3.4/33", "01.2.3.4/24", "1.2.3.0/024"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseLBPool(s)
		if err != nil {
			return
		}
		if !p.Addr().Is4() || p.Bits() < lbPoolMinBits || p.Masked() != p || p.String() != s {
			t.Fatalf("%q parsed as %v", s, p)
		}
	})
}
