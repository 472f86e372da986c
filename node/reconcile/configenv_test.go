package reconcile

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

type fakeConfig struct {
	maps    map[string]map[string]string
	binary  map[string]map[string][]byte
	secrets map[string]map[string][]byte
}

func (f fakeConfig) ConfigMap(ns, name string) (map[string]string, map[string][]byte, bool) {
	d, ok := f.maps[ns+"/"+name]
	return d, f.binary[ns+"/"+name], ok
}

func (f fakeConfig) Secret(ns, name string) (map[string][]byte, bool) {
	d, ok := f.secrets[ns+"/"+name]
	return d, ok
}

// TestResolveEnvAsTheKubelet: envFrom's variables first (prefixed, keys
// in order), env's after and winning; values
// from objects taken as they are ($(X) not expanded); optional misses
// left out; a missing object or key names it as the kubelet does.
func TestResolveEnvAsTheKubelet(t *testing.T) {
	src := fakeConfig{
		maps:    map[string]map[string]string{"ns/app": {"MODE": "fast", "REF": "$(MODE)"}},
		secrets: map[string]map[string][]byte{"ns/db": {"password": []byte("s3cr3t")}},
	}
	s := Spec{
		EnvFrom: []EnvFrom{{ConfigMap: "app", Prefix: "APP_"}, {Secret: "gone", Optional: true}},
		Env: []EnvVar{
			{Name: "PASSWORD", Secret: "db", Key: "password"},
			{Name: "APP_MODE", ConfigMap: "app", Key: "MODE"},
			{Name: "MAYBE", ConfigMap: "app", Key: "nope", Optional: true},
			{Name: "GREETING", Value: "hi $(PASSWORD)"},
			{Name: "IP", FieldPath: "status.podIP"},
		},
	}
	got, err := ResolveEnv(s, "ns", src)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range got {
		b.WriteString(e.Name + "=" + e.Value + "|" + e.FieldPath + ";")
		if want := e.Name != "GREETING" && e.Name != "IP"; e.Literal != want {
			t.Errorf("%s: Literal %v, want %v", e.Name, e.Literal, want)
		}
	}
	want := "APP_MODE=fast|;APP_REF=$(MODE)|;PASSWORD=s3cr3t|;APP_MODE=fast|;GREETING=hi $(PASSWORD)|;IP=|status.podIP;"
	if b.String() != want {
		t.Fatalf("got  %s\nwant %s", b.String(), want)
	}
	for _, c := range []struct {
		spec Spec
		want string
	}{
		{Spec{Env: []EnvVar{{Name: "A", ConfigMap: "none", Key: "k"}}}, `configmap "none" not found`},
		{Spec{Env: []EnvVar{{Name: "A", ConfigMap: "app", Key: "k"}}}, `couldn't find key k in ConfigMap ns/app`},
		{Spec{Env: []EnvVar{{Name: "A", Secret: "none", Key: "k"}}}, `secret "none" not found`},
		{Spec{Env: []EnvVar{{Name: "A", Secret: "db", Key: "user"}}}, `couldn't find key user in Secret ns/db`},
		{Spec{EnvFrom: []EnvFrom{{Secret: "none"}}}, `secret "none" not found`},
	} {
		if _, err := ResolveEnv(c.spec, "ns", src); err == nil || err.Error() != c.want {
			t.Errorf("%+v: %v, want %q", c.spec, err, c.want)
		}
	}
}

// TestDecideHoldsBackACreateUntilItsConfigIsThere: a replica whose
// Secret is missing gets no create and a ConfigError; once the Secret is
// there, the create carries the value.
func TestDecideHoldsBackACreateUntilItsConfigIsThere(t *testing.T) {
	rep := Replica{ID: "ns_web-1", Name: "web-1", Namespace: "ns", Workload: "web", SpecHash: "abcdef12",
		Spec: Spec{Image: "x", Env: []EnvVar{{Name: "P", Secret: "db", Key: "password"}}}}
	d := Decision{Ownership: Ownership{Self: "n1", All: []Replica{rep}, Owner: func(string) string { return "n1" }}, Fencing: Fencing{Unknown: true}}
	out := Decide(d, time.Now())
	if len(out.Actions) != 0 || fmt.Sprint(out.ConfigErrors[rep.ID]) != `secret "db" not found` || len(out.Mine) != 1 {
		t.Fatalf("without the Secret: %d actions, errors %v, mine %d", len(out.Actions), out.ConfigErrors, len(out.Mine))
	}
	d.Config = fakeConfig{secrets: map[string]map[string][]byte{"ns/db": {"password": []byte("pw")}}}
	d.HostIP = "192.0.2.7"
	out = Decide(d, time.Now())
	if len(out.Actions) != 1 || out.Actions[0].Type != Create || len(out.ConfigErrors) != 0 {
		t.Fatalf("with the Secret: %+v %v", out.Actions, out.ConfigErrors)
	}
	a := out.Actions[0].Replica
	if len(a.Spec.Env) != 1 || a.Spec.Env[0].Value != "pw" || !a.Spec.Env[0].Literal || a.HostIP != "192.0.2.7" {
		t.Fatalf("create: %+v host %q", a.Spec.Env, a.HostIP)
	}
	if rep.Spec.Env[0].Value != "" {
		t.Fatal("Decide changed the replica it was given")
	}
}

