package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

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
