// Package view builds the node's one view of the cluster: an immutable
// snapshot (View) of the live members, the node records, the desired
// objects decoded once, every desired replica and its owner by
// placement (rendezvous hashing with bounded loads, package placement),
// the Services' allocation and endpoints. A Builder makes the next view
// from what it is given (Config: the records, membership and its flap
// damping, the nodes left out of placement) and the previous view; it
// knows nothing of containers, rules or the API. Every loop of the
// agent and every API read takes the latest view (Builder.View) and
// wakes on the next (Builder.Changed).
package view
