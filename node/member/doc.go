// Package member encodes, signs and checks a node's member metadata:
// the bytes memberlist gossips with every alive message (when the node
// first started, when its current run started, and its Ed25519
// signature binding the name to the address), a peer's untrusted input
// that decodes as none unless well formed.
package member
