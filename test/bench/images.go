package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

// imageBench measures how fast an image travels from the node that
// imported it to a node that needs it, against a plain copy of the same
// bytes over the same link. The image is the echo server plus imageFillMiB
// of random (incompressible) data in its one layer. n1 imports it; for each
// run a new node n<k> joins and a Deployment pinned to it (nodeSelector)
// makes it pull the image from n1 blob by blob over mutual TLS, store it
// in its containerd (every blob checked) and unpack it (each layer once
// stored). The phases are read from n<k>'s log: "fetching image from
// peer" to "image fetched from a peer" is the pull, unpacked; from there
// to the replica running is the start. The plain copy sends the tarball file from n1's namespace to
// a receiver in n2's over TCP on the same bridge, once to /dev/null and
// once into a file on the data dir's disk, fsynced (what storing costs at
// the least).
func imageBench(a artifacts, runs int) error {
	ctx := context.Background()
	mod, err := harness.ModuleDir()
	if err != nil {
		return err
	}
	tar, size, err := bigImage(ctx, mod, a.dir)
	if err != nil {
		return fmt.Errorf("build the big image: %w", err)
	}
	c, n1, err := firstNode(a, "images", "stbi", "n1")
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := n1.CLI("image", "import", tar); err != nil {
		return err
	}
	fmt.Printf("\n== image: a %.0f MB image from the node that imported it to one that needs it (median of %d) ==\n", float64(size)/1e6, runs)
	var fetch, unpack, plainNull, plainDisk []time.Duration
	for k := 2; k < 2+runs; k++ {
		n, err := c.AddNode(fmt.Sprintf("n%d", k), k)
		if err != nil {
			return err
		}
		if err := n.StartAgent("--node-label", fmt.Sprintf("bench=n%d", k)); err != nil {
			return err
		}
		d, err := plainCopy(ctx, n1, n, tar, "")
		if err != nil {
			return fmt.Errorf("plain copy: %w", err)
		}
		plainNull = append(plainNull, d)
		if d, err = plainCopy(ctx, n1, n, tar, filepath.Join(n.Dir, "copy.tar")); err != nil {
			return fmt.Errorf("plain copy to disk: %w", err)
		}
		plainDisk = append(plainDisk, d)
		os.Remove(filepath.Join(n.Dir, "copy.tar"))
		f, u, err := peerFetch(n, k)
		if err != nil {
			return fmt.Errorf("n%d: %w", k, err)
		}
		fetch, unpack = append(fetch, f), append(unpack, u)
		n.KillAgent(syscall.SIGTERM)
	}
	rate := func(d time.Duration) string {
		return fmt.Sprintf("%8.1f MB/s  %8s", float64(size)/1e6/d.Seconds(), d.Round(time.Millisecond))
	}
	fmt.Printf("%-46s %s\n", "plain TCP copy, to /dev/null", rate(median(plainNull)))
	fmt.Printf("%-46s %s\n", "plain TCP copy, to a file on disk (fsync)", rate(median(plainDisk)))
	fmt.Printf("%-46s %s\n", "peer pull: mTLS, stored, verified, unpacked", rate(median(fetch)))
	fmt.Printf("%-46s %s\n", "then the replica started", rate(median(unpack)))
	fmt.Printf("%-46s %s\n", "peer pull + start", rate(median(add(fetch, unpack))))
	return nil
}

