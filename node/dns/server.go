package dns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"
)

// Config configures a Server.
type Config struct {
	// Addr is where it listens, UDP and TCP ("10.22.1.1:53").
	Addr string
	// ZoneFile is the zone's Input as JSON, written by the agent (Write)
	// and read again whenever it changes.
	ZoneFile string
	// Upstreams are the resolvers of names outside the cluster domain
	// ("192.168.1.1:53"), tried in order.
	Upstreams []string
	// CacheSize bounds the upstream answers kept (0: DefaultCacheSize).
	CacheSize int
	Log       *slog.Logger
}

// DefaultCacheSize is the number of upstream answers a server keeps by
// default (each a few hundred bytes: about 2 MB in all).
const DefaultCacheSize = 10000

// Server answers DNS queries: the cluster domain from its zone, the
// rest from its cache or its upstream resolvers, one upstream query per
// name and type at a time however many pods ask (singleflight).
type Server struct {
	cfg    Config
	zone   atomic.Pointer[Zone]
	cache  *Cache
	flight singleflight.Group
	client *dns.Client
	// down is when each upstream that failed to answer is tried first
	// again (tried last until then).
	mu   sync.Mutex
	down map[string]time.Time
	// Counters, for tests and benchmarks: queries answered, and those
	// that were forwarded upstream.
	Queries, Forwarded atomic.Int64
}

// NewServer makes a server of cfg answering from zone z until its zone
// file says otherwise.
func NewServer(cfg Config, z *Zone) *Server {
	if cfg.CacheSize == 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, cache: NewCache(cfg.CacheSize), client: &dns.Client{Timeout: 2 * time.Second}, down: map[string]time.Time{}}
	if z == nil {
		z = Build(Input{})
	}
	s.zone.Store(z)
	return s
}

// SetZone makes z the zone answered from now on.
func (s *Server) SetZone(z *Zone) { s.zone.Store(z) }

// ServeDNS answers one query (dns.Handler).
func (s *Server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	s.Queries.Add(1)
	m := s.answer(r)
	// EDNS (RFC 6891): an answer carries an OPT record only if the
	// query did, and it is this server's (an upstream's is dropped).
	m.Extra = slices.DeleteFunc(m.Extra, func(rr dns.RR) bool { return rr.Header().Rrtype == dns.TypeOPT })
	size := dns.MinMsgSize
	if opt := r.IsEdns0(); opt != nil {
		size = max(int(opt.UDPSize()), dns.MinMsgSize)
		m.SetEdns0(ednsSize, opt.Do())
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		m.Truncate(size)
	} else {
		m.Truncate(dns.MaxMsgSize)
	}
	if err := w.WriteMsg(m); err != nil {
		s.cfg.Log.Debug("write a DNS answer", "err", err)
	}
}

// answer is the reply to r.
func (s *Server) answer(r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	if r.Opcode != dns.OpcodeQuery || len(r.Question) != 1 {
		m.SetRcode(r, dns.RcodeFormatError)
		return m
	}
	q := r.Question[0]
	if answer, authority, rcode, ok := s.zone.Load().Answer(q); ok {
		m.SetRcode(r, rcode)
		m.Authoritative, m.RecursionAvailable = true, true
		m.Answer, m.Ns = answer, authority
		s.chase(m, q)
		return m
	}
	do := false
	if opt := r.IsEdns0(); opt != nil {
		do = opt.Do()
	}
	up, err := s.forward(q, do)
	if err != nil {
		s.cfg.Log.Debug("forward a DNS query", "name", q.Name, "err", err)
		m.SetRcode(r, dns.RcodeServerFailure)
		m.RecursionAvailable = true
		return m
	}
	up.Id, up.Question, up.Response = r.Id, r.Question, true
	up.RecursionDesired, up.RecursionAvailable = r.RecursionDesired, true
	return up
}

