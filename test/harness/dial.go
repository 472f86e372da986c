package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/starling-orchestrator/starling/node/client"
	"golang.org/x/sys/unix"
)

// DialIn returns a dial function whose sockets are created inside network
// namespace ns (/run/netns/ns). A socket keeps the namespace it was
// created in, so only the socket() call needs the thread switched: the
// goroutine locks its OS thread, enters ns, dials, and switches back.
func DialIn(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return DialInPath("/run/netns/" + ns)
}

// DialInPath is DialIn for a namespace pinned at path (a pod's sandbox,
// <data-dir>/netns/<container id>).
func DialInPath(path string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	ns := path
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open netns %s: %w", ns, err)
		}
		defer unix.Close(target)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		orig, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			return nil, fmt.Errorf("enter netns %s: %w", ns, err)
		}
		var d net.Dialer
		conn, derr := d.DialContext(ctx, network, addr)
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// The thread is stuck in the wrong namespace: never unlock it,
			// so the runtime discards it when this goroutine ends.
			runtime.LockOSThread()
			if conn != nil {
				conn.Close()
			}
			return nil, fmt.Errorf("return from netns %s: %w", ns, err)
		}
		return conn, derr
	}
}

// HTTPGet fetches url from inside network namespace ns with a fresh
// connection and returns the body. timeout bounds the whole request.
func HTTPGet(ns, url string, timeout time.Duration) (string, error) {
	return httpGet(DialIn(ns), url, timeout)
}

// PodHTTPGet fetches url from inside the sandbox of a replica on node n.
func (n *Node) PodHTTPGet(namespace, replica, url string, timeout time.Duration) (string, error) {
	return httpGet(DialInPath(filepath.Join(n.DataDir, "netns", namespace+"_"+replica)), url, timeout)
}

func httpGet(dial func(ctx context.Context, network, addr string) (net.Conn, error), url string, timeout time.Duration) (string, error) {
	client := &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true},
	}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// ServeIn starts an echo HTTP server listening on addr inside network
// namespace ns (answering "remote=<client address>"); Close stops it.
func ServeIn(ns, addr string) (*http.Server, error) {
	l, err := ListenIn(ns, addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fmt.Fprintf(w, "remote=%s\n", req.RemoteAddr)
	})}
	go srv.Serve(l)
	return srv, nil
}

// ListenIn listens on TCP addr inside network namespace ns.
func ListenIn(ns, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNetNS(ns, func() (err error) { l, err = net.Listen("tcp", addr); return err })
	if err != nil {
		return nil, fmt.Errorf("listen %s in %s: %w", addr, ns, err)
	}
	return l, nil
}

// ListenPacketIn listens on UDP addr inside network namespace ns.
func ListenPacketIn(ns, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := inNetNS(ns, func() (err error) { pc, err = net.ListenPacket("udp", addr); return err })
	if err != nil {
		return nil, fmt.Errorf("listen %s/udp in %s: %w", addr, ns, err)
	}
	return pc, nil
}

// inNetNS runs f on a thread that has entered network namespace ns (and
// is never returned to the pool): what f opens stays in ns.
func inNetNS(ns string, f func() error) error {
	target, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(target)
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			ch <- err
			return
		}
		ch <- f()
	}()
	return <-ch
}

// API is a client of the node's API over its unix socket (no CLI
// process, so a test can sample every 100 ms); each call is bounded to
// 2 s.
func (n *Node) API() *client.Client {
	c, err := client.New(n.Socket, client.WithTimeout(2*time.Second))
	if err != nil {
		panic(err) // a socket path is always a valid server
	}
	return c
}

// PodHTTPPost is PodHTTPGet with a POST of body.
func (n *Node) PodHTTPPost(namespace, replica, url, body string, timeout time.Duration) (string, error) {
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: DialInPath(filepath.Join(n.DataDir, "netns", namespace+"_"+replica)), DisableKeepAlives: true}}
	resp, err := client.Post(url, "application/octet-stream", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("POST %s: %s: %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	return string(b), nil
}

// PodRedis sends Redis commands (inline, one per line) to addr from
// inside the network namespace of replica (of namespace) on n, and
// returns each reply: a status or error line, an integer, or a bulk
// string's value ("(nil)" for none).
func (n *Node) PodRedis(namespace, replica, addr string, timeout time.Duration, cmds ...string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := DialInPath(filepath.Join(n.DataDir, "netns", namespace+"_"+replica))(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	r := bufio.NewReader(conn)
	var out []string
	for _, c := range cmds {
		if _, err := io.WriteString(conn, c+"\r\n"); err != nil {
			return out, err
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return out, err
		}
		line = strings.TrimRight(line, "\r\n")
		if strings.HasPrefix(line, "$") {
			size, err := strconv.Atoi(line[1:])
			if err != nil || size < 0 {
				out = append(out, "(nil)")
				continue
			}
			buf := make([]byte, size+2)
			if _, err := io.ReadFull(r, buf); err != nil {
				return out, err
			}
			line = string(buf[:size])
		}
		out = append(out, line)
	}
	return out, nil
}

// ReplicaHTTPGet and ReplicaHTTPPost are PodHTTPGet and PodHTTPPost to
// a server of the replica itself: a refused connection (the replica
// runs but does not listen yet; without a readiness probe Running says
// no more, as in Kubernetes) is tried again every 100 ms until timeout.
func (n *Node) ReplicaHTTPGet(namespace, replica, url string, timeout time.Duration) (string, error) {
	return untilListening(timeout, func(left time.Duration) (string, error) { return n.PodHTTPGet(namespace, replica, url, left) })
}

func (n *Node) ReplicaHTTPPost(namespace, replica, url, body string, timeout time.Duration) (string, error) {
	return untilListening(timeout, func(left time.Duration) (string, error) { return n.PodHTTPPost(namespace, replica, url, body, left) })
}

func untilListening(timeout time.Duration, try func(left time.Duration) (string, error)) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		body, err := try(time.Until(deadline))
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Until(deadline) < 200*time.Millisecond {
			return body, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
