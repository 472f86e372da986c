package trust

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The cluster credentials in a node's data dir (0600 files).

// Credential files.

func WritePEM(path, typ string, der []byte) error {
	return WritePrivate(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

// WritePrivate writes a file readable by its owner only, atomically: a
// new temporary file (O_EXCL, mode 0600) in the same directory, synced,
// then renamed over path.
func WritePrivate(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// WritePrivateFile is WritePrivate for the CLI (client configs).
func WritePrivateFile(path string, b []byte) error { return WritePrivate(path, b) }

// saveCredentials writes creds into DataDir (ca.key only when creds
// hold the CA key).
func saveCredentials(dataDir string, creds *Credentials) error {
	if creds.CAKey != nil {
		if err := saveCA(dataDir, creds.CA, creds.CAKey); err != nil {
			return err
		}
	} else if err := WritePEM(filepath.Join(dataDir, CaCertFile), "CERTIFICATE", creds.CA.Raw); err != nil {
		return fmt.Errorf("write %s: %w", CaCertFile, err)
	}
	if err := WritePEM(filepath.Join(dataDir, NodeCertFile), "CERTIFICATE", creds.NodeCert.Raw); err != nil {
		return fmt.Errorf("write %s: %w", NodeCertFile, err)
	}
	return saveGossipKeys(dataDir, creds.GossipKeys)
}

// saveCA writes the CA certificate and key into dir.
func saveCA(dir string, ca *x509.Certificate, key ed25519.PrivateKey) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := WritePEM(filepath.Join(dir, CaCertFile), "CERTIFICATE", ca.Raw); err != nil {
		return fmt.Errorf("write %s: %w", CaCertFile, err)
	}
	if err := WritePEM(filepath.Join(dir, CaKeyFile), "PRIVATE KEY", keyDER); err != nil {
		return fmt.Errorf("write %s: %w", CaKeyFile, err)
	}
	return nil
}

// loadCA reads the CA certificate and key in dir, checking that they
// match.
func loadCA(dir string) (*x509.Certificate, ed25519.PrivateKey, error) {
	certPEM, err := ReadSecretFile("CA certificate", filepath.Join(dir, CaCertFile))
	if err != nil {
		return nil, nil, err
	}
	ca, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", filepath.Join(dir, CaCertFile), err)
	}
	keyPEM, err := ReadSecretFile("CA key", filepath.Join(dir, CaKeyFile))
	if err != nil {
		return nil, nil, err
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", filepath.Join(dir, CaKeyFile), err)
	}
	if !key.Public().(ed25519.PublicKey).Equal(ca.PublicKey) {
		return nil, nil, fmt.Errorf("%s: the key is not the CA certificate's", filepath.Join(dir, CaKeyFile))
	}
	return ca, key, nil
}

// saveGossipKeys writes the gossip keys, one base64 line each, the one
// in use first.
func saveGossipKeys(dataDir string, keys [][]byte) error {
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(base64.StdEncoding.EncodeToString(k) + "\n")
	}
	return WritePrivate(filepath.Join(dataDir, GossipKeyFile), []byte(b.String()))
}

