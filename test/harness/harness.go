// Package harness runs Starling nodes on one machine for the end-to-end
// tests, the demo and the benchmarks. Each node is a network namespace
// with its own containerd (own root, state and socket under the node's
// directory) and its own agent, joined by a veth to a LAN bridge that
// lives in a namespace of its own. Nothing touches the root network
// namespace's routes, iptables or sysctls.
//
// Processes run in their namespaces through nsenter(1) --net only (not
// `ip netns exec`), so they share the root mount namespace: the pinned
// pod namespaces the agent creates are visible to containerd and runc.
//
// Close removes everything: processes (agents, containerds, shims,
// containers), mounts, cgroups, namespaces and directories.
package harness

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/starling-orchestrator/starling/node/client"
)

// Cluster is a set of node namespaces on one LAN namespace.
type Cluster struct {
	// Dir holds every node's data; removed by Close.
	Dir string
	// Prefix makes namespace names unique to this cluster ("st<pid>-").
	Prefix string
	// Binary is the starling binary the agents and CLI calls run.
	Binary string
	// LAN is the name of the LAN namespace (bridge br0, 192.168.222.254/24).
	LAN   string
	Nodes []*Node
	// Token is the API bearer token every agent accepts (TokenFile holds
	// it).
	Token     string
	TokenFile string
	// Log receives progress lines (nil: discarded).
	Log io.Writer
	// ProxyMode is given to every agent as --proxy-mode ("": the agent
	// chooses).
	ProxyMode string

	mu     sync.Mutex
	closed bool
}

// LANPrefix is the LAN subnet; node i (1-based) is LANPrefix+".<10+i>".
const LANPrefix = "192.168.222"

// Node is one Starling node of a Cluster.
type Node struct {
	Name      string
	NetNS     string // network namespace name (under /run/netns)
	Dir       string // data dir: containerd/, starling/ ...
	DataDir   string // the agent's --data-dir
	IP        string // LAN address
	PodSubnet string
	Socket    string // the agent's API socket

	c              *Cluster
	containerd     *exec.Cmd
	containerdDone chan struct{}
	agent          *exec.Cmd
	agentLog       *os.File
	agentArgs      []string
	agentDone      chan struct{}
}

// New creates the LAN namespace and returns an empty cluster. dir must
// exist; binary is the starling binary to run. Every cluster of a
// process gets a namespace and cgroup prefix of its own ("st<pid>c<n>-",
// none a prefix of another), so clusters of parallel tests never meet.
func New(dir, binary string, log io.Writer) (*Cluster, error) {
	return NewNamed(dir, fmt.Sprintf("st%dc%d-", os.Getpid(), clusters.Add(1)), binary, log)
}

// clusters counts the clusters New made in this process.
var clusters atomic.Int64

// NewNamed is New with a chosen namespace prefix (the demo uses a fixed
// one so `make demo-down` can find what a previous run left).
func NewNamed(dir, prefix, binary string, log io.Writer) (*Cluster, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, Binary: binary, Prefix: prefix, Log: log,
		Token: "starling-test-token-0123456789", TokenFile: filepath.Join(dir, "token")}
	if err := os.WriteFile(c.TokenFile, []byte(c.Token+"\n"), 0o600); err != nil {
		return nil, err
	}
	c.LAN = c.Prefix + "lan"
	if err := run("ip", "netns", "add", c.LAN); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		// A bridge takes the lowest MAC of its ports unless given one:
		// moving a node's port to br1 (Partition) could change br0's,
		// and a LAN client (an ARP probe bound to br0) would stop
		// hearing the answers sent to its old address.
		{"link", "add", "br0", "address", "02:5a:00:00:00:fe", "type", "bridge"},
		{"addr", "add", LANPrefix + ".254/24", "dev", "br0"},
		{"link", "set", "br0", "up"},
		{"link", "set", "lo", "up"},
	} {
		if err := run("ip", append([]string{"-n", c.LAN}, args...)...); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, format+"\n", args...)
	}
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// AddNode creates node namespace i (1-based) wired to the LAN and starts
// its containerd. The agent is started with StartAgent, with --pod-subnet
// PodSubnet (10.22.<i>.0/24); set PodSubnet to "" first to let the node
// claim one itself.
func (c *Cluster) AddNode(name string, i int) (*Node, error) {
	n, err := c.AddHost(name, i)
	if err != nil {
		return nil, err
	}
	return n, n.startContainerd()
}