// chase follows the CNAME answer of m (an ExternalName Service's, to
// another's too, at most maxChase links) to its target's records of q's
// type, from the zone or upstream, as a recursive resolver does (a
// program's resolver asks for A, not for the chain); a target that does
// not resolve leaves m with the CNAMEs and the target's rcode.
func (s *Server) chase(m *dns.Msg, q dns.Question) {
	if q.Qtype == dns.TypeCNAME || q.Qtype == dns.TypeANY {
		return
	}
	for range maxChase {
		if len(m.Answer) == 0 {
			return
		}
		cname, ok := m.Answer[len(m.Answer)-1].(*dns.CNAME)
		if !ok {
			return
		}
		next := dns.Question{Name: cname.Target, Qtype: q.Qtype, Qclass: q.Qclass}
		if answer, authority, rcode, ok := s.zone.Load().Answer(next); ok {
			m.Answer, m.Ns, m.Rcode = append(m.Answer, answer...), authority, rcode
			continue // the zone's answer may be a CNAME again
		}
		up, err := s.forward(next, false)
		if err != nil {
			m.Rcode = dns.RcodeServerFailure
			return
		}
		m.Answer, m.Ns, m.Rcode = append(m.Answer, up.Answer...), up.Ns, up.Rcode
		return // an upstream resolver gives the whole chain
	}
}

// maxChase bounds the CNAMEs chased through the zone (a loop of
// ExternalName Services ends there).
const maxChase = 8

// ednsSize is the UDP payload size this server offers and asks for
// (DNS flag day 2020: no fragments).
const ednsSize = 1232

// errFailedRecently is a query every upstream failed to answer less
// than FailTTL ago.
var errFailedRecently = errors.New("every upstream failed to answer it moments ago")

// forward answers q from the cache, or asks the upstreams (once for all
// who ask at the same time) and keeps the answer, or the failure.
func (s *Server) forward(q dns.Question, do bool) (*dns.Msg, error) {
	if m, ok := s.cache.Get(q, do, time.Now()); ok {
		if m.Rcode == dns.RcodeServerFailure {
			return nil, errFailedRecently
		}
		return m, nil
	}
	key := fmt.Sprintf("%s/%d/%d/%t", strings.ToLower(q.Name), q.Qtype, q.Qclass, do)
	v, err, _ := s.flight.Do(key, func() (any, error) {
		s.Forwarded.Add(1)
		m, err := s.exchange(q, do)
		if err == nil {
			s.cache.Put(q, do, m, time.Now())
		} else {
			s.cache.PutFailure(q, do, time.Now())
		}
		return m, err
	})
	if err != nil {
		return nil, err
	}
	return v.(*dns.Msg).Copy(), nil
}

// upstreamDownFor is how long an upstream that failed to answer is
// tried after the others.
const upstreamDownFor = 30 * time.Second

// upstreams are the upstreams in the order to ask them: as configured,
// those that failed in the last upstreamDownFor last.
func (s *Server) upstreams(now time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var up, down []string
	for _, u := range s.cfg.Upstreams {
		if now.Before(s.down[u]) {
			down = append(down, u)
		} else {
			up = append(up, u)
		}
	}
	return append(up, down...)
}

// answered records whether upstream u answered.
func (s *Server) answered(u string, ok bool, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ok {
		delete(s.down, u)
	} else {
		s.down[u] = now.Add(upstreamDownFor)
	}
}

