// Command hostile is the hostile peer of the e2e suite (test/e2e,
// TestHostilePeerChangesNothing): a program that holds an invitation,
// joins through a seed (receiving what every node receives: the gossip
// key and the CA certificate), and writes
// records no honest node would, each aimed at one attack of issue 10: rule injection through a
// replica's podIP, a foreign podIP, a route hijack through a subnet claim
// outside --cluster-cidr, another node's status record (under its own
// name, and forged under the victim's name with its own key), a Service
// that does not validate, a Deployment stamped two hours in the future
// and an unsigned Deployment. Records are signed with its node key, as a
// real attacker's would be. The status records it writes under other
// names carry the certificates of the invitations --invitations names
// (what several hostile invited nodes would hold), signed with their
// keys; a name with none gets its own certificate.
//
// With --stranger it holds nothing (no token, no key): it tries to join
// gossip in the clear and to be admitted with a made-up token, and prints
// what happened.
// It stays a live member (so its claims would count) until killed.
//
// With --forgotten DIR it plays a node that 'starling node forget' removed
// but that kept its data dir DIR (the gossip keys, the CA certificate, its
// key), or whoever took a live node's data dir: it mints itself an
// identity under --name (a new name, or another node's) with the CA key if
// DIR holds one, else with its own node key posing as the CA, asks the
// seed to admit it with that as an invitation, asks the seed
// for the cluster's gossip keys over mutual TLS with it, joins gossip
// with the keys it kept and, if that works, publishes a status record for
// the new identity; it prints what happened and exits.
//
// With --impostor VICTIM it takes a node's name in gossip from its own
// address, with what an attacker could hold (--with): "gossip-key", the
// gossip key copied from a node's data dir (--secrets-from), with
// unsigned metadata dated as the oldest member; "token", a join token
// under a name of its own, then the victim's name, its metadata signed
// with its own key; "cert", a certificate for the victim's name minted
// with the CA key copied from a data dir that holds it, its status record for
// the victim's name and its metadata signed with the key the
// certificate names. Whatever the honest nodes route to it at
// --serve-addr (an address of the victim's pod subnet, which the test
// gives its namespace) is answered "impostor". It pushes its alive
// message again every 2 s until killed.
//
// It is a test tool: it never runs outside a test's network namespace.
package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/trust"
)

func main() {
	name := flag.String("name", "evil", "member name")
	bind := flag.String("bind", "", "gossip address IP (port 7946)")
	tokenFile := flag.String("token-file", "", "an invitation ('starling join-token NAME') for --name")
	invitations := flag.String("invitations", "", "comma-separated invitation files for other names: their status records carry those certificates")
	dataDir := flag.String("data-dir", "", "where the join keeps its credentials")
	stranger := flag.Bool("stranger", false, "instead: hold nothing; try to join gossip in the clear and the join endpoint with a made-up token")
	join := flag.String("join", "", "seed address")
	victim := flag.String("victim", "", "a running node whose status record to forge")
	victimSubnet := flag.String("victim-subnet", "", "the victim's pod subnet, claimed under another name")
	fakeAPI := flag.Bool("fake-api", false, "instead: publish a valid status of its own with an API at <bind>:7443 and a replica ghost-0, and print every request that API gets")
	serve := flag.String("serve-blobs", "", "with --fake-api: a directory of image blobs named by digest (sha256:HEX); a blob request for one of them gets it, any other the --poison file")
	poison := flag.String("poison", "", "with --serve-blobs: what every other blob request gets")
	forgotten := flag.String("forgotten", "", "instead: the data dir of a forgotten or compromised node; mint an identity for --name with what it holds and try to get in")
	impostor := flag.String("impostor", "", "instead: take this node's name in gossip (see --with)")
	with := flag.String("with", "", "with --impostor: gossip-key, token or cert")
	secretsFrom := flag.String("secrets-from", "", "with --with gossip-key or cert: a node's data dir to copy the cluster's secrets from")
	serveAddr := flag.String("serve-addr", "", "with --impostor: answer HTTP on this address:port with \"impostor\"")
	flag.Parse()
	var err error
	switch {
	case *impostor != "":
		err = runImpostor(*impostor, *with, *bind, *secretsFrom, *tokenFile, *dataDir, *join, *serveAddr)
	case *stranger:
		err = runStranger(*name, *bind, *join)
	case *forgotten != "":
		err = runForgotten(*name, *bind, *forgotten, *join)
	default:
		err = run(*name, *bind, *tokenFile, *dataDir, *join, *victim, *victimSubnet, *fakeAPI, *serve, *poison, *invitations)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostile:", err)
		os.Exit(1)
	}
}

