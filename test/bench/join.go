package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// joinBench measures, on a 2-node cluster, how long a new node takes to
// join: with a join token (TLS to the seed's peer port, the CA pin
// checked, a certificate issued) and, for comparison, with --insecure (no
// token, no CA, gossip in the clear). Each run starts node n2 on an empty
// data dir and times until n1 lists it alive and ready; between runs n2 is
// stopped, forgotten and wiped. For the token path it also reads the
// token exchange alone from n2's log ("joined the cluster with a token",
// took=...). Figures: medians of runs.
func joinBench(a artifacts, runs int) error {
	ctx := context.Background()
	fmt.Printf("\n== join: a new node on an empty data dir until the seed lists it alive and ready (median of %d) ==\n", runs)
	fmt.Printf("%-10s %14s %18s\n", "mode", "join->ready", "token exchange")
	for _, mode := range []string{"token", "insecure"} {
		var args []string
		if mode == "insecure" {
			args = []string{"--insecure"}
		}
		ready, exchange, err := measureJoins(ctx, a, mode, args, runs)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		ex := "-"
		if len(exchange) > 0 {
			ex = median(exchange).Round(100 * time.Microsecond).String()
		}
		fmt.Printf("%-10s %14s %18s\n", mode, median(ready).Round(time.Millisecond), ex)
	}
	fmt.Println("join->ready includes making the token (one CLI call), starting the agent, the first subnet claim settling (--subnet-settle 3s) and gossip reaching n1.")
	return nil
}

var tookRE = regexp.MustCompile(`joined the cluster with a token.* took=(\S+)`)

func measureJoins(ctx context.Context, a artifacts, mode string, args []string, runs int) (ready, exchange []time.Duration, err error) {
	c, err := harness.NewNamed(filepath.Join(a.dir, "join-"+mode), fmt.Sprintf("stbj%s%d-", mode[:1], os.Getpid()), a.binary, nil)
	if err != nil {
		return nil, nil, err
	}
	defer c.Close()
	n1, err := c.AddNode("n1", 1)
	if err != nil {
		return nil, nil, err
	}
	if err := n1.StartAgent(args...); err != nil {
		return nil, nil, err
	}
	n2, err := c.AddNode("n2", 2)
	if err != nil {
		return nil, nil, err
	}
	for i := 0; i < runs; i++ {
		start := time.Now()
		if err := n2.StartAgent(args...); err != nil {
			return nil, nil, err
		}
		d, err := waitUntil(ctx, start, time.Minute, "n1 lists n2 ready", func() (bool, error) {
			out, err := n1.CLI("get", "nodes", "n2", "-o", "json")
			return err == nil && regexp.MustCompile(`"state": "alive"[\s\S]*"ready": true`).MatchString(out), err
		})
		if err != nil {
			return nil, nil, err
		}
		ready = append(ready, d)
		if log, err := os.ReadFile(n2.AgentLogPath()); err == nil {
			if m := tookRE.FindAllSubmatch(log, -1); len(m) > 0 {
				if t, err := time.ParseDuration(string(m[len(m)-1][1])); err == nil {
					exchange = append(exchange, t)
				}
			}
		}
		n2.KillAgent(syscall.SIGTERM)
		if _, err := waitUntil(ctx, time.Now(), 30*time.Second, "forget n2", func() (bool, error) {
			_, err := n1.CLI("node", "forget", "n2")
			return err == nil, err
		}); err != nil {
			return nil, nil, err
		}
		if err := os.RemoveAll(n2.DataDir); err != nil {
			return nil, nil, err
		}
		if err := os.MkdirAll(n2.DataDir, 0o700); err != nil {
			return nil, nil, err
		}
	}
	return ready, exchange, nil
}