// TestDecideStartsAReplicaOnItsClaimOnlyWhereItsVolumeIs: a replica that
// mounts a claim waits (a *ClaimWait, no create) until the claim's
// volume is ready on this node; the create then carries the volume's ID,
// and the replica the view holds is not changed.
func TestDecideStartsAReplicaOnItsClaimOnlyWhereItsVolumeIs(t *testing.T) {
	vols := []Volume{{Name: "cache", EmptyDir: true}, {Name: "data", Claim: "db-data"}}
	rep := Replica{ID: "ns_db-1", Name: "db-1", Namespace: "ns", Workload: "db", SpecHash: "abcdef12", Spec: Spec{Image: "x", Volumes: vols}}
	d := Decision{Ownership: Ownership{Self: "n1", All: []Replica{rep}, Owner: func(string) string { return "n1" }}, Fencing: Fencing{Unknown: true}}
	out := Decide(d, time.Now())
	var wait *ClaimWait
	if len(out.Actions) != 0 || !errors.As(out.ConfigErrors[rep.ID], &wait) {
		t.Fatalf("no claim held: %+v %v", out.Actions, out.ConfigErrors)
	}
	d.Claims = func(ns, name string) (string, error) {
		return "", &ClaimWait{fmt.Sprintf("the volume of persistentvolumeclaim %q is on node n2", name)}
	}
	out = Decide(d, time.Now())
	if len(out.Actions) != 0 || !strings.Contains(fmt.Sprint(out.ConfigErrors[rep.ID]), "node n2") {
		t.Fatalf("volume elsewhere: %+v %v", out.Actions, out.ConfigErrors)
	}
	d.Claims = func(ns, name string) (string, error) {
		if ns != "ns" || name != "db-data" {
			return "", &ClaimWait{"wrong claim"}
		}
		return "uid-1", nil
	}
	out = Decide(d, time.Now())
	if len(out.Actions) != 1 || out.Actions[0].Replica.Spec.Volumes[1].ClaimID != "uid-1" {
		t.Fatalf("volume here: %+v %v", out.Actions, out.ConfigErrors)
	}
	if vols[1].ClaimID != "" {
		t.Fatal("the view's replica was changed")
	}
}

// TestResourceFieldRefTakesTheNodesAllocatableForAnUnsetLimit: a
// resourceFieldRef of a limit the container does not set is the node's
// allocatable, divided and rounded up as the kubelet does.
func TestResourceFieldRefTakesTheNodesAllocatableForAnUnsetLimit(t *testing.T) {
	env := []EnvVar{{Name: "CPUS", Resource: "limits.cpu", DivisorMilli: 1000}, {Name: "MEM_MI", Resource: "limits.memory", DivisorMilli: 1 << 20 * 1000}, {Name: "X", Value: "$(CPUS)"}}
	rep := Replica{ID: "ns_app-1", Name: "app-1", Namespace: "ns", Workload: "app", SpecHash: "abcdef12", Spec: Spec{Image: "x", Env: env}}
	d := Decision{Ownership: Ownership{Self: "n1", All: []Replica{rep}, Owner: func(string) string { return "n1" }}, Fencing: Fencing{Unknown: true},
		Allocatable: Allocatable{MilliCPU: 2500, MemoryBytes: 3<<30 + 1}}
	out := Decide(d, time.Now())
	if len(out.Actions) != 1 {
		t.Fatalf("actions: %+v %v", out.Actions, out.ConfigErrors)
	}
	got := map[string]string{}
	for _, e := range out.Actions[0].Replica.Spec.Env {
		got[e.Name] = e.Value
	}
	if got["CPUS"] != "3" || got["MEM_MI"] != "3073" {
		t.Fatalf("env %v, want CPUS=3 (2.5 rounded up) and MEM_MI=3073", got)
	}
	if env[0].Value != "" {
		t.Fatal("the view's env was changed")
	}
	if ResourceValue(250, 1) != "250" || ResourceValue(128<<20*1000, 1<<20*1000) != "128" {
		t.Fatal("ResourceValue")
	}
}
