package dataplane

import (
	"context"
	"errors"
	"testing"

	"github.com/starling-orchestrator/starling/net/xtables"
)

// The proxy mode an agent picks by itself: nftables, unless the host's
// firewall is on iptables-legacy, the kernel is too old, or it does not
// take nftables rules.
func TestAutoProxyModeFollowsTheHost(t *testing.T) {
	old := nftMinKernel
	t.Cleanup(func() { nftMinKernel = old })
	ctx := context.Background()
	nftMinKernel = [2]int{0, 0}
	for _, tc := range []struct {
		name   string
		ipt    xtables.Backend
		nftErr error
		want   string
	}{
		{"host on iptables-nft", xtables.NFT, nil, ProxyNftables},
		{"host on iptables-legacy", xtables.Legacy, nil, ProxyIptables},
		{"no nf_tables", xtables.NFT, errors.New("protocol not supported"), ProxyIptables},
	} {
		if got, why := AutoProxyMode(ctx, tc.ipt, tc.nftErr); got != tc.want {
			t.Errorf("%s: %s (%s), want %s", tc.name, got, why, tc.want)
		}
	}
	nftMinKernel = [2]int{1 << 20, 0}
	if got, why := AutoProxyMode(ctx, xtables.NFT, nil); got != ProxyIptables || why == "" {
		t.Errorf("kernel older than the floor: %s (%s), want iptables", got, why)
	}
}
