package service

import (
	"net"
	"testing"
)

// TestAHeadlessServiceGetsNoClusterIP: clusterIP None allocates nothing
// (no rules follow), and takes no address from the others.
func TestAHeadlessServiceGetsNoClusterIP(t *testing.T) {
	_, cidr, _ := net.ParseCIDR("10.23.0.0/30") // two usable addresses
	a := Allocate([]Spec{{Key: "ns/db", Headless: true}, {Key: "ns/a"}, {Key: "ns/b"}}, cidr)
	if _, ok := a.ClusterIPs["ns/db"]; ok {
		t.Fatalf("the headless Service got %v", a.ClusterIPs["ns/db"])
	}
	if len(a.ClusterIPs) != 2 {
		t.Fatalf("the other two: %v", a.ClusterIPs)
	}
}
