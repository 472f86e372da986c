package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"sigs.k8s.io/yaml"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// statusPollInterval is how often `rollout status` asks the agent.
const statusPollInterval = 500 * time.Millisecond

func newRolloutCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout (status|history|undo|restart|pause|resume) deployment/NAME",
		Short: "Follow, list, undo, restart, pause or resume a Deployment's rollout",
		Long: `Manage the rollout of a Deployment, as kubectl rollout does. Every change of a
Deployment's pod template is recorded as a revision (at most
spec.revisionHistoryLimit old ones are kept); any node answers.`,
	}
	cmd.PersistentFlags().StringVarP(&g.namespace, "namespace", "n", "default", "namespace")
	cmd.AddCommand(newRolloutStatusCmd(g), newRolloutHistoryCmd(g), newRolloutUndoCmd(g),
		newRolloutActionCmd(g, "restart", "Replace every replica of a Deployment with a fresh one (a new revision of the same template)"),
		newRolloutActionCmd(g, "pause", "Pause a Deployment's rollout: template changes wait until it is resumed"),
		newRolloutActionCmd(g, "resume", "Resume a paused Deployment's rollout"))
	return cmd
}

// deploymentArg parses "deployment/NAME" or "deployment NAME" (any kind
// spelling KindOf accepts) for rollout subcommand sub.
func deploymentArg(sub string, args []string) (string, error) {
	example := "e.g. starling rollout " + sub + " deployment/hello"
	if len(args) == 1 && !strings.Contains(args[0], "/") {
		return "", fmt.Errorf("%q: give the kind too, deployment/%s or deployment %s (%s)", args[0], args[0], args[0], example)
	}
	kind, name, err := splitRef(args)
	if err != nil {
		return "", fmt.Errorf("%w (%s)", err, example)
	}
	if k, _ := manifest.KindOf(kind); k != manifest.KindDeployment {
		return "", fmt.Errorf("%q: only deployments have rollouts (%s)", kind, example)
	}
	return name, nil
}

// rolloutRoute is the API route of each rollout action command.
var rolloutRoute = map[string]api.Route{"restart": api.RouteRestart, "pause": api.RoutePause, "resume": api.RouteResume}

func newRolloutActionCmd(g *globals, action, short string) *cobra.Command {
	return &cobra.Command{
		Use:   action + " deployment/NAME",
		Short: short,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := deploymentArg(action, args)
			if err != nil {
				return err
			}
			return g.printResult(call(g, cmd, func(ctx context.Context, c *client.Client) (api.ApplyResult, error) {
				return c.RolloutAction(ctx, rolloutRoute[action], g.namespace, name)
			}))
		},
	}
}

