package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
)

// copyLogs prints the log that o selects of replica arg ("NAME" or
// "replica/NAME") to stdout.
func copyLogs(ctx context.Context, c *client.Client, g *globals, arg string, o api.LogOptions) error {
	body, err := c.Logs(ctx, g.namespace, strings.TrimPrefix(arg, "replica/"), o)
	if err != nil {
		return err
	}
	defer body.Close()
	_, err = io.Copy(g.stdout, body)
	return err
}

// followAll follows the logs of every container of replica arg at once,
// as kubectl logs -f --all-containers does, their lines interleaved
// whole, until every run ends.
func followAll(ctx context.Context, c *client.Client, g *globals, arg string, o api.LogOptions, containers []string) error {
	var mu sync.Mutex
	errs := make([]error, len(containers))
	var wg sync.WaitGroup
	for i, name := range containers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := o
			o.Container = name
			body, err := c.Logs(ctx, g.namespace, strings.TrimPrefix(arg, "replica/"), o)
			if err != nil {
				errs[i] = err
				return
			}
			defer body.Close()
			r := bufio.NewReader(body)
			for {
				line, err := r.ReadBytes('\n')
				if len(line) > 0 {
					mu.Lock()
					g.stdout.Write(line)
					mu.Unlock()
				}
				if err != nil {
					if !errors.Is(err, io.EOF) {
						errs[i] = err
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// containersOf lists the containers of replica namespace/name, init
// containers first, as its node reports them ("" alone for a replica of
// one container: its own).
func containersOf(ctx context.Context, c *client.Client, namespace, name string) ([]string, error) {
	items, err := c.Replicas(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range items {
		if r.Namespace != namespace || r.Name != name {
			continue
		}
		if len(r.Containers) == 0 {
			return []string{""}, nil
		}
		names := make([]string, len(r.Containers))
		for i, cs := range r.Containers {
			names[i] = cs.Name
		}
		return names, nil
	}
	return nil, fmt.Errorf("replica %q not found in namespace %q (see 'starling get replicas')", name, namespace)
}