func run(name, bind, tokenFile, dataDir, join, victim, victimSubnet string, fakeAPI bool, serveBlobs, poison, invitations string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	key, gossipKey, ca, ownCert, err := trust.JoinCluster(ctx, dataDir, name, tokenFile, join)
	cancel()
	if err != nil {
		return err
	}
	fmt.Println("admitted with the invitation as", name)
	certs, keys := map[string][]byte{}, map[string]ed25519.PrivateKey{}
	for _, f := range strings.Split(invitations, ",") {
		if f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		n, k, der, err := trust.ParseInvitation(string(b))
		if err != nil {
			return fmt.Errorf("--invitations %s: %w", f, err)
		}
		certs[n], keys[n] = der, k
	}
	certFor := func(n string) []byte {
		if der, ok := certs[n]; ok {
			return der
		}
		return ownCert
	}
	cfg := gossip.DefaultConfig()
	cfg.Name, cfg.BindAddr, cfg.BindPort, cfg.SecretKey = name, bind, 7946, gossipKey
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := gossip.New(cfg, gossip.NewMemState())
	if err != nil {
		return err
	}
	defer c.Shutdown()
	if _, err := c.Join([]string{join}); err != nil {
		return err
	}
	clock := hlc.New(nil)
	status := func(node, subnet string, replicas ...map[string]any) []byte {
		v, _ := json.Marshal(map[string]any{"name": node, "advertise": bind, "podSubnet": subnet,
			"subnetSince": map[string]any{"wall": 1}, "subnetReady": true,
			"capacity": map[string]any{"milliCPU": 64000, "memoryBytes": 1 << 40}, "started": time.Now().UTC(), "replicas": replicas,
			"cert": certFor(node)})
		return v
	}
	replica := func(node, ip string) map[string]any {
		return map[string]any{"name": "hello-0", "namespace": "default", "workload": "hello", "ordinal": 0, "node": node,
			"phase": "Running", "ready": true, "podIP": ip, "specHash": "0123abcd"}
	}
	if fakeAPI {
		tlsCert := tls.Certificate{Certificate: [][]byte{ownCert, ca.Raw}, PrivateKey: key}
		return serveFakeAPI(c, clock, key, tlsCert, name, bind, serveBlobs, poison, status, replica)
	}
	recs := []crdt.Record{
		// Route hijack: a subnet outside --cluster-cidr.
		{Key: "node/cluster/" + name, Value: status(name, "8.8.8.0/24"), Origin: name},
		// Rule injection through a podIP, under a second name.
		{Key: "node/cluster/" + name + "-b", Value: status(name+"-b", "10.22.99.0/24",
			replica(name+"-b", "10.22.99.9\n-A POSTROUTING -j ACCEPT")), Origin: name + "-b"},
		// A foreign address as podIP (the writer's own LAN address).
		{Key: "node/cluster/" + name + "-c", Value: status(name+"-c", "10.22.98.0/24", replica(name+"-c", bind)), Origin: name + "-c"},
		// Another node's /24, claimed under a name of its own, backdated
		// (claim time 1 ns after the epoch) to beat the victim's claim.
		{Key: "node/cluster/" + name + "-d", Value: status(name+"-d", victimSubnet), Origin: name + "-d"},
		// Another node's status record, as written by this one.
		{Key: "node/cluster/" + victim, Value: status(victim, "10.22.97.0/24"), Origin: name},

		// A Service that does not validate (injection in its name).
		{Key: "service/default/x", Value: []byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"x\n-A INPUT -j ACCEPT"},"spec":{"ports":[{"port":80}]}}`), Origin: name},
	}
	unsigned := crdt.Record{Key: "deployment/default/unsigned", Origin: name,
		Value: []byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"unsigned"},"spec":{"replicas":1,"selector":{"matchLabels":{"app":"u"}},"template":{"metadata":{"labels":{"app":"u"}},"spec":{"containers":[{"name":"c","image":"starling.local/echo:v1"}]}}}}`)}
	sign := func(r crdt.Record) crdt.Record {
		k := key
		if ik, ok := keys[r.Origin]; ok {
			k = ik
		}
		s, err := crdt.Sign(r, k)
		if err != nil {
			panic(err)
		}
		return s
	}
	// A Deployment from two hours in the future.
	future := crdt.Record{Key: "deployment/default/future", Origin: name,
		Value:   []byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"future"},"spec":{"replicas":1,"selector":{"matchLabels":{"app":"f"}},"template":{"metadata":{"labels":{"app":"f"}},"spec":{"containers":[{"name":"c","image":"starling.local/echo:v1"}]}}}}`),
		Version: hlc.Timestamp{Wall: time.Now().Add(2 * time.Hour).UnixNano()}}
	// Another node's status record, forged under its name. It shares its
	// key with the one written as itself, so the two take turns (a key
	// has one value at a time).
	forged := crdt.Record{Key: "node/cluster/" + victim, Value: status(victim, "10.22.96.0/24"), Origin: victim}
	round := 0
	publish := func() {
		for _, r := range recs {
			if round%2 == 1 && r.Key == forged.Key {
				r = forged
			}
			r.Version = clock.Now()
			c.Publish(sign(r))
		}
		unsigned.Version = clock.Now()
		c.Publish(unsigned)
		// Again each round: one broadcast can be missed.
		future.Version = hlc.Timestamp{Wall: time.Now().Add(2 * time.Hour).UnixNano()}
		c.Publish(sign(future))
		round++
	}
	publish()
	fmt.Println("published", len(recs)+2, "hostile records")
	for {
		// Rewrite every 2 s, as the attacker did (every 3 s), until killed.
		time.Sleep(2 * time.Second)
		publish()
	}
}

// serveFakeAPI joins as a well-formed node that advertises an API and a
// replica, so honest nodes send it log and image requests, on its TCP API
// port and on its peer port (7947, TLS with its node certificate); it
// prints each request's method, URI, Authorization header (the
// operator's token must never be among them) and client certificate,
// answers image blob requests from serveBlobs (the blobs it holds, named
// by digest) and with the file poison for any other digest (content
// under a digest it does not have), and everything else with 404.
func serveFakeAPI(c *gossip.Cluster, clock *hlc.Clock, key ed25519.PrivateKey, cert tls.Certificate, name, bind, serveBlobs, poison string,
	status func(string, string, ...map[string]any) []byte, replica func(string, string) map[string]any) error {
	var st map[string]any
	json.Unmarshal(status(name, "10.22.50.0/24", replica(name, "10.22.50.7")), &st)
	st["api"] = "http://" + bind + ":7443"
	st["replicas"].([]any)[0].(map[string]any)["name"] = "ghost-0"
	st["replicas"].([]any)[0].(map[string]any)["workload"] = "ghost"
	value, _ := json.Marshal(st)
	r, err := crdt.Sign(crdt.Record{Key: "node/cluster/" + name, Value: value, Version: clock.Now(), Origin: name}, key)
	if err != nil {
		return err
	}
	if err := c.Publish(r); err != nil {
		return err
	}
	fmt.Println("published a valid status with an API at", st["api"])
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client := ""
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			client = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		fmt.Printf("request %s %s auth=%q client=%q\n", r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), client)
		if d, ok := strings.CutPrefix(r.URL.Path, "/v1/images/blobs/"); ok && serveBlobs != "" {
			if held := filepath.Join(serveBlobs, filepath.Base(d)); d == filepath.Base(d) && fileExists(held) {
				http.ServeFile(w, r, held)
				return
			}
			http.ServeFile(w, r, poison)
			return
		}
		http.NotFound(w, r)
	})
	peer := &http.Server{Addr: bind + ":7947", Handler: handler,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert}}
	errc := make(chan error, 2)
	go func() { errc <- peer.ListenAndServeTLS("", "") }()
	go func() { errc <- http.ListenAndServe(bind+":7443", handler) }()
	return <-errc
}

// runStranger holds nothing: it joins gossip with no key and asks the
// seed's join endpoint (the gossip port + 1) to admit it with a made-up
// token, accepting any certificate (it has no pin). It prints what each
// attempt gave and exits.
func runStranger(name, bind, join string) error {
	cfg := gossip.DefaultConfig()
	cfg.Name, cfg.BindAddr, cfg.BindPort = name, bind, 7946
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := gossip.New(cfg, gossip.NewMemState())
	if err != nil {
		return err
	}
	n, err := c.Join([]string{join})
	fmt.Printf("gossip join in the clear: %d joined, err=%v\n", n, err)
	c.Shutdown()
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(map[string]any{"name": name, "key": []byte(pub), "tokenID": "abcdef", "secret": "0123456789abcdef"})
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec
	resp, err := client.Post("https://"+join+":7947/v1/join", "application/json", bytes.NewReader(body))
	if err != nil {
		fmt.Println("join with a made-up token: err", err)
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	fmt.Printf("join with a made-up token: status %d: %s\n", resp.StatusCode, strings.TrimSpace(string(b)))
	// The node-to-node routes of the same port want a node certificate.
	resp, err = client.Get("https://" + join + ":7947/v1/images/blobs/sha256:" + strings.Repeat("0", 64))
	if err != nil {
		fmt.Println("image blob without a node certificate: err", err)
		return nil
	}
	resp.Body.Close()
	fmt.Printf("image blob without a node certificate: status %d\n", resp.StatusCode)
	return nil
}

// runForgotten: see --forgotten. join is the seed's IP (gossip port 7946,
// peer port 7947).
func runForgotten(name, bind, dataDir, join string) error {
	keys, ca, caKey, nodeKey, err := trust.LoadClusterSecrets(dataDir)
	if err != nil {
		return err
	}
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		return err
	}
	with := "the kept CA key"
	if caKey == nil {
		// No CA key: a CA certificate of its own, with the cluster CA's
		// name and its node key.
		tmpl := *ca
		tmpl.PublicKey = nodeKey.Public()
		der, err := x509.CreateCertificate(nil, &tmpl, &tmpl, nodeKey.Public(), nodeKey)
		if err != nil {
			return err
		}
		if ca, err = x509.ParseCertificate(der); err != nil {
			return err
		}
		caKey, with = nodeKey, "its own node key posing as the CA (it holds no CA key)"
	}
	cert, err := trust.IssueNodeCert(ca, caKey, name, pub)
	if err != nil {
		return err
	}
	fmt.Println("minted a certificate for", name, "with", with)
	// Join as a new node with the minted certificate as an invitation.
	// Signed for the member it asks, as a real joiner's would be.
	server := ""
	if conn, err := tls.Dial("tcp", join+":7947", &tls.Config{InsecureSkipVerify: true}); err == nil { //nolint:gosec // only the member's pin is read
		sum := sha256.Sum256(conn.ConnectionState().PeerCertificates[0].RawSubjectPublicKeyInfo)
		server = hex.EncodeToString(sum[:])
		conn.Close()
	}
	body, _ := json.Marshal(trust.SignJoinRequest(name, key, cert, server, time.Now()))
	anyServer := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the answer is what is tested
	resp, err := anyServer.Post("https://"+join+":7947/v1/join", "application/json", bytes.NewReader(body))
	printAnswer("join with a minted invitation", "ADMITTED", resp, err)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: roots, ServerName: "n1", InsecureSkipVerify: true, //nolint:gosec // the answer is what is tested
		Certificates: []tls.Certificate{{Certificate: [][]byte{cert, ca.Raw}, PrivateKey: key}},
	}}}
	resp, err = client.Get("https://" + join + ":7947/v1/keys")
	printAnswer("gossip keys with the minted certificate", "GIVEN", resp, err)
	cfg := gossip.DefaultConfig()
	cfg.Name, cfg.BindAddr, cfg.BindPort, cfg.SecretKey, cfg.ExtraKeys = name, bind, 7946, keys[0], keys[1:]
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := gossip.New(cfg, gossip.NewMemState())
	if err != nil {
		return err
	}
	defer c.Shutdown()
	n, err := c.Join([]string{join})
	if err != nil || n == 0 {
		fmt.Printf("gossip join with the kept keys: refused (%d joined, err=%v)\n", n, err)
		return nil
	}
	fmt.Println("gossip join with the kept keys: JOINED")
	clock := hlc.New(nil)
	v, _ := json.Marshal(map[string]any{"name": name, "advertise": bind, "podSubnet": "10.22.77.0/24",
		"subnetSince": clock.Now(), "subnetReady": true, "capacity": map[string]any{"milliCPU": 1000, "memoryBytes": 1 << 30},
		"started": time.Now().UTC(), "cert": cert})
	r, err := crdt.Sign(crdt.Record{Key: "node/cluster/" + name, Value: v, Version: clock.Now(), Origin: name}, key)
	if err != nil {
		return err
	}
	for i := 0; i < 5; i++ {
		c.Publish(r)
		time.Sleep(2 * time.Second)
	}
	fmt.Println("published a status for", name)
	return nil
}

// runImpostor: see --impostor.
func runImpostor(victim, with, bind, secretsFrom, tokenFile, dataDir, join, serveAddr string) error {
	var gossipKeys [][]byte
	var key ed25519.PrivateKey
	var status *crdt.Record
	switch with {
	case "gossip-key":
		keys, _, _, _, err := trust.LoadClusterSecrets(secretsFrom)
		if err != nil {
			return err
		}
		gossipKeys = keys
	case "token":
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		k, gk, _, _, err := trust.JoinCluster(ctx, dataDir, victim+"-imp", tokenFile, join)
		cancel()
		if err != nil {
			return err
		}
		fmt.Println("admitted with the invitation as", victim+"-imp")
		key, gossipKeys = k, [][]byte{gk}
	case "cert":
		keys, ca, caKey, _, err := trust.LoadClusterSecrets(secretsFrom)
		if err != nil {
			return err
		}
		if caKey == nil {
			return fmt.Errorf("--secrets-from %s holds no CA key", secretsFrom)
		}
		pub, k, err := ed25519.GenerateKey(nil)
		if err != nil {
			return err
		}
		cert, err := trust.IssueNodeCert(ca, caKey, victim, pub)
		if err != nil {
			return err
		}
		fmt.Println("minted a certificate for", victim, "with the copied CA key")
		v, _ := json.Marshal(map[string]any{"name": victim, "advertise": bind + ":7946", "podSubnet": "10.22.76.0/24",
			"subnetSince": map[string]any{"wall": 1}, "subnetReady": true, "capacity": map[string]any{"milliCPU": 64000, "memoryBytes": 1 << 40},
			"started": time.Now().UTC(), "memberSig": true, "cert": cert})
		r, err := crdt.Sign(crdt.Record{Key: "node/cluster/" + victim, Value: v, Version: hlc.New(nil).Now(), Origin: victim}, k)
		if err != nil {
			return err
		}
		key, gossipKeys, status = k, keys, &r
	default:
		return fmt.Errorf("--with %q: want gossip-key, token or cert", with)
	}
	// Member metadata as node/member lays it out: version 2 with
	// no key, or version 3 signed with the impostor's own key over the
	// victim's name and its own address (what it can sign).
	now := time.Now().UnixNano()
	meta := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte{2}, 1), uint64(now))
	if key != nil {
		ip, err := netip.ParseAddr(bind)
		if err != nil {
			return err
		}
		a16 := ip.As16()
		signed := append(append([]byte("starling member v3\x00"+victim+"\x00"), a16[:]...), 0x1f, 0x0a) // port 7946
		signed = append(signed, meta[1:17]...)
		meta[0] = 3
		meta = append(meta, ed25519.Sign(key, signed)...)
	}
	if serveAddr != "" {
		srv := &http.Server{Addr: serveAddr, ReadHeaderTimeout: 5 * time.Second,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "impostor") })}
		go srv.ListenAndServe()
	}
	cfg := gossip.DefaultConfig()
	cfg.Name, cfg.BindAddr, cfg.BindPort, cfg.SecretKey, cfg.ExtraKeys, cfg.Meta = victim, bind, 7946, gossipKeys[0], gossipKeys[1:], meta
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := gossip.New(cfg, gossip.NewMemState())
	if err != nil {
		return err
	}
	defer c.Shutdown()
	fmt.Println("posing as", victim, "with", with)
	for {
		// The victim alive makes Join report the name taken; the alive
		// message went out with the push/pull all the same.
		c.Join([]string{join})
		if status != nil {
			c.Publish(*status)
		}
		time.Sleep(2 * time.Second)
	}
}

// printAnswer prints what an HTTP request for what got: its error, ok
// for 200 OK, else the status and the start of the body.
func printAnswer(what, ok string, resp *http.Response, err error) {
	if err != nil {
		fmt.Println(what+": err", err)
		return
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		fmt.Println(what + ": " + ok)
	} else {
		fmt.Printf("%s: status %d: %s\n", what, resp.StatusCode, strings.TrimSpace(string(b)))
	}
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