func newRolloutUndoCmd(g *globals) *cobra.Command {
	var to int64
	cmd := &cobra.Command{
		Use:   "undo deployment/NAME [--to-revision N]",
		Short: "Roll a Deployment back to its previous revision, or to revision N",
		Long: `Write a recorded revision's pod template (and change cause) back into the
Deployment, as a new generation; replicas, strategy and the rest stay. The
template becomes the newest revision. See 'starling rollout history'.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := deploymentArg("undo", args)
			if err != nil {
				return err
			}
			if to < 0 {
				return fmt.Errorf("--to-revision %d: give a revision number from 'starling rollout history deployment/%s', or 0 for the previous one", to, name)
			}
			return g.printResult(call(g, cmd, func(ctx context.Context, c *client.Client) (api.ApplyResult, error) {
				return c.RolloutUndo(ctx, g.namespace, name, to)
			}))
		},
	}
	cmd.Flags().Int64Var(&to, "to-revision", 0, "the revision to roll back to (0: the previous one)")
	return cmd
}

func newRolloutHistoryCmd(g *globals) *cobra.Command {
	var revision int64
	cmd := &cobra.Command{
		Use:   "history deployment/NAME [--revision N]",
		Short: "List a Deployment's revisions, or show one's pod template",
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := deploymentArg("history", args)
			if err != nil {
				return err
			}
			c, ctx, cancel, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			var l api.RevisionList
			if l.Items, err = c.RolloutHistory(ctx, g.namespace, name); err != nil {
				return err
			}
			if cmd.Flags().Changed("revision") {
				return printRevision(g.stdout, name, l.Items, revision)
			}
			return printHistory(g.stdout, name, l.Items)
		},
	}
	cmd.Flags().Int64Var(&revision, "revision", 0, "show this revision's pod template as YAML")
	return cmd
}

func printHistory(w io.Writer, name string, revs []api.Revision) error {
	fmt.Fprintf(w, "deployment.apps/%s\n", name)
	if len(revs) == 0 {
		fmt.Fprintln(w, "No rollout history recorded yet (a Deployment stored before revisions existed gets one at its next apply).")
		return nil
	}
	t := newTable(w, "REVISION", "HASH", "IMAGE", "CHANGE-CAUSE", "CREATED")
	for _, r := range revs {
		cause := r.ChangeCause
		if cause == "" {
			cause = "<none>"
		}
		var images []string
		for _, c := range r.Template.Spec.Containers {
			images = append(images, c.Image)
		}
		t.row(strconv.FormatInt(r.Revision, 10), r.SpecHash, strings.Join(images, ","), cause, r.Created.UTC().Format(time.RFC3339))
	}
	return t.flush()
}

func printRevision(w io.Writer, name string, revs []api.Revision, revision int64) error {
	var known []string
	for _, r := range revs {
		if r.Revision == revision {
			b, err := yaml.Marshal(r.Template)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "# deployment.apps/%s revision %d, spec hash %s\n%s", name, r.Revision, r.SpecHash, b)
			return nil
		}
		known = append(known, strconv.FormatInt(r.Revision, 10))
	}
	have := "none recorded"
	if len(known) > 0 {
		have = "recorded: " + strings.Join(known, ", ")
	}
	return fmt.Errorf("revision %d of deployment %q not found (%s)", revision, name, have)
}

func newRolloutStatusCmd(g *globals) *cobra.Command {
	var (
		timeout time.Duration
		watch   bool
	)
	cmd := &cobra.Command{
		Use:   "status deployment/NAME [--timeout D] [-w=false]",
		Short: "Follow a Deployment's rollout until it completes",
		Long: `Follow a Deployment's rollout, as the answering node sees the cluster (the
replica status records of live nodes), until every ordinal runs a ready
replica of the current template and no other replica is left; then exit 0.
Exit 1 when the counts have not changed for spec.progressDeadlineSeconds
(default 600; not counted while the Deployment is paused), or after
--timeout. On a terminal a progress line is redrawn in place; otherwise a
kubectl-style line is printed whenever the state changes. With -w=false
print the state once and exit 0.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := deploymentArg("status", args)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			get := func(ctx context.Context) (api.RolloutStatus, error) {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				var st api.RolloutStatus
				st, err := c.RolloutStatus(ctx, g.namespace, name)
				return st, err
			}
			if !watch {
				st, err := get(cmd.Context())
				if err != nil {
					return err
				}
				fmt.Fprintln(g.stdout, statusMessage(st))
				return nil
			}
			out := statusPrinter{w: g.stdout}
			if f, ok := g.stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				out.width = 80
				if wd, _, err := term.GetSize(int(f.Fd())); err == nil && wd > 20 {
					out.width = wd
				}
			}
			return followRollout(cmd.Context(), get, &out, timeout, statusPollInterval, time.Now)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long (e.g. 5m); 0 waits as long as the rollout progresses")
	cmd.Flags().BoolVarP(&watch, "watch", "w", true, "keep following until the rollout completes")
	return cmd
}

// statusMessage is kubectl's line for a rollout's state.
func statusMessage(st api.RolloutStatus) string {
	wait := fmt.Sprintf("Waiting for deployment %q rollout to finish: ", st.Name)
	var msg string
	switch {
	case st.Done:
		return fmt.Sprintf("deployment %q successfully rolled out", st.Name)
	case st.Updated < st.Replicas:
		msg = wait + fmt.Sprintf("%d out of %d new replicas have been updated...", st.Updated, st.Replicas)
	case st.Old > 0:
		msg = wait + fmt.Sprintf("%d old replicas are pending termination...", st.Old)
	default:
		msg = wait + fmt.Sprintf("%d of %d updated replicas are available...", st.Ready, st.Updated)
	}
	if st.Paused {
		msg += fmt.Sprintf(" (paused: 'starling rollout resume deployment/%s' continues it)", st.Name)
	}
	return msg
}

