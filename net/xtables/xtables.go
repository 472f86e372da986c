// Package xtables finds which iptables backend the host's firewall uses,
// as kube-proxy's iptables wrapper does (kubernetes-sigs/iptables-wrappers),
// so that Starling writes its rules where the host's are.
//
// Linux has two iptables backends: iptables-nft (nf_tables underneath) and
// iptables-legacy (x_tables). Both can hold rules at once, and then both
// run, in an order nobody chose: a host whose firewall (Docker, ufw, a
// hand-written script) is on legacy while Starling writes with the
// distribution's default, nft, gets a FORWARD policy or a NAT rule that
// Starling's rules cannot see or undo.
package xtables

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// Backend is one iptables backend, by the names of its commands.
type Backend struct {
	// Mode is "nft", "legacy", or "" for the host's plain commands (its
	// iptables has no -nft and -legacy variants).
	Mode                    string
	Iptables, Restore, Save string
}

// The backends.
var (
	NFT    = Backend{Mode: "nft", Iptables: "iptables-nft", Restore: "iptables-nft-restore", Save: "iptables-nft-save"}
	Legacy = Backend{Mode: "legacy", Iptables: "iptables-legacy", Restore: "iptables-legacy-restore", Save: "iptables-legacy-save"}
	Plain  = Backend{Iptables: "iptables", Restore: "iptables-restore", Save: "iptables-save"}
)

// Other returns the backend that is not b (b itself for Plain).
func (b Backend) Other() Backend {
	switch b.Mode {
	case "nft":
		return Legacy
	case "legacy":
		return NFT
	}
	return b
}

func (b Backend) String() string {
	if b.Mode == "" {
		return "iptables (the host's default)"
	}
	return "iptables-" + b.Mode
}

// Detect chooses the backend for the current network namespace: the one
// holding more rules that are not Starling's (chains and comments named
// starling), nft on a tie (the default of current distributions, and what
// kube-proxy picks with no rules either way). Without both variants
// installed it returns Plain. why explains the choice, for the log.
func Detect(ctx context.Context) (b Backend, why string) {
	if _, err := exec.LookPath(NFT.Save); err != nil {
		return Plain, "iptables-nft-save is not installed: the host's iptables"
	}
	if _, err := exec.LookPath(Legacy.Save); err != nil {
		return Plain, "iptables-legacy-save is not installed: the host's iptables"
	}
	nft, legacy := countRules(ctx, NFT), countRules(ctx, Legacy)
	if legacy > nft {
		return Legacy, fmt.Sprintf("the host's rules are on iptables-legacy (%d rules there, %d with nft)", legacy, nft)
	}
	return NFT, fmt.Sprintf("iptables-nft: %d of the host's rules there, %d with legacy", nft, legacy)
}

// IsNFT reports whether b's iptables is the nf_tables variant
// (`iptables --version` says "(nf_tables)"), for Plain, whose variant the
// command's name does not tell.
func IsNFT(ctx context.Context, b Backend) bool {
	if b.Mode != "" {
		return b.Mode == "nft"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, b.Iptables, "--version").Output()
	return err == nil && bytes.Contains(out, []byte("nf_tables"))
}

// countRules counts the rules b holds that are not Starling's.
func countRules(ctx context.Context, b Backend) int {
	out, _ := save(ctx, b)
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "-A ") && !isStarling(line) {
			n++
		}
	}
	return n
}

// isStarling reports whether a rule line of iptables-save is Starling's:
// in, or jumping to, a STARLING- chain, or commented "starling: ...".
func isStarling(line string) bool {
	return strings.Contains(line, "STARLING-") || strings.Contains(line, `"starling: `)
}

func save(ctx context.Context, b Backend) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, b.Save).Output() // the nft variant warns of legacy tables on stderr
}

// RemoveStarling deletes Starling's chains and jump rules from backend b
// (left there by an agent that chose b before), in one restore per table,
// and reports how many chains it removed. Only chains named STARLING- and
// rules in built-in chains that jump to one are touched; the chains named
// in keep, and the rules that jump to them, stay.
func RemoveStarling(ctx context.Context, b Backend, keep ...string) (int, error) {
	out, err := save(ctx, b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", b.Save, err)
	}
	text, chains := removalText(out, keep...)
	if chains == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.Restore, "--noflush", "-w", "5")
	cmd.Stdin = bytes.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("%s: %v: %s", b.Restore, err, bytes.TrimSpace(out))
	}
	return chains, nil
}

// removalText turns iptables-save output into the restore input that
// deletes Starling's jump rules from built-in chains, then flushes and
// deletes Starling's chains, and counts those chains.
func removalText(saved []byte, keep ...string) ([]byte, int) {
	var out bytes.Buffer
	chains := 0
	var table string
	var jumps, decl, del []string
	flush := func() {
		if table != "" && len(decl)+len(jumps) > 0 {
			out.WriteString("*" + table + "\n")
			for _, l := range decl {
				out.WriteString(l + "\n")
			}
			for _, l := range jumps {
				out.WriteString(l + "\n")
			}
			for _, l := range del {
				out.WriteString(l + "\n")
			}
			out.WriteString("COMMIT\n")
		}
		jumps, decl, del = nil, nil, nil
	}
	sc := bufio.NewScanner(bytes.NewReader(saved))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "*"):
			flush()
			table = line[1:]
		case strings.HasPrefix(line, ":STARLING-") && len(f) > 0 && slices.Contains(keep, f[0][1:]):
		case strings.HasPrefix(line, ":STARLING-") && len(f) > 0:
			name := f[0][1:]
			decl = append(decl, ":"+name+" - [0:0]")
			del = append(del, "-X "+name)
			chains++
		case len(f) > 1 && f[0] == "-A" && !strings.HasPrefix(f[1], "STARLING-") && strings.Contains(line, "-j STARLING-"):
			if i := slices.Index(f, "-j"); i >= 0 && i+1 < len(f) && slices.Contains(keep, f[i+1]) {
				continue
			}
			jumps = append(jumps, "-D"+line[2:])
		}
	}
	flush()
	return out.Bytes(), chains
}