// LoadCredentials reads the credentials in DataDir. It returns
// os.ErrNotExist (wrapped) when the node has none (it never joined a
// secure cluster), and an error naming the file when one is missing,
// open to group or others, or malformed.
func LoadCredentials(dataDir string) (*Credentials, error) {
	read := func(name string) ([]byte, error) {
		return ReadSecretFile(name, filepath.Join(dataDir, name))
	}
	fail := func(name string, err error) error {
		// %v, not %w: a missing file here is damage, not "never joined".
		return fmt.Errorf("%s: %v (the node's cluster credentials are damaged; restore the file, or remove %s, %s, %s and %s from %s and join again with a new invitation)",
			filepath.Join(dataDir, name), err, CaCertFile, NodeCertFile, GossipKeyFile, NodeKeyFile, dataDir)
	}
	caPEM, err := read(CaCertFile)
	if errors.Is(err, os.ErrNotExist) {
		// Never joined, unless other credential files say otherwise.
		for _, f := range []string{NodeCertFile, GossipKeyFile} {
			if _, serr := os.Stat(filepath.Join(dataDir, f)); serr == nil {
				return nil, fail(CaCertFile, err)
			}
		}
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	creds := &Credentials{}
	if creds.CA, err = parseCertPEM(caPEM); err != nil {
		return nil, fail(CaCertFile, err)
	}
	// The CA key is held only by a first node made without 'starling
	// init' that has not moved it off yet.
	switch keyPEM, err := read(CaKeyFile); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fail(CaKeyFile, err)
	default:
		if creds.CAKey, err = parseKeyPEM(keyPEM); err != nil {
			return nil, fail(CaKeyFile, err)
		}
		if !creds.CAKey.Public().(ed25519.PublicKey).Equal(creds.CA.PublicKey) {
			return nil, fail(CaKeyFile, errors.New("the key is not the CA certificate's"))
		}
	}
	certPEM, err := read(NodeCertFile)
	if err != nil {
		return nil, fail(NodeCertFile, err)
	}
	if creds.NodeCert, err = parseCertPEM(certPEM); err != nil {
		return nil, fail(NodeCertFile, err)
	}
	gk, err := read(GossipKeyFile)
	if err != nil {
		return nil, fail(GossipKeyFile, err)
	}
	if creds.GossipKeys, err = parseGossipKeys(gk); err != nil {
		return nil, fail(GossipKeyFile, err)
	}
	return creds, nil
}

// parseGossipKeys parses a gossip key file: one or more lines of 32
// bytes in base64, the key in use first.
func parseGossipKeys(b []byte) ([][]byte, error) {
	var keys [][]byte
	for _, line := range strings.Fields(string(b)) {
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil || len(k) != 32 {
			return nil, errors.New("want lines of 32 bytes in base64, the key in use first")
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no key")
	}
	return keys, nil
}

func parseCertPEM(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

func parseKeyPEM(b []byte) (ed25519.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, errors.New("no PEM private key")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, errors.New("not an Ed25519 key")
	}
	return ek, nil
}

// MoveCAKey is 'starling ca move-off': it copies the CA certificate and
// key from DataDir into caDir (0600; a CA already there must be the same)
// and then removes the key from DataDir.
func MoveCAKey(dataDir, caDir string) error {
	ca, key, err := loadCA(dataDir)
	if err != nil {
		return fmt.Errorf("--data-dir %s: %w", dataDir, err)
	}
	if err := os.MkdirAll(caDir, 0o700); err != nil {
		return fmt.Errorf("--ca-dir %s: %w", caDir, err)
	}
	// The same directory under another name would lose the only key.
	if a, err := os.Stat(dataDir); err == nil {
		if b, err := os.Stat(caDir); err == nil && os.SameFile(a, b) {
			return fmt.Errorf("--ca-dir %s is the data dir itself: choose a directory off the node's data dir", caDir)
		}
	}
	// A CA already there must be this one (its certificate alone too).
	if b, err := os.ReadFile(filepath.Join(caDir, CaCertFile)); err == nil {
		if have, err := parseCertPEM(b); err != nil || !have.Equal(ca) {
			return fmt.Errorf("--ca-dir %s already holds another cluster's CA certificate; choose another directory", caDir)
		}
	}
	switch _, _, err := loadCA(caDir); {
	case err == nil:
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("--ca-dir %s: %w", caDir, err)
	default:
		if err := saveCA(caDir, ca, key); err != nil {
			return err
		}
	}
	if err := os.Remove(filepath.Join(dataDir, CaKeyFile)); err != nil {
		return err
	}
	return nil
}

// ReadSecretFile reads a key or token file named by flag, refusing one that
// group or others may read or write: a secret that other local users can
// read is not a secret. The error gives the chmod that fixes it.
func ReadSecretFile(flag, path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s %s: the file is accessible to group or others (mode %04o); make it private: chmod 600 %s", flag, path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return b, nil
}
