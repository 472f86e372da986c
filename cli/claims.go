package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// decodeClaims reads the claims of items as the API serves them, with
// their status (the node fills it in): not through manifest.Decode, which
// would clear it. Those that do not decode are named on warn.
func decodeClaims(items []api.Object, warn io.Writer) []*corev1.PersistentVolumeClaim {
	var out []*corev1.PersistentVolumeClaim
	for _, it := range items {
		c := &corev1.PersistentVolumeClaim{}
		if err := json.Unmarshal(it.Object, c); err != nil {
			fmt.Fprintf(warn, "warning: skipped a stored persistentvolumeclaim that does not decode (written by node %s, version %s): %v\n", it.Origin, it.Version, err)
			continue
		}
		out = append(out, c)
	}
	return out
}

// getClaims is 'get pvc [NAME]': kubectl's columns with the node that
// holds each claim's data and what it holds (NAME, STATUS, NODE,
// CAPACITY, USED, ACCESS MODES, STORAGECLASS, AGE; -o wide: the size
// limit, enforced or advisory, and the directory), or YAML or JSON.
func getClaims(g *globals, cmd *cobra.Command, c *client.Client, o getOpts, name string) error {
	ctx, cancel := timeoutCtx(cmd)
	defer cancel()
	items, err := c.List(ctx, "persistentvolumeclaim")
	if err != nil {
		return err
	}
	var shown []*corev1.PersistentVolumeClaim
	for _, pvc := range decodeClaims(items, cmd.ErrOrStderr()) {
		if o.wants(pvc.Namespace, g.namespace) && (name == "" || pvc.Name == name) {
			shown = append(shown, pvc)
		}
	}
	if name != "" && len(shown) == 0 {
		return fmt.Errorf("persistentvolumeclaim %q not found in namespace %q", name, g.namespace)
	}
	if name != "" && (o.output == "json" || o.output == "yaml") {
		_, err := structured(g.stdout, o.output, shown[0])
		return err
	}
	if ok, err := structured(g.stdout, o.output, map[string]any{"apiVersion": "v1", "kind": "List", "items": shown}); ok {
		return err
	}
	t := newTable(g.stdout, o.cells("NAMESPACE", []string{"NAME", "STATUS", "NODE", "CAPACITY", "USED", "ACCESS MODES", "STORAGECLASS", "AGE"}, "SIZE LIMIT", "DIRECTORY")...)
	for _, pvc := range shown {
		t.row(o.cells(pvc.Namespace, claimRow(pvc), orNone(pvc.Annotations[manifest.SizeLimitAnnotation]), orNone(pvc.Annotations[manifest.VolumeDirAnnotation]))...)
	}
	return t.flush()
}

// claimRow is a claim's cells in get pvc.
func claimRow(pvc *corev1.PersistentVolumeClaim) []string {
	capacity := ""
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		capacity = q.String()
	}
	used := ""
	if n, err := strconv.ParseInt(pvc.Annotations[manifest.UsedAnnotation], 10, 64); err == nil {
		used = humanize.IBytes(uint64(max(n, 0)))
	}
	var modes []string
	for _, m := range pvc.Spec.AccessModes {
		modes = append(modes, accessModeShort(m))
	}
	class := ""
	if pvc.Spec.StorageClassName != nil {
		class = *pvc.Spec.StorageClassName
	}
	phase := string(pvc.Status.Phase)
	if pvc.DeletionTimestamp != nil {
		phase = "Terminating"
	}
	return []string{pvc.Name, phase, orNone(pvc.Annotations[manifest.SelectedNodeAnnotation]), capacity, used,
		strings.Join(modes, ","), class, age(pvc.CreationTimestamp.Time)}
}

// accessModeShort is kubectl's short form of an access mode (RWO, RWOP).
func accessModeShort(m corev1.PersistentVolumeAccessMode) string {
	switch m {
	case corev1.ReadWriteOnce:
		return "RWO"
	case corev1.ReadWriteOncePod:
		return "RWOP"
	case corev1.ReadOnlyMany:
		return "ROX"
	case corev1.ReadWriteMany:
		return "RWX"
	}
	return string(m)
}

