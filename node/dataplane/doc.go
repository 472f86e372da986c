// Package dataplane holds the controllers that program this node's
// network namespace from the cluster view: routes to the peers' pod
// subnets (Routes, net/route), Service rules (Services, net/service,
// in the proxy mode ProxyMode chooses) and the pod masquerade rule
// (HostRules, net/podnet). Each is constructed whole from a Config of
// narrow interfaces and runs until its context ends (Run); none knows
// of containers or of the agent.
package dataplane
