// Command echo is the test and demo workload: an HTTP server that answers
// every request with the replica's hostname, its pod IP and the remote
// address it sees, one "key=value" per line, so tests can assert who
// served a request and whether the client's source address was kept.
//
// Paths: "/" echoes; "/healthz" answers 200 unless the file /tmp/unready
// exists (then 503); "/unready" and "/ready" create and remove that file,
// so tests can flip readiness. "/livez" answers 200 until "/sick" (then
// 503 until "/well"); that state is in memory, so a restarted container
// is healthy again. "/set?file=NAME" and "/clear?file=NAME" create and
// remove /tmp/NAME, for exec probes to look at. "/etc?name=hosts" (or
// hostname, resolv.conf) answers with that file of the container;
// "/signal" with the name of the stop signal received ("" before one);
// "/sandbox" with what the sandbox allows (raw sockets, a writable root
// filesystem, user, limits, capabilities); "/spawn?n=N" starts up to N
// processes and says how many the pids limit let through;
// "/resolve?name=N&type=A|SRV|CNAME|PTR" resolves N as a program in the
// container does, "/file?path=P" reads (and a POST writes) any file,
// "/ws" is a WebSocket that answers each message with "HOSTNAME: " and
// the message.
// Environment: PORT (default 8080), MESSAGE (printed as "message="),
// SHUTDOWN_DELAY (a duration: keep serving that long after the stop
// signal, SIGTERM, SIGINT or SIGQUIT).
//
// The image has no shell, so exec probes run this binary:
//
//	/echo check [-alloc MIB] [-exists FILE] [-absent FILE] [-sleep DURATION] [-get URL] [-linger DURATION] [-write FILE=TEXT] [-exit N]
//
// exits 0 (or N, -exit) when FILE exists (-exists), FILE2 does not
// (-absent) and a GET of URL answers 200 (-get), after allocating MIB
// (-alloc) and sleeping DURATION; otherwise it says why and exits 1.
// -linger sleeps after the GET (a slow lifecycle hook).
//
// "/echo chatter N SIZE" writes N log lines of SIZE bytes, then one to
// stderr, and then sleeps.
package main

import (
	"context"

	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// check is the exec-probe mode: see the package comment.
func check(args []string) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	exists := fs.String("exists", "", "fail unless this file exists")
	absent := fs.String("absent", "", "fail if this file exists")
	sleep := fs.Duration("sleep", 0, "sleep this long first")
	linger := fs.Duration("linger", 0, "sleep this long after the GET")
	get := fs.String("get", "", "fail unless a GET of this URL answers 200 (names resolve as the container's resolver says)")
	exit := fs.Int("exit", 0, "exit with this status (after the other checks pass)")
	alloc := fs.Int("alloc", 0, "first allocate and touch this many MiB (to meet a memory limit)")
	write := fs.String("write", "", "FILE=TEXT: write TEXT to FILE (an init container's work)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if file, text, ok := strings.Cut(*write, "="); ok {
		if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
			fmt.Println(err)
			return 1
		}
		fmt.Printf("wrote %s\n", file)
	}
	if *alloc > 0 {
		var held [][]byte
		for i := 0; i < *alloc; i++ {
			b := make([]byte, 1<<20)
			for j := range b {
				b[j] = byte(j)
			}
			held = append(held, b)
		}
		fmt.Printf("allocated %d MiB\n", len(held))
	}
	time.Sleep(*sleep)
	if *get != "" {
		resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(*get)
		if err != nil {
			fmt.Println(err)
			return 1
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			fmt.Println(resp.Status)
			return 1
		}
	}
	time.Sleep(*linger)
	if *exit != 0 {
		fmt.Printf("exiting with %d\n", *exit)
		return *exit
	}
	if *exists != "" {
		if _, err := os.Stat(*exists); err != nil {
			fmt.Printf("%s does not exist\n", *exists)
			return 1
		}
	}
	if *absent != "" {
		if _, err := os.Stat(*absent); err == nil {
			fmt.Printf("%s exists\n", *absent)
			return 1
		}
	}
	return 0
}

// tmpFile maps a "file" query parameter to a file under /tmp.
func tmpFile(r *http.Request) (string, bool) {
	name := r.URL.Query().Get("file")
	if name == "" || name != filepath.Base(name) || name == ".." {
		return "", false
	}
	return filepath.Join("/tmp", name), true
}

// stopSignal is the stop signal received (its name), for GET /signal.
var stopSignal atomic.Value

func podIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	return ""
}

// chatter is the log-writing mode: "/echo chatter N SIZE" prints N lines
// of SIZE bytes ("line 000042 xxx...") on stdout, then, half a second
// later (the log driver reads the two streams apart), "wrote N lines" on
// stderr, and sleeps until stopped.
func chatter(args []string) int {
	if len(args) != 2 {
		return 2
	}
	n, _ := strconv.Atoi(args[0])
	size, _ := strconv.Atoi(args[1])
	for i := 0; i < n; i++ {
		line := fmt.Sprintf("line %06d ", i)
		fmt.Println(line + strings.Repeat("x", max(0, size-len(line))))
	}
	time.Sleep(500 * time.Millisecond)
	fmt.Fprintf(os.Stderr, "wrote %d lines\n", n)
	for {
		time.Sleep(time.Hour)
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "check" {
		os.Exit(check(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "chatter" {
		os.Exit(chatter(os.Args[2:]))
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if _, err := os.Stat("/tmp/unready"); err == nil {
			http.Error(w, "unready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// Tests flip readiness from outside: /unready makes /healthz fail.
	mux.HandleFunc("/unready", func(w http.ResponseWriter, r *http.Request) {
		os.WriteFile("/tmp/unready", nil, 0o644)
		fmt.Fprintln(w, "unready")
	})
	mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		os.Remove("/tmp/unready")
		fmt.Fprintln(w, "ready")
	})
	var sick atomic.Bool
	mux.HandleFunc("/livez", func(w http.ResponseWriter, r *http.Request) {
		if sick.Load() {
			http.Error(w, "sick", http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/sick", func(w http.ResponseWriter, r *http.Request) {
		sick.Store(true)
		fmt.Fprintln(w, "sick")
	})
	mux.HandleFunc("/well", func(w http.ResponseWriter, r *http.Request) {
		sick.Store(false)
		fmt.Fprintln(w, "well")
	})
	mux.HandleFunc("/set", func(w http.ResponseWriter, r *http.Request) {
		f, ok := tmpFile(r)
		if !ok {
			http.Error(w, "want ?file=NAME", http.StatusBadRequest)
			return
		}
		os.WriteFile(f, nil, 0o644)
		fmt.Fprintln(w, "set", f)
	})
	mux.HandleFunc("/clear", func(w http.ResponseWriter, r *http.Request) {
		f, ok := tmpFile(r)
		if !ok {
			http.Error(w, "want ?file=NAME", http.StatusBadRequest)
			return
		}
		os.Remove(f)
		fmt.Fprintln(w, "cleared", f)
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, append([]byte(host+": "), msg...)); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hostname=%s\npodIP=%s\nremote=%s\nmessage=%s\n", host, podIP(), r.RemoteAddr, os.Getenv("MESSAGE"))
	})
	// UDP on the same port: every datagram is answered with the same
	// fields, so Service tests can follow UDP flows too.
	if pc, err := net.ListenPacket("udp", ":"+port); err == nil {
		go func() {
			buf := make([]byte, 2048)
			for {
				_, addr, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				fmt.Fprintf(writerTo{pc, addr}, "hostname=%s\npodIP=%s\nremote=%s\n", host, podIP(), addr)
			}
		}()
	}
	// GET /resolve?name=N&type=A|SRV|CNAME|PTR: N resolved as a program in
	// the container resolves it (Go's resolver: /etc/resolv.conf, its
	// search path and ndots); one answer per line, sorted; 502 with
	// the error when the lookup fails.
	mux.HandleFunc("/resolve", func(w http.ResponseWriter, r *http.Request) {
		name, kind := r.URL.Query().Get("name"), r.URL.Query().Get("type")
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		var out []string
		var err error
		switch kind {
		case "SRV":
			var srvs []*net.SRV
			if _, srvs, err = net.DefaultResolver.LookupSRV(ctx, "", "", name); err == nil {
				for _, s := range srvs {
					out = append(out, fmt.Sprintf("%s:%d", s.Target, s.Port))
				}
			}
		case "CNAME":
			var c string
			c, err = net.DefaultResolver.LookupCNAME(ctx, name)
			out = append(out, c)
		case "PTR": // name is an address
			out, err = net.DefaultResolver.LookupAddr(ctx, name)
		default:
			out, err = net.DefaultResolver.LookupHost(ctx, name)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		sort.Strings(out)
		fmt.Fprintln(w, strings.Join(out, "\n"))
	})
	// GET /etc?name=hosts|hostname|resolv.conf: the container's file.
	mux.HandleFunc("/etc", func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("name")
		if name != "hosts" && name != "hostname" && name != "resolv.conf" {
			http.Error(w, "name: hosts, hostname or resolv.conf", http.StatusBadRequest)
			return
		}
		b, err := os.ReadFile("/etc/" + name)
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.Write(b)
	})
	// GET /file?path=P: any file of the container (volumes' files);
	// POST /file?path=P with a body writes it (a read-only mount
	// answers 500 with the error).
	mux.HandleFunc("/file", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			if err := os.WriteFile(p, b, 0o644); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
			return
		}
		b, err := os.ReadFile(p)
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.Write(b)
	})
	// POST /exit: the process exits 1 once it has answered (a crash,
	// for restart tests).
	mux.HandleFunc("/exit", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST", http.StatusMethodNotAllowed)
			return
		}
		w.Write([]byte("exiting\n"))
		go func() { time.Sleep(100 * time.Millisecond); os.Exit(1) }()
	})
	// GET /sandbox: what the container's sandbox allows, one key=value
	// per line.
	mux.HandleFunc("/sandbox", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, sandboxReport())
	})
	// GET /spawn?n=N: starts up to N sleeping copies of this program,
	// answers how many started before the kernel refused one, and ends
	// them.
	mux.HandleFunc("/spawn", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		var cmds []*exec.Cmd
		var err error
		for len(cmds) < n {
			cmd := exec.Command("/echo", "check", "-sleep", "30s")
			if err = cmd.Start(); err != nil {
				break
			}
			cmds = append(cmds, cmd)
		}
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
		fmt.Fprintf(w, "spawned=%d\nerr=%v\n", len(cmds), err)
	})
	// GET /signal: the stop signal received so far ("" before one).
	mux.HandleFunc("/signal", func(w http.ResponseWriter, r *http.Request) {
		v, _ := stopSignal.Load().(string)
		fmt.Fprint(w, v)
	})
	srv := &http.Server{Addr: ":" + port, Handler: mux}
	// SHUTDOWN_DELAY keeps serving that long after SIGTERM: the nodes
	// drop a stopping replica from their Service rules while it is being
	// stopped (as Kubernetes does), so a server that closes at once
	// refuses the few requests still sent to it.
	delay, err := time.ParseDuration(os.Getenv("SHUTDOWN_DELAY"))
	if err != nil {
		delay = 0
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT)
		s := <-sig
		stopSignal.Store(s.String())
		log.Printf("got signal %s", s)
		if delay > 0 {
			log.Printf("stopping: serving %s more while the Service rules drop this replica", delay)
			time.Sleep(delay)
		}
		srv.Close()
	}()
	log.Printf("echo listening on :%s as %s (%s)", port, host, podIP())
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}