func add(a, b []time.Duration) []time.Duration {
	out := make([]time.Duration, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

// imageFillMiB is the random data in the big image's layer.
const imageFillMiB = 100

// bigImage writes the echo server with imageFillMiB of random data as
// starling.local/big:v1 into dir and returns the tarball and its size.
func bigImage(ctx context.Context, mod, dir string) (string, int64, error) {
	bin := filepath.Join(dir, "echo.bin")
	if err := imagebuild.BuildGo(ctx, mod, "./test/images/echo", bin); err != nil {
		return "", 0, err
	}
	fill := make([]byte, imageFillMiB<<20)
	rand.Read(fill)
	out := filepath.Join(dir, "big.tar")
	err := imagebuild.Write(out, imagebuild.Spec{Ref: "starling.local/big:v1", Entrypoint: []string{"/echo"},
		Files: []imagebuild.File{{Path: "/echo", Mode: 0o755, Source: bin}, {Path: "/fill", Data: fill}, {Path: "/tmp/.keep"}}})
	if err != nil {
		return "", 0, err
	}
	st, err := os.Stat(out)
	if err != nil {
		return "", 0, err
	}
	return out, st.Size(), nil
}

// plainCopy sends file from from's namespace to a receiver in to's over
// TCP (this binary in -copy-recv / -copy-send mode) and returns the
// receiver's time from the first byte to the last one written (and
// fsynced, when out is a file).
func plainCopy(ctx context.Context, from, to *harness.Node, file, out string) (time.Duration, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	if out == "" {
		out = "/dev/null"
	}
	recv := exec.CommandContext(ctx, "ip", "netns", "exec", to.NetNS, self, "-copy-recv", to.IP+":9999", "-copy-out", out)
	stdout, err := recv.StdoutPipe()
	if err != nil {
		return 0, err
	}
	recv.Stderr = os.Stderr
	if err := recv.Start(); err != nil {
		return 0, err
	}
	defer recv.Wait()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "listening" {
		return 0, fmt.Errorf("receiver did not start")
	}
	if b, err := exec.CommandContext(ctx, "ip", "netns", "exec", from.NetNS, self, "-copy-send", to.IP+":9999", "-copy-in", file).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("send: %v: %s", err, b)
	}
	if !lines.Scan() {
		return 0, fmt.Errorf("receiver said nothing")
	}
	return time.ParseDuration(lines.Text())
}

// copyRecv accepts one connection on addr, copies it to out (fsynced when
// a regular file) and prints the time from its first byte to the end.
func copyRecv(addr, out string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println("listening")
	conn, err := l.Accept()
	if err != nil {
		return err
	}
	defer conn.Close()
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	first := make([]byte, 1)
	if _, err := io.ReadFull(conn, first); err != nil {
		return err
	}
	start := time.Now()
	f.Write(first)
	if _, err := io.Copy(f, conn); err != nil {
		return err
	}
	if out != "/dev/null" {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Println(time.Since(start))
	return nil
}

// copySend sends file to addr.
func copySend(addr, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	if _, err := io.Copy(conn, f); err != nil {
		return err
	}
	return conn.Close()
}

var logTime = regexp.MustCompile(`^time=(\S+) `)

// peerFetch applies a Deployment of the big image pinned to node n (label
// bench=n<k>), waits for its replica to run, and returns from n's log the
// time from "fetching image from peer" to "image fetched from a peer",
// and from then to the replica running.
func peerFetch(n *harness.Node, k int) (fetch, rest time.Duration, err error) {
	name := fmt.Sprintf("big%d", k)
	m := harness.App{Name: name, Replicas: 1, Image: "starling.local/big:v1", Grace: harness.Seconds(2),
		Pod: func(p *corev1.PodSpec) { p.NodeSelector = map[string]string{"bench": fmt.Sprintf("n%d", k)} }}.Deployment()
	if _, err := n.CLIInput(strings.NewReader(m), "apply", "-f", "-"); err != nil {
		return 0, 0, err
	}
	if err := waitFor(3*time.Minute, func() (bool, error) {
		r, _, err := running(n, name)
		return r == 1, err
	}); err != nil {
		return 0, 0, err
	}
	runningAt := time.Now()
	log, err := os.ReadFile(n.AgentLogPath())
	if err != nil {
		return 0, 0, err
	}
	var began, fetched time.Time
	for _, line := range strings.Split(string(log), "\n") {
		mt := logTime.FindStringSubmatch(line)
		if mt == nil {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, mt[1])
		if err != nil {
			continue
		}
		switch {
		case strings.Contains(line, `msg="fetching image from peer"`) && strings.Contains(line, "big:v1"):
			began = t
		case strings.Contains(line, `msg="image fetched from a peer"`) && strings.Contains(line, "big:v1"):
			fetched = t
		}
	}
	if began.IsZero() || fetched.IsZero() {
		return 0, 0, fmt.Errorf("no fetch from a peer in the log of %s", n.Name)
	}
	if _, err := n.CLI("delete", "deployment", name); err != nil {
		return 0, 0, err
	}
	// The replica is seen Running within a poll (20 ms) of its start.
	return fetched.Sub(began), runningAt.Sub(fetched), nil
}