// AddHost creates host namespace i (1-based) wired to the LAN, with no
// containerd: a machine that runs something other than an agent (a
// hostile program), removed with the cluster.
func (c *Cluster) AddHost(name string, i int) (*Node, error) {
	n := &Node{
		Name: name, NetNS: c.Prefix + name, Dir: filepath.Join(c.Dir, name),
		IP: fmt.Sprintf("%s.%d", LANPrefix, 10+i), PodSubnet: fmt.Sprintf("10.22.%d.0/24", i), c: c,
	}
	n.DataDir = filepath.Join(n.Dir, "starling")
	n.Socket = filepath.Join(n.DataDir, "starling.sock")
	c.Nodes = append(c.Nodes, n)
	if err := run("ip", "netns", "add", n.NetNS); err != nil {
		return nil, err
	}
	veth := "v" + name
	for _, cmd := range [][]string{
		{"ip", "-n", c.LAN, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", n.NetNS},
		{"ip", "-n", c.LAN, "link", "set", veth, "master", "br0", "up"},
		{"ip", "-n", n.NetNS, "addr", "add", n.IP + "/24", "dev", "eth0"},
		{"ip", "-n", n.NetNS, "link", "set", "eth0", "up"},
		{"ip", "-n", n.NetNS, "link", "set", "lo", "up"},
		// Like a real host, a default route (to the LAN namespace, which
		// routes nowhere further).
		{"ip", "-n", n.NetNS, "route", "add", "default", "via", LANPrefix + ".254"},
	} {
		if err := run(cmd[0], cmd[1:]...); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(n.DataDir, 0o700); err != nil {
		return nil, err
	}
	return n, nil
}

// ContainerdSocket is the node's containerd gRPC socket.
func (n *Node) ContainerdSocket() string {
	return filepath.Join(n.Dir, "containerd", "containerd.sock")
}

func (n *Node) startContainerd() error {
	cdir := filepath.Join(n.Dir, "containerd")
	if err := os.MkdirAll(cdir, 0o700); err != nil {
		return err
	}
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(cdir, "root"), filepath.Join(cdir, "state"), n.ContainerdSocket(), n.ContainerdSocket()+".ttrpc")
	confPath := filepath.Join(cdir, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(cdir, "containerd.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+n.NetNS, "containerd", "--config", confPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start containerd for %s: %w (install the Debian package containerd)", n.Name, err)
	}
	n.containerd, n.containerdDone = cmd, make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(n.containerdDone) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(n.ContainerdSocket()); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("containerd for %s did not create %s within 20s (see %s)", n.Name, n.ContainerdSocket(), logf.Name())
}

// StopContainerd kills the node's containerd, as an outage of the
// runtime: the shims, and so the containers, keep running.
func (n *Node) StopContainerd() {
	if n.containerd != nil && n.containerd.Process != nil {
		n.containerd.Process.Kill()
		<-n.containerdDone
	}
}

// StartContainerd starts the node's containerd again (after
// StopContainerd); it finds its containers through their shims.
func (n *Node) StartContainerd() error {
	os.Remove(n.ContainerdSocket()) // left by the kill; start waits for a new one
	return n.startContainerd()
}

// AgentLogPath is where the agent's stderr goes (appended across restarts).
func (n *Node) AgentLogPath() string { return filepath.Join(n.Dir, "agent.log") }

// APIURL is the node's TCP API (TLS with the node's certificate),
// reachable from the LAN namespace.
func (n *Node) APIURL() string { return "https://" + n.IP + ":7443" }

// CAPin is the pin of the cluster's CA (the SHA-256 of its public key, hex)
// read from the first node's data dir.
func (c *Cluster) CAPin() (string, error) {
	b, err := os.ReadFile(filepath.Join(c.Nodes[0].DataDir, "ca.crt"))
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "", fmt.Errorf("ca.crt: no PEM block")
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(ca.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:]), nil
}

