package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

// TestEveryExitExplained: a run that exits 0, one that exits 3 and one
// the OOM killer ends (a 48 MiB limit, 256 MiB touched) each show how
// they ended, as kubectl shows a pod's container: lastState.terminated
// with reason Completed, Error or OOMKilled and the exit code in
// `get replicas -o json`, STATUS CrashLoopBackOff and "RESTARTS n (…
// ago)" in `get replicas`, Last State in `describe`. An image whose User
// is not in its /etc/passwd says so, naming the user, with no host path.
func TestEveryExitExplained(t *testing.T) {
	n1 := echoNode(t)
	exiting := func(name, image, memory string, command ...string) string {
		return harness.App{Name: name, Namespace: "exits", Replicas: 1, Image: image, Command: command,
			Limits: harness.Limits("memory", memory)}.Deployment()
	}
	apply(t, n1, exiting("done", "", "64Mi", "/echo", "check"))
	apply(t, n1, exiting("three", "", "64Mi", "/echo", "check", "-exit", "3"))
	apply(t, n1, exiting("oom", "", "48Mi", "/echo", "check", "-alloc", "256", "-sleep", "1s"))
	// An image whose User its /etc/passwd does not have.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mod, err := harness.ModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	ghostTar := filepath.Join(t.TempDir(), "ghost.tar")
	if err := imagebuild.EchoWith(ctx, mod, imagebuild.Spec{Ref: "starling.local/echo:ghost", User: "ghost"}, ghostTar); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.CLI("image", "import", ghostTar); err != nil {
		t.Fatal(err)
	}
	apply(t, n1, exiting("ghost", "starling.local/echo:ghost", "64Mi", "/echo"))
	waitFor(t, 60*time.Second, func() error {
		items, err := apiReplicas(n1)
		if err != nil {
			return err
		}
		for _, r := range items {
			if r.Workload == "ghost" && strings.HasSuffix(r.Reason, "unable to find user ghost: no matching entries in passwd file") && !strings.Contains(r.Reason, "/tmp/") {
				return nil
			}
		}
		return fmt.Errorf("no replica of ghost says which user is missing: %+v", items)
	})
	want := map[string]struct {
		reason string
		code   int
	}{"done": {"Completed", 0}, "three": {"Error", 3}, "oom": {"OOMKilled", 137}}
	type item struct {
		Workload  string
		Restarts  int
		LastState *struct {
			Terminated *struct {
				ExitCode int32
				Reason   string
			}
		}
	}
	waitFor(t, 60*time.Second, func() error {
		out, err := n1.CLI("get", "replicas", "-n", "exits", "-o", "json")
		if err != nil {
			return err
		}
		var l struct{ Items []item }
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			return err
		}
		got := map[string]string{}
		for _, i := range l.Items {
			if i.LastState != nil && i.LastState.Terminated != nil {
				got[i.Workload] = fmt.Sprintf("%s %d", i.LastState.Terminated.Reason, i.LastState.Terminated.ExitCode)
			}
		}
		for w, x := range want {
			if got[w] != fmt.Sprintf("%s %d", x.reason, x.code) {
				return fmt.Errorf("last states %v, want %v", got, want)
			}
		}
		return nil
	})
	var table string
	waitFor(t, 30*time.Second, func() (err error) {
		table, err = n1.CLI("get", "replicas", "-n", "exits")
		if err != nil {
			return err
		}
		if n := len(regexp.MustCompile(`CrashLoopBackOff\s+\d+ \(\S+ ago\)`).FindAllString(table, -1)); n != 3 {
			return fmt.Errorf("%d of 3 rows say CrashLoopBackOff with RESTARTS n (… ago):\n%s", n, table)
		}
		return nil
	})
	t.Logf("get replicas:\n%s", table)
	desc, err := n1.CLI("describe", "deployment", "oom", "-n", "exits")
	if err != nil || !strings.Contains(desc, "Last State:") || !strings.Contains(desc, "Reason: OOMKilled, Exit Code: 137") {
		t.Fatalf("describe deployment oom: %v\n%s", err, desc)
	}
}

