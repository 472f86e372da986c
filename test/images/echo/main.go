// Command echo is the test and demo workload: an HTTP server that answers
// every request with the replica's hostname, its pod IP and the remote
// address it sees, one "key=value" per line, so tests can assert who
// served a request and whether the client's source address was kept.
//
// Paths: "/" echoes; "/healthz" answers 200 unless the file /tmp/unready
// exists (then 503); "/unready" and "/ready" create and remove that file,
// so tests can flip readiness.
// Environment: PORT (default 8080), MESSAGE (printed as "message=").
package main

import (
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
)

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

func main() {
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
	srv := &http.Server{Addr: ":" + port, Handler: mux}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
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