// exchange asks the upstreams in turn (the ones answering first), over
// UDP and, for a truncated answer, TCP.
func (s *Server) exchange(q dns.Question, do bool) (*dns.Msg, error) {
	if len(s.cfg.Upstreams) == 0 {
		return nil, errors.New("no upstream resolver")
	}
	req := new(dns.Msg)
	req.Question = []dns.Question{q}
	req.RecursionDesired = true
	req.SetEdns0(ednsSize, do)
	var errs []error
	for _, up := range s.upstreams(time.Now()) {
		m, _, err := s.client.Exchange(req, up)
		if err == nil && m.Truncated {
			tcp := *s.client
			tcp.Net = "tcp"
			m, _, err = tcp.Exchange(req, up)
		}
		s.answered(up, err == nil, time.Now())
		if err == nil && m.Rcode != dns.RcodeServerFailure && m.Rcode != dns.RcodeRefused {
			return m, nil
		}
		if err == nil {
			err = fmt.Errorf("%s answered %s", up, dns.RcodeToString[m.Rcode])
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// Run serves on cfg.Addr, UDP and TCP, and reloads the zone file when
// it changes (checked every 100 ms: answers follow the view within
// that and the agent's write), until ctx ends. The sockets are opened
// with SO_REUSEPORT, so a new server can take over before the old one
// stops, and IP_FREEBIND, so the server listens on the node bridge's
// address before the bridge has it (the CNI bridge plugin gives it with
// the first pod), and answers from the moment it does.
func (s *Server) Run(ctx context.Context) error {
	// The zone before the first query: a server started (again) never
	// answers NXDOMAIN for the cluster's names from an empty zone.
	var seen zoneStamp
	if stamp, ok := stampOf(s.cfg.ZoneFile); ok {
		if z, err := Load(s.cfg.ZoneFile); err == nil {
			s.SetZone(z)
			seen = stamp
		}
	}
	var servers []*dns.Server
	errc := make(chan error, 2)
	lc := net.ListenConfig{Control: reuseFreebind}
	for _, network := range []string{"udp", "tcp"} {
		started := make(chan struct{})
		srv := &dns.Server{Handler: s, NotifyStartedFunc: func() { close(started) }}
		var err error
		if network == "udp" {
			srv.PacketConn, err = lc.ListenPacket(ctx, network, s.cfg.Addr)
		} else {
			srv.Listener, err = lc.Listen(ctx, network, s.cfg.Addr)
		}
		if err != nil {
			for _, o := range servers {
				o.Shutdown()
			}
			return fmt.Errorf("listen on %s/%s: %w", s.cfg.Addr, network, err)
		}
		servers = append(servers, srv)
		go func() { errc <- srv.ActivateAndServe() }()
		select {
		case <-started:
		case err := <-errc:
			for _, o := range servers[:len(servers)-1] {
				o.Shutdown()
			}
			return fmt.Errorf("listen on %s/%s: %w", s.cfg.Addr, network, err)
		}
	}
	defer func() {
		for _, srv := range servers {
			srv.Shutdown()
		}
	}()
	s.cfg.Log.Info("DNS listening", "addr", s.cfg.Addr, "upstreams", s.cfg.Upstreams)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if stamp, ok := stampOf(s.cfg.ZoneFile); ok && stamp != seen {
			if z, err := Load(s.cfg.ZoneFile); err != nil {
				s.cfg.Log.Warn("read the zone", "file", s.cfg.ZoneFile, "err", err)
			} else {
				s.SetZone(z)
				seen = stamp
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-tick.C:
		}
	}
}

// reuseFreebind sets SO_REUSEPORT and IP_FREEBIND (IPV6_FREEBIND) on a
// socket before it binds.
func reuseFreebind(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); serr != nil {
			return
		}
		if strings.HasSuffix(network, "6") {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1)
		}
	})
	return errors.Join(err, serr)
}

// zoneStamp identifies a version of the zone file.
type zoneStamp struct {
	mod  time.Time
	size int64
	ino  uint64
}

func stampOf(path string) (zoneStamp, bool) {
	info, err := os.Stat(path)
	if err != nil {
		return zoneStamp{}, false
	}
	return zoneStamp{info.ModTime(), info.Size(), inode(info)}, true
}

// Load reads the zone file at path (an Input as JSON) and builds it.
func Load(path string) (*Zone, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var in Input
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("zone file %s: %w", path, err)
	}
	return Build(in), nil
}

// Write writes in to the zone file at path, atomically (a new file
// renamed over it), unless it holds in already; it reports whether it
// wrote.
func Write(path string, in Input) (bool, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return false, err
	}
	if old, err := os.ReadFile(path); err == nil && string(old) == string(b) {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, path)
}