type writerTo struct {
	pc   net.PacketConn
	addr net.Addr
}

func (w writerTo) Write(b []byte) (int, error) { return w.pc.WriteTo(b, w.addr) }

// sandboxReport says what the sandbox allows: a raw socket, writing the
// root filesystem, the user and group, the open-files limit,
// no_new_privs, the seccomp mode, the effective capabilities, and whether
// /sys/fs/cgroup shows anything.
func sandboxReport() string {
	var b strings.Builder
	raw := "allowed"
	if fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_ICMP); err != nil {
		raw = "refused"
	} else {
		syscall.Close(fd)
	}
	fmt.Fprintf(&b, "rawSocket=%s\n", raw)
	rootfs := "writable"
	if f, err := os.Create("/.sandbox-probe"); err != nil {
		rootfs = "read-only"
	} else {
		f.Close()
		os.Remove("/.sandbox-probe")
	}
	fmt.Fprintf(&b, "rootfs=%s\nuid=%d\ngid=%d\n", rootfs, os.Getuid(), os.Getgid())
	groups, _ := os.Getgroups()
	fmt.Fprintf(&b, "groups=%v\n", groups)
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	fmt.Fprintf(&b, "nofile=%d:%d\n", lim.Cur, lim.Max)
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		for _, k := range []string{"NoNewPrivs", "Seccomp", "CapEff"} {
			if v, ok := strings.CutPrefix(line, k+":"); ok {
				fmt.Fprintf(&b, "%s=%s\n", k, strings.TrimSpace(v))
			}
		}
	}
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	fmt.Fprintf(&b, "cgroupEntries=%d\n", len(entries))
	return b.String()
}
