// Package trust holds a node's identity and the cluster's credentials:
// the node's Ed25519 key and the name it is bound to (Identity, with
// revocations by 'starling node forget'), the cluster CA and node
// certificates (CreateCluster, SignNodeCert, CertCache), join tokens and
// invitations (Admission, Invitation), the gossip keyring and its
// rotation (Keyring), mutual TLS between nodes (Trust) and signed peer
// requests (SignPeerRequest, VerifyPeerRequest). It reads the store
// through Records and never writes it itself: what it publishes goes
// through the publish function it is given.
package trust
