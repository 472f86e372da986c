package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
)

// ErrNotRunning: the container has no running task to exec in.
var ErrNotRunning = errors.New("container is not running")

// execOutputMax bounds the output Exec returns (kubelet keeps 10 KiB;
// ours goes into a one-line reason).
const execOutputMax = 1024

// Exec runs argv in container id's running task, as runc exec with the
// container's own process settings (user, environment, working
// directory, capabilities), the way CRI execs probes, and returns its exit
// status and the first 1 KiB of its stdout and stderr. timeout bounds the
// command from its start, as CRI's ExecSync does: past it the process is
// killed (SIGKILL) and the error wraps context.DeadlineExceeded. ctx
// bounds the containerd calls. The exec process is deleted in every case.
// ErrNotRunning (wrapped) when the container or its task is gone or not
// running; any other error means the command could not be started (e.g.
// executable not found).
func (r *Runtime) Exec(ctx context.Context, id string, argv []string, timeout time.Duration) (exitCode int, output string, err error) {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return -1, "", fmt.Errorf("exec in %s: %w", id, ErrNotRunning)
	} else if err != nil {
		return -1, "", fmt.Errorf("exec in %s: %w", id, err)
	}
	spec, err := c.Spec(ctx)
	if err != nil {
		return -1, "", fmt.Errorf("exec in %s: read spec: %w", id, err)
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return -1, "", fmt.Errorf("exec in %s: %w", id, ErrNotRunning)
	} else if err != nil {
		return -1, "", fmt.Errorf("exec in %s: load task: %w", id, err)
	}
	if st, err := task.Status(ctx); err != nil || st.Status != containerd.Running {
		return -1, "", fmt.Errorf("exec in %s: %w", id, ErrNotRunning)
	}
	pspec := *spec.Process
	pspec.Args = argv
	pspec.Terminal = false
	// The shim writes the output straight to a file: no FIFOs for the
	// client to drain, so a command whose children keep its output open
	// cannot hang the prober.
	execID := fmt.Sprintf("probe-%d-%d", time.Now().UnixNano(), r.execSeq.Add(1))
	outPath := filepath.Join(r.cfg.LogDir, "exec", id+"-"+execID+".out")
	if err := os.MkdirAll(filepath.Dir(outPath), 0o700); err != nil {
		return -1, "", fmt.Errorf("exec in %s: %w", id, err)
	}
	defer os.Remove(outPath)
	// Clean-up must happen even when ctx has ended.
	cleanupCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	}
	proc, err := task.Exec(ctx, execID, &pspec, cio.LogFile(outPath))
	if err != nil {
		return -1, "", fmt.Errorf("exec in %s: %w", id, err)
	}
	defer func() {
		dctx, cancel := cleanupCtx()
		defer cancel()
		if _, derr := proc.Delete(dctx, containerd.WithProcessKill); derr != nil && !errdefs.IsNotFound(derr) {
			r.log.Warn("delete exec process", "container", id, "exec", execID, "err", derr)
		}
	}()
	// Wait before Start so the exit cannot be missed; on a context of its
	// own so that ctx ending does not lose the killed process's exit.
	wctx, wcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer wcancel()
	exited, err := proc.Wait(wctx)
	if err != nil {
		return -1, "", fmt.Errorf("exec in %s: wait: %w", id, err)
	}
	if err := proc.Start(ctx); err != nil {
		if errdefs.IsNotFound(err) {
			return -1, "", fmt.Errorf("exec in %s: %w", id, ErrNotRunning)
		}
		return -1, "", fmt.Errorf("exec in %s: %w", id, err)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var cause error
	select {
	case st := <-exited:
		code, _, err := st.Result()
		if err != nil {
			return -1, "", fmt.Errorf("exec in %s: %w", id, err)
		}
		// The shim copies the output to the file on its own and may
		// still be copying when the exit arrives (a probe's reason then
		// lost the command's message, now and then); deleting the
		// process waits for that copy to end.
		dctx, cancel := cleanupCtx()
		_, derr := proc.Delete(dctx)
		cancel()
		if derr != nil && !errdefs.IsNotFound(derr) {
			r.log.Warn("delete exec process", "container", id, "exec", execID, "err", derr)
		}
		return int(code), readHead(outPath, execOutputMax), nil
	case <-timer.C:
		cause = fmt.Errorf("exec in %s: command ran longer than %v: %w", id, timeout, context.DeadlineExceeded)
	case <-ctx.Done():
		cause = fmt.Errorf("exec in %s: %w", id, ctx.Err())
	}
	kctx, cancel := cleanupCtx()
	defer cancel()
	if err := proc.Kill(kctx, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
		r.log.Warn("kill timed-out exec process", "container", id, "exec", execID, "err", err)
	}
	select {
	case <-exited:
	case <-kctx.Done():
	}
	return -1, readHead(outPath, execOutputMax), cause
}

// readHead returns up to n bytes from the start of file path.
func readHead(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}
