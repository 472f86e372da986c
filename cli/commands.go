package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/starling-orchestrator/starling/node"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
	"github.com/starling-orchestrator/starling/node/manifest"
)

func resultLine(r api.ApplyResult) string {
	switch r.Kind {
	case manifest.KindService, manifest.KindConfigMap, manifest.KindSecret, manifest.KindPersistentVolumeClaim:
		return fmt.Sprintf("%s/%s %s", strings.ToLower(r.Kind), r.Name, r.Result)
	case manifest.KindIngress:
		return fmt.Sprintf("ingress.networking.k8s.io/%s %s", r.Name, r.Result)
	}
	return fmt.Sprintf("%s.apps/%s %s", strings.ToLower(r.Kind), r.Name, r.Result)
}

func newApplyCmd(g *globals) *cobra.Command {
	var src sources
	cmd := &cobra.Command{
		Use:   "apply -f FILE|DIR|- [-f ...] [-R] | -k DIR",
		Short: "Create or update Deployments, StatefulSets, Services, ConfigMaps, Secrets, claims and Ingresses from manifests",
		Long: `Apply Kubernetes-shaped manifests (apps/v1 Deployment and StatefulSet, v1 Service, ConfigMap,
Secret and PersistentVolumeClaim, networking.k8s.io/v1 Ingress): YAML or
JSON files, multi-document files, directories of *.yaml/*.yml/*.json (-R: with
their subdirectories), - for standard input, or a kustomization (-k DIR, built
as kubectl -k builds it). Every object is validated first; if any is invalid
nothing is stored and every problem is listed. A field your files never set
keeps what other commands set (kubectl's apply: the file is recorded in the
kubectl.kubernetes.io/last-applied-configuration annotation).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(src.files) == 0 && src.kustomization == "" {
				return fmt.Errorf("-f or -k: required (a file, a directory or - for stdin; or a kustomization's directory)")
			}
			objs, err := src.read(g.stdin)
			if err != nil {
				return err
			}
			warnIgnored(cmd.ErrOrStderr(), objs)
			req := api.ApplyRequest{}
			for _, o := range objs {
				b, err := manifest.Encode(manifest.Record(o))
				if err != nil {
					return err
				}
				req.Objects = append(req.Objects, b)
			}
			c, ctx, cancel, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			var resp api.ApplyResponse
			if resp.Results, err = c.Apply(ctx, req); err != nil {
				return err
			}
			for _, r := range resp.Results {
				fmt.Fprintln(g.stdout, resultLine(r))
			}
			return nil
		},
	}
	src.flags(cmd, "manifest file, directory, or - for stdin (repeatable)")
	return cmd
}

// warnIgnored says once which fields of objs the API server sets were
// ignored (a `kubectl get -o yaml` applied again carries them).
func warnIgnored(w io.Writer, objs []manifest.Object) {
	var parts []string
	for _, o := range objs {
		if len(o.Ignored) > 0 {
			parts = append(parts, strings.ToLower(o.Kind)+"/"+o.Name+" ("+strings.Join(o.Ignored, ", ")+")")
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "Warning: ignored the fields the API server sets, which Starling sets itself: %s\n", strings.Join(parts, "; "))
	}
}

// splitRef parses "KIND/NAME" or ("KIND", "NAME").
func splitRef(args []string) (kind, name string, err error) {
	switch len(args) {
	case 1:
		k, n, ok := strings.Cut(args[0], "/")
		if !ok || k == "" || n == "" {
			return "", "", fmt.Errorf("%q: expected KIND/NAME or KIND NAME, e.g. deployment/hello", args[0])
		}
		return k, n, nil
	case 2:
		return args[0], args[1], nil
	}
	return "", "", fmt.Errorf("expected KIND/NAME or KIND NAME, e.g. deployment/hello")
}

func newDeleteCmd(g *globals) *cobra.Command {
	var src sources
	cmd := &cobra.Command{
		Use:   "delete (-f FILE [-R] | -k DIR | KIND NAME | KIND/NAME)",
		Short: "Delete Deployments, StatefulSets, Services, Ingresses, ConfigMaps, Secrets and claims",
		RunE: func(cmd *cobra.Command, args []string) error {
			type ref struct{ kind, ns, name string }
			var refs []ref
			if len(src.files) > 0 || src.kustomization != "" {
				if len(args) > 0 {
					return fmt.Errorf("give either -f (or -k) or KIND NAME, not both")
				}
				objs, err := src.read(g.stdin)
				if err != nil {
					return err
				}
				for _, o := range objs {
					refs = append(refs, ref{o.Kind, o.Namespace, o.Name})
				}
			} else {
				kind, name, err := splitRef(args)
				if err != nil {
					return err
				}
				refs = append(refs, ref{kind, g.namespace, name})
			}
			c, ctx, cancel, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			var failed []string
			for _, r := range refs {
				var res api.ApplyResult
				if res, err = c.Delete(ctx, r.kind, r.ns, r.name); err != nil {
					failed = append(failed, err.Error())
					continue
				}
				fmt.Fprintln(g.stdout, resultLine(res))
			}
			if len(failed) > 0 {
				return fmt.Errorf("%s", strings.Join(failed, "; "))
			}
			return nil
		},
	}
	src.flags(cmd, "delete the objects in this manifest file, directory or - (repeatable)")
	cmd.Flags().StringVarP(&g.namespace, "namespace", "n", "default", "namespace of KIND NAME")
	return cmd
}

func newScaleCmd(g *globals) *cobra.Command {
	var replicas int32
	cmd := &cobra.Command{
		Use:   "scale (deployment|statefulset)/NAME --replicas N",
		Short: "Set a Deployment's or StatefulSet's number of replicas",
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, name, err := splitRef(args)
			if err != nil {
				return err
			}
			k, _ := manifest.KindOf(kind)
			if k != manifest.KindDeployment && k != manifest.KindStatefulSet {
				return fmt.Errorf("scale: only deployments and statefulsets can be scaled, not %q", kind)
			}
			if !cmd.Flags().Changed("replicas") {
				return fmt.Errorf("--replicas: required")
			}
			return g.printResult(call(g, cmd, func(ctx context.Context, c *client.Client) (api.ApplyResult, error) {
				return c.Scale(ctx, k, g.namespace, name, replicas)
			}))
		},
	}
	cmd.Flags().Int32Var(&replicas, "replicas", 0, "the new number of replicas (required)")
	cmd.Flags().StringVarP(&g.namespace, "namespace", "n", "default", "namespace")
	return cmd
}

func newLogsCmd(g *globals) *cobra.Command {
	var follow, previous, timestamps, all bool
	var container string
	var tail int
	var since time.Duration
	var sinceTime string
	cmd := &cobra.Command{
		Use:   "logs REPLICA [-c CONTAINER | --all-containers] [-f] [-p] [--tail N] [--since 1h | --since-time TIME] [--timestamps]",
		Short: "Print a replica's stdout and stderr",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			o := api.LogOptions{Follow: follow, Previous: previous, Tail: tail, Timestamps: timestamps}
			switch {
			case since != 0 && sinceTime != "":
				return errors.New("--since and --since-time: give one of them")
			case since < 0:
				return fmt.Errorf("--since %v: must be positive, e.g. 10m", since)
			case since > 0:
				// Whole seconds, rounded up, as kubectl sends them.
				o.SinceSeconds = int64((since + time.Second - 1) / time.Second)
			case sinceTime != "":
				t, err := time.Parse(time.RFC3339, sinceTime)
				if err != nil {
					return fmt.Errorf("--since-time %q: want an RFC 3339 time, e.g. 2026-12-01T10:00:00Z", sinceTime)
				}
				o.SinceTime = t
			}
			name := strings.TrimPrefix(args[0], "replica/")
			containers := []string{container}
			if all {
				if container != "" {
					return errors.New("--all-containers and --container: give one of them")
				}
				if containers, err = containersOf(ctx, c, g.namespace, name); err != nil {
					return err
				}
			}
			if follow && len(containers) > 1 {
				return followAll(ctx, c, g, args[0], o, containers) // logs.go
			}
			for _, cn := range containers {
				o.Container = cn
				if err := copyLogs(ctx, c, g, args[0], o); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&container, "container", "c", "", "print this container's output (default: the replica's first container)")
	cmd.Flags().BoolVar(&all, "all-containers", false, "print the output of every container of the replica, init containers first")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output until the run ends")
	cmd.Flags().BoolVarP(&previous, "previous", "p", false, "print the previous run's output (of a replica that restarted)")
	cmd.Flags().IntVar(&tail, "tail", -1, "print only the last N lines (-1: all)")
	cmd.Flags().DurationVar(&since, "since", 0, "print only lines written in this last while, e.g. 10m, 2h")
	cmd.Flags().StringVar(&sinceTime, "since-time", "", "print only lines written at or after this time (RFC 3339)")
	cmd.Flags().BoolVar(&timestamps, "timestamps", false, "start each line with the time it was written (RFC 3339, nanoseconds)")
	cmd.Flags().StringVarP(&g.namespace, "namespace", "n", "default", "namespace")
	return cmd
}

func newImageCmd(g *globals) *cobra.Command {
	img := &cobra.Command{Use: "image", Short: "Manage images on a node"}
	imp := &cobra.Command{
		Use:   "import FILE.tar [FILE.tar...]",
		Short: "Load OCI or docker-archive tarballs into the node's image store",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, file := range args {
				f, err := os.Open(file)
				if err != nil {
					return fmt.Errorf("image import: %w", err)
				}
				var out api.ImageList
				body, finish := withUploadProgress(f, file)
				out.Items, err = c.ImportImages(cmd.Context(), body)
				finish()
				f.Close()
				if err != nil {
					return fmt.Errorf("image import %s: %w", file, err)
				}
				for _, i := range out.Items {
					fmt.Fprintf(g.stdout, "imported %s\n", i.Name)
				}
			}
			return nil
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the node's images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, cancel, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			var out api.ImageList
			if out.Items, err = c.Images(ctx); err != nil {
				return err
			}
			tw := newTable(g.stdout, "NAME", "DIGEST", "SIZE")
			for _, i := range out.Items {
				tw.row(i.Name, i.Digest, fmt.Sprintf("%.1fMiB", float64(i.Size)/(1<<20)))
			}
			return tw.flush()
		},
	}
	img.AddCommand(imp, ls)
	return img
}

func newNodeCmd(g *globals) *cobra.Command {
	node := &cobra.Command{Use: "node", Short: "Manage cluster members"}
	forget := &cobra.Command{
		Use:   "forget NAME",
		Short: "Forget a dead or departed node: revoke its key, free its name and subnet, rotate the gossip key",
		Long: `Forget a node that is down (dead or left): its pod subnet is free at once
(instead of after --subnet-reclaim-after), its name is freed, the key it
had is revoked (its records are refused from now on, also if it comes
back with its old data dir) and every join token is deleted (it must not
rejoin with the one it had: make a new token for the next node).

Then the gossip key is rotated ('starling keys rotate'): the forgotten
node still holds the old key, and every node holds the CA key, so until
the rotation it could still reach gossip under a new identity it made
itself. Every live node installs the new key only once the revocation has
reached it. If the rotation does not finish (a node unreachable), the
node is forgotten all the same and the command fails with what to run.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(g, cmd, func(ctx context.Context, c *client.Client) (api.ForgetResult, error) {
				return c.ForgetNode(ctx, args[0])
			})
			if err != nil {
				return err
			}
			if res.RevokedKey != "" {
				fmt.Fprintf(g.stdout, "node/%s forgotten; its key %s is revoked\n", res.Name, res.RevokedKey)
			} else {
				fmt.Fprintf(g.stdout, "node/%s forgotten\n", res.Name)
			}
			if res.Rotation == nil {
				return nil
			}
			printRotation(g.stdout, *res.Rotation)
			if res.RotationError != "" {
				return fmt.Errorf("node/%s is forgotten, but the gossip key rotation that shuts it out did not finish: %s", res.Name, res.RotationError)
			}
			printRotationDone(g.stdout, *res.Rotation)
			return nil
		},
	}
	node.AddCommand(forget)
	return node
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client and agent versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(g.stdout, "client: %s\n", node.Version)
			v, err := call(g, cmd, func(ctx context.Context, c *client.Client) (api.Version, error) { return c.Version(ctx) })
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "agent:  %s (node %s)\n", v.Version, v.Node)
			return nil
		},
	}
}