// APIClient is an HTTP client for the nodes' TCP APIs: it dials from the
// LAN namespace and checks the server's certificate against the cluster
// CA (any node's: tests call several).
func (c *Cluster) APIClient() (*http.Client, error) {
	pin, err := c.CAPin()
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: c.lanTransport(pin)}, nil
}

func (c *Cluster) lanTransport(pin string) *http.Transport {
	return &http.Transport{DialContext: DialIn(c.LAN), TLSClientConfig: client.PinnedTLS(pin, "")}
}

// TCPClient is an API client of node n's TCP API from the LAN namespace,
// with the cluster token, checking the server's certificate against the
// cluster CA.
func (c *Cluster) TCPClient(n *Node) (*client.Client, error) {
	pin, err := c.CAPin()
	if err != nil {
		return nil, err
	}
	return client.New(n.APIURL(), client.WithToken(c.Token), client.WithTransport(c.lanTransport(pin)), client.WithTimeout(5*time.Second))
}

// StartAgent starts the node's agent with the standard flags plus extra,
// and waits until its API answers. Standard flags: gossip on the LAN
// address, the TCP API on the LAN address with the cluster token; the
// first node creates the cluster, every other joins through it with a
// fresh join token (JoinToken).
func (n *Node) StartAgent(extra ...string) error {
	args := []string{"agent", "--name", n.Name, "--data-dir", n.DataDir,
		"--containerd-address", n.ContainerdSocket(),
		"--runc-root", filepath.Join(n.Dir, "runc"), "--cgroup-parent", "/starling/" + n.CgroupName(),
		"--bind", n.IP + ":7946", "--advertise", n.IP,
		"--api-listen", n.IP + ":7443", "--token-file", n.c.TokenFile}
	if seed := n.c.Nodes[0]; seed != n {
		args = append(args, "--join", seed.IP)
		if !slices.Contains(extra, "--insecure") {
			tokenFile, err := n.c.JoinToken(n.Name)
			if err != nil {
				return err
			}
			args = append(args, "--join-token-file", tokenFile)
		}
	}
	if n.PodSubnet != "" {
		args = append(args, "--pod-subnet", n.PodSubnet)
	}
	if n.c.ProxyMode != "" && !slices.Contains(extra, "--proxy-mode") {
		args = append(args, "--proxy-mode", n.c.ProxyMode)
	}
	args = append(args, extra...)
	n.agentArgs = args
	return n.startAgent()
}

// JoinToken makes an invitation for node name with the CA the first
// node made (it keeps the CA key in its data dir, having made the cluster
// itself), as an operator would where the CA key is kept, and returns the
// file (0600) that holds it.
func (c *Cluster) JoinToken(name string) (string, error) {
	out, err := exec.Command(c.Binary, "join-token", name, "--ca-dir", c.Nodes[0].DataDir).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("starling join-token %s: %w", name, err)
	}
	// A file per invitation: nodes may be started concurrently.
	f, err := os.CreateTemp(c.Dir, "join-*.token") // mode 0600
	if err != nil {
		return "", err
	}
	_, err = f.Write(out)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return f.Name(), err
}

// RestartAgent starts the agent again with the flags of the last StartAgent.
func (n *Node) RestartAgent() error { return n.startAgent() }

func (n *Node) startAgent() error {
	logf, err := os.OpenFile(n.AgentLogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + n.NetNS, n.c.Binary}, n.agentArgs...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	n.agent, n.agentLog = cmd, logf
	done := make(chan struct{})
	n.agentDone = done
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("agent %s exited at start:\n%s", n.Name, n.Tail(20))
		default:
		}
		if _, err := n.CLI("version"); err == nil {
			return n.learnSubnet()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("agent %s did not answer within 30s:\n%s", n.Name, n.Tail(20))
}

