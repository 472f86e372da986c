package service

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// nftBlocks reads a table as nft writes it into its chains and sets, by
// name, each as its lines in order with blanks trimmed, then a set's
// elements one per line, sorted (nft lists elements in its own order;
// a chain's rules keep theirs, which is what they mean).
func nftBlocks(text string) map[string][]string {
	blocks, elems := map[string][]string{}, map[string][]string{}
	var name string
	var inElems bool
	for _, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		switch {
		case l == "" || strings.HasPrefix(l, "table "):
		case strings.HasSuffix(l, "{") && (strings.HasPrefix(l, "chain ") || strings.HasPrefix(l, "map ") || strings.HasPrefix(l, "set ")):
			name = strings.TrimSuffix(l, " {")
			blocks[name] = []string{}
		case l == "}" && !inElems:
			name = ""
		case strings.HasPrefix(l, "elements = {"):
			inElems = true
			l = strings.TrimPrefix(l, "elements = {")
			fallthrough
		default:
			if inElems {
				done := strings.HasSuffix(l, "}")
				for _, e := range strings.Split(strings.TrimSuffix(l, "}"), ",") {
					if e = strings.TrimSpace(e); e != "" {
						elems[name] = append(elems[name], "element "+e)
					}
				}
				if done {
					inElems = false
				}
				continue
			}
			blocks[name] = append(blocks[name], l)
		}
	}
	for name, es := range elems {
		slices.Sort(es)
		blocks[name] = append(blocks[name], es...)
	}
	return blocks
}

// asListed is NFTText's table as `nft list` shows it: the endpoint maps'
// index, declared with typeof for `nft -f` (numgen's integer), is held as
// a mark and listed as one (0x00000000; README, nftables proxy mode).
func asListed(text string) string {
	text = strings.NewReplacer(
		"typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport",
		"type ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service",
		"typeof meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport",
		"type inet_proto . inet_service . mark : ipv4_addr . inet_service").Replace(text)
	// "... . 80 . 3 : 10.22.3.2 . 8080": the index before the colon.
	return regexp.MustCompile(` \. (\d+) : (\d+\.\d+\.\d+\.\d+ \. \d+)`).ReplaceAllStringFunc(text, func(m string) string {
		var i int
		var rest string
		fmt.Sscanf(m, " . %d : ", &i)
		rest = m[strings.Index(m, " : "):]
		return fmt.Sprintf(" . 0x%08x%s", i, rest)
	})
}

// The dry run's text and the kernel's bytecode come from two renderers
// (nftRule.String and nftBackend.exprs, nftFixed and fixedChains): after
// a full sync in a real kernel, `nft list table ip starling` reads back
// what NFTText says, chain by chain and element by element.
func TestNFTTextIsWhatTheKernelHolds(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skipf("nft: %v", err)
	}
	cfg := Config{ClusterCIDR: clusterCIDR}
	ports := benchPorts(3)
	ports[2].Endpoints = nil // a Service without endpoints
	inNewNetns(t, func() error {
		s, err := NewNFTSyncer(nil)
		if err != nil {
			return err
		}
		if _, err := s.Sync(context.Background(), ports, cfg); err != nil {
			return err
		}
		out, err := exec.Command("nft", "list", "table", "ip", NFTTable).CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft list: %v: %s", err, out)
		}
		want, got := nftBlocks(asListed(string(NFTText(ports, cfg)))), nftBlocks(string(out))
		var diffs []string
		for name, w := range want {
			if g := got[name]; !slices.Equal(g, w) {
				diffs = append(diffs, fmt.Sprintf("%s:\n  text   %q\n  kernel %q", name, w, g))
			}
		}
		for name := range got {
			if _, ok := want[name]; !ok {
				diffs = append(diffs, "in the kernel only: "+name)
			}
		}
		if len(diffs) > 0 {
			slices.Sort(diffs)
			return fmt.Errorf("the dry run's text and the kernel differ:\n%s\n\nkernel:\n%s", strings.Join(diffs, "\n"), out)
		}
		return nil
	})
}