// progress tracks whether a rollout moves: it stalls when neither the
// Deployment's generation nor its counts change for its progress
// deadline. A paused Deployment never stalls (as in Kubernetes).
type progress struct {
	last    api.RolloutStatus
	changed time.Time
	started bool
}

// observe records st at now and reports how long the rollout has not
// moved and whether that exceeds its deadline.
func (p *progress) observe(st api.RolloutStatus, now time.Time) (still time.Duration, stalled bool) {
	moved := !p.started || st.Generation != p.last.Generation || st.SpecHash != p.last.SpecHash || st.RolloutCounts != p.last.RolloutCounts
	if moved || st.Paused {
		p.changed, p.started = now, true
	}
	p.last = st
	still = now.Sub(p.changed)
	return still, st.ProgressDeadlineSeconds > 0 && still > time.Duration(st.ProgressDeadlineSeconds)*time.Second
}

// statusPrinter shows rollout states: width > 0 redraws one progress line
// of at most width columns (a terminal); otherwise it prints statusMessage
// lines when they change.
type statusPrinter struct {
	w        io.Writer
	width    int
	lastLine string
	drawn    bool
}

func (p *statusPrinter) show(st api.RolloutStatus, elapsed time.Duration) {
	if p.width == 0 {
		if line := statusMessage(st); line != p.lastLine {
			fmt.Fprintln(p.w, line)
			p.lastLine = line
		}
		return
	}
	fmt.Fprint(p.w, "\r\x1b[K"+progressLine(st, elapsed, p.width))
	p.drawn = true
}

// finish ends the progress line, if one is drawn, and prints line.
func (p *statusPrinter) finish(line string) {
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
	if line != "" && line != p.lastLine {
		fmt.Fprintln(p.w, line)
	}
}

// progressLine renders one terminal line for st, at most width columns:
//
//	web rev 3 [########------------] 2/6 ready, 3/6 updated, 5/6 available, 1 old, 12s
func progressLine(st api.RolloutStatus, elapsed time.Duration, width int) string {
	head := fmt.Sprintf("%s rev %d ", st.Name, st.Revision)
	tail := fmt.Sprintf(" %d/%d ready, %d/%d updated, %d/%d available, %d old, %s",
		st.Ready, st.Replicas, st.Updated, st.Replicas, st.Available, st.Replicas, st.Old, elapsed.Round(time.Second))
	if st.Paused {
		tail += ", paused"
	}
	bar := min(30, width-1-len(head)-len(tail)-2)
	line := head
	if bar >= 5 {
		filled := bar
		if st.Replicas > 0 {
			filled = bar * st.Ready / st.Replicas
		}
		if !st.Done && filled == bar {
			filled = bar - 1 // complete only when done (old copies may remain)
		}
		line += "[" + strings.Repeat("#", filled) + strings.Repeat("-", bar-filled) + "]"
	}
	line += tail
	if len(line) > width-1 {
		line = line[:width-1]
	}
	return line
}

// followRollout polls get every interval until the rollout is done (nil),
// stalls past its progress deadline, timeout (when > 0) passes, or get
// fails (errors).
func followRollout(ctx context.Context, get func(context.Context) (api.RolloutStatus, error), out *statusPrinter,
	timeout, interval time.Duration, now func() time.Time) error {
	start := now()
	var p progress
	for {
		st, err := get(ctx)
		if err != nil {
			out.finish("")
			return err
		}
		t := now()
		out.show(st, t.Sub(start))
		if st.Done {
			out.finish(statusMessage(st))
			return nil
		}
		if still, stalled := p.observe(st, t); stalled {
			out.finish("")
			return fmt.Errorf("deployment %q exceeded its progress deadline: nothing changed for %s (%s); see 'starling describe deployment %s'",
				st.Name, still.Round(time.Second), strings.TrimPrefix(statusMessage(st), fmt.Sprintf("Waiting for deployment %q rollout to finish: ", st.Name)), st.Name)
		}
		if timeout > 0 && t.Sub(start) >= timeout {
			out.finish("")
			return fmt.Errorf("timed out after %s waiting for deployment %q rollout to finish: %s", timeout, st.Name,
				strings.TrimPrefix(statusMessage(st), fmt.Sprintf("Waiting for deployment %q rollout to finish: ", st.Name)))
		}
		select {
		case <-ctx.Done():
			out.finish("")
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
