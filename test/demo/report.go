package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// check is one step of the demo and its outcome, for the summary.
type check struct {
	name string
	took time.Duration
	err  error
}

// report prints the demo's narrative and keeps the checks.
type report struct {
	out    io.Writer
	checks []check
	start  time.Time
	// seed is the node the narrative's plain `starling` commands talk to.
	seed   *harness.Node
	binary string
}

const indent = "    "

// step prints a numbered heading, runs f (which narrates with say and
// run), then prints PASS or FAIL with the time f took, and records it.
func (r *report) step(name string, f func() error) bool {
	fmt.Fprintf(r.out, "\n[%d] %s\n", len(r.checks)+1, name)
	start := time.Now()
	err := f()
	c := check{name: name, took: time.Since(start), err: err}
	r.checks = append(r.checks, c)
	if err != nil {
		fmt.Fprintf(r.out, "%sFAIL (%s): %s\n", indent, round(c.took), strings.ReplaceAll(err.Error(), "\n", "\n"+indent+"  "))
		return false
	}
	fmt.Fprintf(r.out, "%sPASS (%s)\n", indent, round(c.took))
	return true
}

// say prints a narrative line (or lines) under the current step.
func (r *report) say(format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	for _, line := range strings.Split(text, "\n") {
		fmt.Fprintln(r.out, strings.TrimRight(indent+line, " "))
	}
}

// prompt renders a CLI call the way a user would type it: plain
// `starling` talks to the seed node, other nodes are named by socket.
func (r *report) prompt(n *harness.Node, args ...string) string {
	p := "$ starling "
	if n != r.seed {
		p += "--server " + n.Socket + " "
	}
	return p + strings.Join(args, " ")
}

// run shows and runs a starling command against node n, printing its
// output indented, and returns the output.
func (r *report) run(n *harness.Node, args ...string) (string, error) {
	return r.runInput(n, nil, "", args...)
}

// runInput is run with stdin; shown, when not "", is typed before the
// command (e.g. "sed ... |").
func (r *report) runInput(n *harness.Node, stdin io.Reader, shown string, args ...string) (string, error) {
	p := r.prompt(n, args...)
	if shown != "" {
		p = "$ " + shown + " | " + strings.TrimPrefix(p, "$ ")
	}
	fmt.Fprintln(r.out, indent+p)
	out, err := n.CLIInput(stdin, args...)
	if s := strings.TrimRight(out, "\n"); s != "" {
		r.say("%s", s)
	}
	return out, err
}

// stream shows and runs a starling command against node n, printing its
// output line by line as it comes (for `rollout status`).
func (r *report) stream(ctx context.Context, n *harness.Node, args ...string) (string, error) {
	fmt.Fprintln(r.out, indent+r.prompt(n, args...))
	cmd := exec.CommandContext(ctx, r.binary, append([]string{"--server", n.Socket}, args...)...)
	var all, stderr bytes.Buffer
	cmd.Stdout = io.MultiWriter(&all, &lineIndenter{w: r.out})
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return all.String(), fmt.Errorf("starling %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return all.String(), nil
}

// lineIndenter writes complete lines to w, indented.
type lineIndenter struct {
	w   io.Writer
	buf []byte
}

func (l *lineIndenter) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		fmt.Fprintf(l.w, "%s%s\n", indent, l.buf[:i])
		l.buf = l.buf[i+1:]
	}
}

// summary prints every check with its outcome and time; true when all
// passed.
func (r *report) summary() bool {
	fmt.Fprintln(r.out, "\n==== Summary ====")
	pass := 0
	for i, c := range r.checks {
		mark := "PASS"
		if c.err != nil {
			mark = "FAIL"
		} else {
			pass++
		}
		fmt.Fprintf(r.out, "%s  %2d  %-72s %8s\n", mark, i+1, c.name, round(c.took))
	}
	fmt.Fprintf(r.out, "%d passed, %d failed, total %s\n", pass, len(r.checks)-pass, round(time.Since(r.start)))
	return pass == len(r.checks)
}

func round(d time.Duration) string {
	if d < 10*time.Second {
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// poll calls f every 100 ms until it returns nil or timeout passes, and
// returns the last error.
func poll(timeout time.Duration, f func() error) error {
	_, err := harness.Poll(context.Background(), 100*time.Millisecond, timeout, f)
	return err
}

// writeDiagnostics saves each node's agent log tail, routes and rules to
// path (outside the demo directory, which the clean-up removes).
func writeDiagnostics(path string, c *harness.Cluster) error {
	var b strings.Builder
	for _, n := range c.Nodes {
		b.WriteString(n.Diagnostics())
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}