// printJSON writes v indented.
func printJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// sources are where apply and delete read manifests: files and
// directories (-f, -R) or a kustomization (-k).
type sources struct {
	files         []string
	recursive     bool
	kustomization string
}

func (s *sources) flags(cmd *cobra.Command, fileHelp string) {
	cmd.Flags().StringSliceVarP(&s.files, "filename", "f", nil, fileHelp)
	cmd.Flags().BoolVarP(&s.recursive, "recursive", "R", false, "-f DIR: the manifests of its subdirectories too")
	cmd.Flags().StringVarP(&s.kustomization, "kustomize", "k", "", "a kustomization's directory, built as kubectl -k builds it")
}

// read returns the objects of s (at least one).
func (s *sources) read(stdin io.Reader) ([]manifest.Object, error) {
	var objs []manifest.Object
	var err error
	switch {
	case s.kustomization != "" && len(s.files) > 0:
		return nil, fmt.Errorf("give -f or -k, not both")
	case s.kustomization != "":
		objs, err = manifest.ReadKustomization(s.kustomization)
	default:
		objs, err = manifest.ReadPaths(s.files, s.recursive, stdin)
	}
	if err != nil {
		return nil, err
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("no objects found in %s", strings.Join(append(s.files, s.kustomization), " "))
	}
	return objs, nil
}