// TestLogsKeepTheEnd: 'logs -f' delivers every line up to the end of the
// run (the server's last line, written on its stop signal, arrives and
// the command returns); 'logs --previous' shows a restarted replica's
// previous run; '--tail N' the last N lines.
func TestLogsKeepTheEnd(t *testing.T) {
	n1 := echoNode(t)
	workload := func(name string, command ...string) string {
		return harness.App{Name: name, Namespace: "logs", Replicas: 1, Grace: harness.Seconds(5), Command: command}.Deployment()
	}
	apply(t, n1, workload("crash", "/echo", "check", "-exit", "3"))
	apply(t, n1, workload("srv", "/echo"))
	names := map[string]string{}
	waitFor(t, 60*time.Second, func() error {
		items, err := apiReplicas(n1)
		if err != nil {
			return err
		}
		for _, r := range items {
			if r.Workload == "crash" && r.Restarts >= 1 || r.Workload == "srv" && r.Phase == api.PhaseRunning {
				names[r.Workload] = r.Name
			}
		}
		if len(names) != 2 {
			return fmt.Errorf("want crash restarted and srv running: %+v", items)
		}
		return nil
	})
	prev, err := n1.CLI("logs", "-n", "logs", "--previous", names["crash"])
	if err != nil || !strings.Contains(prev, "exiting with 3") {
		t.Fatalf("logs --previous %s: %q %v", names["crash"], prev, err)
	}
	waitFor(t, 10*time.Second, func() error {
		out, err := n1.CLI("logs", "-n", "logs", "--tail", "1", names["srv"])
		if err != nil || strings.Count(out, "\n") != 1 || !strings.Contains(out, "echo listening") {
			return fmt.Errorf("logs --tail 1 %s: %q %v", names["srv"], out, err)
		}
		return nil
	})
	followed := make(chan string, 1)
	go func() {
		out, err := n1.CLI("logs", "-n", "logs", "-f", names["srv"])
		if err != nil {
			out += err.Error()
		}
		followed <- out
	}()
	time.Sleep(2 * time.Second) // following
	if _, err := n1.CLI("delete", "deployment", "srv", "-n", "logs"); err != nil {
		t.Fatal(err)
	}
	select {
	case out := <-followed:
		if !strings.Contains(out, "echo listening") || !strings.Contains(out, "got signal terminated") {
			t.Fatalf("logs -f of a replica that was deleted lacks its last line:\n%s", out)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("logs -f did not end when the replica stopped")
	}
}

// TestLogsRotateAndCarryTimes: a chatty container's log is rotated by
// size (--container-log-max-size, --container-log-max-files) so it cannot
// fill the disk, and `logs` still reads across the rotated files with
// --tail, --timestamps, --since and --since-time; stderr is in it.
func TestLogsRotateAndCarryTimes(t *testing.T) {
	n1 := echoNode(t, "--container-log-max-size", "16KiB", "--container-log-max-files", "3")
	// 2000 lines of 100 bytes: about 330 KB in the CRI format, 20 times
	// what 3 files of 16 KiB keep.
	apply(t, n1, harness.App{Name: "chatty", Namespace: "rotate", Replicas: 1, Grace: harness.Seconds(1),
		Command: []string{"/echo", "chatter", "2000", "100"}}.Deployment())
	var name string
	waitFor(t, 60*time.Second, func() error {
		items, err := apiReplicas(n1)
		if err != nil {
			return err
		}
		for _, r := range items {
			if r.Workload == "chatty" && r.Phase == api.PhaseRunning {
				name = r.Name
			}
		}
		if name == "" {
			return fmt.Errorf("chatty not running: %+v", items)
		}
		out, err := n1.CLI("logs", "-n", "rotate", "--tail", "2", name)
		if err != nil || out != "line 001999 "+strings.Repeat("x", 88)+"\nwrote 2000 lines\n" {
			return fmt.Errorf("logs --tail 2: %.80q %v", out, err)
		}
		return nil
	})
	files, _ := filepath.Glob(filepath.Join(n1.DataDir, "logs", "rotate_"+name+".log*"))
	var total int64
	for _, f := range files {
		if st, err := os.Stat(f); err == nil {
			total += st.Size()
		}
	}
	if len(files) != 3 || total > 3*16<<10 {
		t.Fatalf("log files %v hold %d bytes: want 3 files of at most 16 KiB", files, total)
	}
	out, err := n1.CLI("logs", "-n", "rotate", name)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) < 200 || lines[len(lines)-1] != "wrote 2000 lines" || !strings.HasPrefix(lines[len(lines)-200], "line 0018") {
		t.Fatalf("logs: %d lines, last %.20q (want the newest lines across the rotated files, stderr's last)", len(lines), lines[len(lines)-1])
	}
	stamped, err := n1.CLI("logs", "-n", "rotate", "--timestamps", "--tail", "1", name)
	ts, rest, _ := strings.Cut(stamped, " ")
	when, perr := time.Parse(time.RFC3339Nano, ts)
	if err != nil || perr != nil || time.Since(when) > 5*time.Minute || rest != "wrote 2000 lines\n" {
		t.Fatalf("logs --timestamps --tail 1: %.60q %v %v", stamped, err, perr)
	}
	if out, err := n1.CLI("logs", "-n", "rotate", "--since", "1h", "--tail", "1", name); err != nil || out != "wrote 2000 lines\n" {
		t.Fatalf("logs --since 1h: %.40q %v", out, err)
	}
	if out, err := n1.CLI("logs", "-n", "rotate", "--since-time", when.Add(time.Second).Format(time.RFC3339), name); err != nil || out != "" {
		t.Fatalf("logs --since-time after the last line: %.40q %v", out, err)
	}
	t.Logf("2000 lines of 100 bytes: %d files, %d bytes kept", len(files), total)
}
