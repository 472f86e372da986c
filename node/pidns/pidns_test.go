package pidns

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary be the holder, as the agent's binary is.
func TestMain(m *testing.M) {
	if IsHolder(os.Args[1:]) {
		Main()
	}
	os.Exit(m.Run())
}

func TestAHolderIsPID1OfItsNamespaceAndFoundAgain(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a new PID namespace)")
	}
	dir := t.TempDir()
	pid, err := Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Stop(dir) })
	found, ok := Find(dir)
	if !ok || found != pid {
		t.Fatalf("Find = %d, %v; want %d", found, ok, pid)
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	// NSpid: its PID here, then in its own namespace: 1.
	var nspid string
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			nspid = strings.Join(strings.Fields(v), " ")
		}
	}
	if want := strconv.Itoa(pid) + " 1"; nspid != want {
		t.Errorf("NSpid %q, want %q (PID 1 of a namespace of its own)", nspid, want)
	}
	if _, ok := Find(t.TempDir()); ok {
		t.Error("found a holder for a directory that has none")
	}
	if err := Stop(dir); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := Find(dir); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder still runs 5 s after Stop")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