// learnSubnet waits, for a node started without --pod-subnet, until its
// record shows the subnet it claimed, and sets PodSubnet.
func (n *Node) learnSubnet() error {
	if n.PodSubnet != "" {
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		out, err := n.CLI("get", "nodes", n.Name, "-o", "json")
		if err == nil {
			var l struct {
				Items []struct {
					Name, PodSubnet string
					Ready           bool
				}
			}
			if json.Unmarshal([]byte(out), &l) == nil && len(l.Items) == 1 && l.Items[0].Ready {
				n.PodSubnet = l.Items[0].PodSubnet
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("node %s claimed no pod subnet within 30s:\n%s", n.Name, n.Tail(20))
}

// AgentPID is the agent's process ID (0 when not running).
func (n *Node) AgentPID() int {
	if n.agent == nil || n.agent.Process == nil {
		return 0
	}
	select {
	case <-n.agentDone:
		return 0
	default:
	}
	return n.agent.Process.Pid
}

// KillAgent kills the agent with sig (SIGKILL: as in a crash) and waits.
func (n *Node) KillAgent(sig syscall.Signal) {
	if n.agent == nil || n.agent.Process == nil {
		return
	}
	// nsenter execs the agent, so the process is the agent itself.
	n.agent.Process.Signal(sig)
	select {
	case <-n.agentDone:
	case <-time.After(15 * time.Second):
		n.agent.Process.Kill()
		<-n.agentDone
	}
}

// SignalAgent sends sig to the agent and returns at once (SIGSTOP and
// SIGCONT: an agent that hangs, to its peers like a crash).
func (n *Node) SignalAgent(sig syscall.Signal) error {
	if n.agent == nil || n.agent.Process == nil {
		return fmt.Errorf("node %s has no agent", n.Name)
	}
	return n.agent.Process.Signal(sig)
}

// Tail returns the last lines of the agent's log.
func (n *Node) Tail(lines int) string {
	b, _ := os.ReadFile(n.AgentLogPath())
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// CLI runs `starling --server <node socket> args...` and returns stdout;
// on failure the error holds stderr.
func (n *Node) CLI(args ...string) (string, error) {
	return n.CLIInput(nil, args...)
}

// CLIInput is CLI with stdin.
func (n *Node) CLIInput(stdin io.Reader, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.c.Binary, append([]string{"--server", n.Socket}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("starling %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Exec runs a command inside the node's network namespace.
func (n *Node) Exec(ctx context.Context, name string, args ...string) (string, error) {
	return NetNSExec(ctx, n.NetNS, name, args...)
}

// NetNSExec runs a command in network namespace ns and returns its
// combined output.
func NetNSExec(ctx context.Context, ns, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + ns, name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("[%s] %s %s: %v: %s", ns, name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// Diagnostics returns the agent log tail, routes, addresses and iptables
// of the node, for test failure reports.
func (n *Node) Diagnostics() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	fmt.Fprintf(&b, "==== node %s (netns %s) agent log ====\n%s\n", n.Name, n.NetNS, n.Tail(60))
	for _, cmd := range [][]string{{"ip", "-br", "addr"}, {"ip", "route"}, {"iptables-save"}, {"nft", "list", "table", "ip", "starling"}} {
		out, _ := n.Exec(ctx, cmd[0], cmd[1:]...)
		fmt.Fprintf(&b, "---- %s ----\n%s\n", strings.Join(cmd, " "), out)
	}
	return b.String()
}

// Close stops and removes everything the cluster created. It is safe to
// call more than once and after partial set-up.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	for _, n := range c.Nodes {
		n.KillAgent(syscall.SIGKILL)
		if n.containerd != nil && n.containerd.Process != nil {
			n.containerd.Process.Kill()
			<-n.containerdDone
		}
	}
	return Down(c.Dir, c.Prefix)
}

// Down removes a cluster from what is on disk and in the kernel alone, so
// it also cleans up after a crashed test or demo: it kills every process
// whose command line names dir (agents, containerds, shims), the
// containers in the cgroups of the nodes found in dir, unmounts
// everything below dir, deletes network namespaces named prefix*, and
// removes dir.
func Down(dir, prefix string) error {
	var errs []error
	for _, pid := range pidsMatching(" " + dir + "/") {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	ents, _ := os.ReadDir(dir)
	var cgroups []string
	for _, e := range ents {
		if e.IsDir() {
			cgroups = append(cgroups, nodeCgroups(prefix+e.Name())...)
		}
	}
	for _, cg := range cgroups {
		killProcs(cg)
	}
	removeShimSockets(dir, ents)
	time.Sleep(200 * time.Millisecond)
	errs = append(errs, unmountUnder(dir))
	for i := len(cgroups) - 1; i >= 0; i-- {
		os.Remove(cgroups[i])
	}
	// The shared parent goes once no node of any cluster uses it.
	parents, _ := filepath.Glob("/sys/fs/cgroup/*/starling")
	for _, p := range parents {
		os.Remove(p)
	}
	nss, _ := os.ReadDir("/run/netns")
	for _, ns := range nss {
		if prefix != "" && strings.HasPrefix(ns.Name(), prefix) {
			if err := run("ip", "netns", "del", ns.Name()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// nodeCgroups lists cgroup directories of node name in every hierarchy,
// parents before children.
func nodeCgroups(name string) []string {
	var dirs []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/starling/" + name)
	if st, err := os.Stat("/sys/fs/cgroup/starling/" + name); err == nil && st.IsDir() {
		roots = append(roots, "/sys/fs/cgroup/starling/"+name)
	}
	for _, r := range roots {
		filepath.WalkDir(r, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	return dirs
}

func killProcs(cgroup string) {
	b, err := os.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// pidsMatching returns processes whose command line contains s (with
// arguments joined by spaces and a trailing space).
func pidsMatching(s string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// unmountUnder lazily unmounts every mount point below dir, deepest first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			points = append(points, fields[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// BuildBinary builds cmd/starling from moduleDir into dir and returns its
// path. It builds what `make build` ships: a static binary (CGO_ENABLED=0).
func BuildBinary(ctx context.Context, moduleDir, dir string) (string, error) {
	out := filepath.Join(dir, "starling")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/starling")
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/starling: %v\n%s", err, b)
	}
	return out, nil
}

// ModuleDir finds the Starling module root from the working directory.
func ModuleDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// CutOff isolates the node as a crash or a pulled cable would: its LAN
// link goes down and its agent and containers are killed (containerd
// stays, as it would come back with the machine).
func (n *Node) CutOff() error {
	if err := run("ip", "-n", n.NetNS, "link", "set", "eth0", "down"); err != nil {
		return err
	}
	n.KillAgent(syscall.SIGKILL)
	for _, cg := range nodeCgroups(n.CgroupName()) {
		killProcs(cg)
	}
	return nil
}

// Reboot power-cycles the node, keeping its disk: its agent, containers,
// shims and containerd are killed, what a reboot clears goes (the pods'
// tmpfs mounts, containerd's state directory, its tasks' rootfs mounts),
// then containerd and the agent start again, as a host's init would.
func (n *Node) Reboot() error {
	n.KillAgent(syscall.SIGKILL)
	for _, cg := range nodeCgroups(n.CgroupName()) {
		killProcs(cg)
	}
	n.StopContainerd()
	for _, pid := range pidsMatching(" " + n.ContainerdSocket() + " ") {
		syscall.Kill(pid, syscall.SIGKILL) // the shims
	}
	removeNodeShimSockets(n.Dir)
	time.Sleep(200 * time.Millisecond)
	state := filepath.Join(n.Dir, "containerd", "state")
	if err := errors.Join(unmountUnder(filepath.Join(n.DataDir, "pods")), unmountUnder(state)); err != nil {
		return err
	}
	if err := os.RemoveAll(state); err != nil {
		return err
	}
	if err := n.StartContainerd(); err != nil {
		return err
	}
	return n.RestartAgent()
}

// Reconnect brings the node's LAN link back, with the default route the
// link's going down removed (a host's network configuration would put it
// back too), and restarts its agent.
func (n *Node) Reconnect() error {
	if err := run("ip", "-n", n.NetNS, "link", "set", "eth0", "up"); err != nil {
		return err
	}
	if err := run("ip", "-n", n.NetNS, "route", "replace", "default", "via", LANPrefix+".254"); err != nil {
		return err
	}
	return n.RestartAgent()
}

// CgroupName is the node's cgroup under /starling (unique to the cluster,
// so clusters on one machine never see each other's containers).
func (n *Node) CgroupName() string { return n.c.Prefix + n.Name }

// TaskPIDs returns the process IDs in each replica container's cgroup,
// keyed by container ID; containers without a process are left out.
func (n *Node) TaskPIDs() map[string][]int {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/memory/starling/" + n.CgroupName() + "/*")
	if len(dirs) == 0 {
		dirs, _ = filepath.Glob("/sys/fs/cgroup/starling/" + n.CgroupName() + "/*")
	}
	out := map[string][]int{}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out[filepath.Base(d)] = append(out[filepath.Base(d)], pid)
			}
		}
	}
	return out
}

// RunningContainers counts the node's containers that have a process.
func (n *Node) RunningContainers() int { return len(n.TaskPIDs()) }

// removeShimSockets deletes the sockets of the killed containerd shims.
// A shim listens on /run/containerd/s/<sha256(containerd address +
// "/" + namespace + "/" + container id)> (containerd runtime/v2/shim
// SocketAddress) and leaves it behind when killed.
func removeShimSockets(dir string, nodes []os.DirEntry) {
	for _, e := range nodes {
		if e.IsDir() {
			removeNodeShimSockets(filepath.Join(dir, e.Name()))
		}
	}
}

// removeNodeShimSockets is removeShimSockets for the node of directory
// nodeDir.
func removeNodeShimSockets(nodeDir string) {
	cdir := filepath.Join(nodeDir, "containerd")
	address := filepath.Join(cdir, "containerd.sock")
	tasks, _ := filepath.Glob(filepath.Join(cdir, "state", "io.containerd.runtime.v2.task", "*", "*"))
	for _, t := range tasks {
		id, ns := filepath.Base(t), filepath.Base(filepath.Dir(t))
		sum := sha256.Sum256([]byte(filepath.Join(address, ns, id)))
		os.Remove(fmt.Sprintf("/run/containerd/s/%x", sum))
	}
}

// Partition splits the LAN in two: the given nodes move to a second bridge
// in the LAN namespace and reach only each other (the others keep br0 and
// its .254 address). Heal undoes it.
func (c *Cluster) Partition(side []*Node) error {
	if err := run("ip", "-n", c.LAN, "link", "show", "br1"); err != nil {
		if err := run("ip", "-n", c.LAN, "link", "add", "br1", "type", "bridge"); err != nil {
			return err
		}
		if err := run("ip", "-n", c.LAN, "link", "set", "br1", "up"); err != nil {
			return err
		}
	}
	for _, n := range side {
		if err := run("ip", "-n", c.LAN, "link", "set", "v"+n.Name, "master", "br1"); err != nil {
			return err
		}
	}
	return nil
}

// Heal puts every node back on one LAN bridge.
func (c *Cluster) Heal() error {
	for _, n := range c.Nodes {
		if err := run("ip", "-n", c.LAN, "link", "set", "v"+n.Name, "master", "br0"); err != nil {
			return err
		}
	}
	return nil
}

// MoveTo gives the node LAN address i (LANPrefix+".<10+i>") in place of
// its own, as a DHCP lease on a home LAN would after a reboot: the new
// address is added, the old one removed, the default route put back, and
// every agent flag that named the old address names the new one at the
// next RestartAgent. Stop the agent first (a running agent keeps the old
func (n *Node) MoveTo(i int) error {
	old, ip := n.IP, fmt.Sprintf("%s.%d", LANPrefix, 10+i)
	for _, cmd := range [][]string{
		// Deleting first: a primary address takes its secondaries with it.
		{"ip", "-n", n.NetNS, "addr", "del", old + "/24", "dev", "eth0"},
		{"ip", "-n", n.NetNS, "addr", "add", ip + "/24", "dev", "eth0"},
		{"ip", "-n", n.NetNS, "route", "replace", "default", "via", LANPrefix + ".254"},
	} {
		if err := run(cmd[0], cmd[1:]...); err != nil {
			return err
		}
	}
	for j, a := range n.agentArgs {
		if a == old {
			n.agentArgs[j] = ip
		} else if rest, ok := strings.CutPrefix(a, old+":"); ok {
			n.agentArgs[j] = ip + ":" + rest
		}
	}
	n.IP = ip
	return nil
}