// describeClaim prints one claim as kubectl describe pvc does, with the
// node and directory of its data and what it holds.
func describeClaim(w io.Writer, it api.Object, mountedBy []string) error {
	pvcs := decodeClaims([]api.Object{it}, w)
	if len(pvcs) == 0 {
		return fmt.Errorf("the claim does not decode")
	}
	pvc := pvcs[0]
	row := claimRow(pvc)
	p := func(k, v string) { fmt.Fprintf(w, "%-15s%s\n", k+":", v) }
	p("Name", pvc.Name)
	p("Namespace", pvc.Namespace)
	p("StorageClass", row[6])
	p("Status", row[1])
	p("Node", row[2])
	p("Volume", orNone(pvc.Spec.VolumeName))
	p("Directory", orNone(pvc.Annotations[manifest.VolumeDirAnnotation])+" (under the node's --data-dir)")
	p("Labels", labelString(pvc.Labels))
	request := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	p("Requested", request.String())
	p("Capacity", orNone(row[3]))
	p("Used", orNone(row[4]))
	p("Size limit", orNone(pvc.Annotations[manifest.SizeLimitAnnotation]))
	p("Access Modes", row[5])
	p("VolumeMode", "Filesystem")
	p("Used By", orNone(strings.Join(mountedBy, ", ")))
	return nil
}

// claimUsers are the replicas that mount claim namespace/name: those of
// the workloads whose pods mount it, and the StatefulSet ordinal whose
// volumeClaimTemplate made it.
func claimUsers(ctx context.Context, c *client.Client, namespace, name string) ([]string, error) {
	mounting := map[string]int{} // workload -> ordinal (-1: every one)
	for _, kind := range []string{"deployment", "statefulset"} {
		items, err := c.List(ctx, kind)
		if err != nil {
			return nil, err
		}
		for _, it := range items {
			o, err := manifest.Decode(it.Object)
			if err != nil || o.Namespace != namespace {
				continue
			}
			if slices.Contains(manifest.ClaimsOf(&o.PodTemplate().Spec), name) {
				mounting[o.Name] = -1
			}
			if o.StatefulSet == nil {
				continue
			}
			for _, t := range o.StatefulSet.Spec.VolumeClaimTemplates {
				if rest, ok := strings.CutPrefix(name, t.Name+"-"+o.Name+"-"); ok {
					if ord, err := strconv.Atoi(rest); err == nil {
						mounting[o.Name] = ord
					}
				}
			}
		}
	}
	reps, err := c.Replicas(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range reps {
		if ord, ok := mounting[r.Workload]; ok && r.Namespace == namespace && (ord < 0 || ord == r.Ordinal) {
			out = append(out, r.Name+" (on "+orNone(r.Node)+")")
		}
	}
	return out, nil
}

// newVolumeCmd is 'volume release NS/CLAIM'.
func newVolumeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "volume", Short: "Manage the volumes of PersistentVolumeClaims"}
	release := &cobra.Command{
		Use:   "release [NAMESPACE/]CLAIM",
		Short: "Give up the data of a claim whose node is gone: its next replica starts empty on another node",
		Long: `A replica that mounts a PersistentVolumeClaim runs only on the node that holds the
claim's data. When that node is gone for good (a dead disk, a machine given away),
the replica waits, Pending, naming the node. 'volume release' gives the data up on
purpose: the claim is bound again, empty, on the node that next runs a replica that
mounts it. Refused while the node is up (delete the claim to delete its data). If
the node comes back, it deletes the released data.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name := g.namespace, args[0]
			if before, after, ok := strings.Cut(args[0], "/"); ok {
				ns, name = before, after
			}
			c, ctx, cancel, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			res, err := c.ReleaseClaim(ctx, ns, name)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "persistentvolumeclaim/%s %s\n", res.Name, res.Result)
			return nil
		},
	}
	release.Flags().StringVarP(&g.namespace, "namespace", "n", "default", "namespace of the claim")
	cmd.AddCommand(release)
	return cmd
}
