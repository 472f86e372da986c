package reconcile

import (
	"testing"
	"time"
)

// podReplica is a replica with two init containers (the second a native
// sidecar) and two app containers: web (its own) and log.
func podReplica() Replica {
	return NewReplica("default", "web", "aaaaaaaa", "", 0, Spec{Name: "web", Image: "web",
		Init: []Spec{
			{Name: "migrate", Image: "tool"},
			{Name: "proxy", Image: "proxy", Sidecar: true},
		},
		Containers: []Spec{{Name: "log", Image: "tool"}},
	})
}

// member is r's container name in state st, started an hour ago.
func member(r Replica, name string, st State, exit uint32) Container {
	c := Container{ID: MemberID(r.ID, name), Name: r.Name, Namespace: r.Namespace, Workload: r.Workload,
		SpecHash: r.SpecHash, ContainerName: name, State: st, StartedAt: t0.Add(-time.Hour), PodIP: "10.22.1.2"}
	if st == StateExited {
		c.ExitCode, c.ExitedAt = exit, t0.Add(-time.Minute)
	}
	return c
}

// created is r's own container made by its create, its task never
// started (init containers go first).
func created(r Replica, members ...Container) Container {
	c := running(r)
	c.ContainerName, c.State, c.StartedAt, c.Members = "web", StateCreated, time.Time{}, members
	return c
}

func TestPlanRunsInitContainersInOrderThenTheApp(t *testing.T) {
	r := podReplica()
	id := func(name string) string { return MemberID(r.ID, name) }
	cases := []struct {
		name    string
		c       Container
		want    string
		requeue time.Duration
	}{
		{name: "the first init container is added first, alone", c: created(r),
			want: "add-container:" + id("migrate")},
		{name: "a running init container holds the rest back", c: created(r, member(r, "migrate", StateRunning, 0))},
		{name: "an init container that exited 0 lets the next (a sidecar) start",
			c:    created(r, member(r, "migrate", StateExited, 0)),
			want: "add-container:" + id("proxy")},
		{name: "a failed init container restarts, the rest wait",
			c:    created(r, member(r, "migrate", StateExited, 1)),
			want: "start:" + id("migrate")},
		{name: "a failed init container waits out its backoff",
			c: created(r, with(member(r, "migrate", StateExited, 1), func(c *Container) {
				c.BackoffStep, c.StartedAt, c.ExitedAt = 1, t0.Add(-5*time.Second), t0.Add(-4*time.Second)
			})),
			requeue: 6 * time.Second},
		{name: "a sidecar that is only created is started, the app waits",
			c:    created(r, member(r, "migrate", StateExited, 0), member(r, "proxy", StateCreated, 0)),
			want: "start:" + id("proxy")},
		{name: "with the sidecar running, the app containers start together",
			c:    created(r, member(r, "migrate", StateExited, 0), member(r, "proxy", StateRunning, 0)),
			want: "start:" + r.ID + " add-container:" + id("log")},
		{name: "a running pod is left alone",
			c: with(running(r), func(c *Container) {
				c.Members = []Container{member(r, "migrate", StateExited, 0), member(r, "proxy", StateRunning, 0), member(r, "log", StateRunning, 0)}
			})},
		{name: "once initialized, init containers do not run again and a crashed sidecar restarts beside the app",
			c: with(running(r), func(c *Container) {
				c.Members = []Container{member(r, "proxy", StateExited, 2), member(r, "log", StateRunning, 0)}
			}),
			want: "start:" + id("proxy")},
		{name: "each app container restarts on its own",
			c: with(running(r), func(c *Container) {
				c.Members = []Container{member(r, "migrate", StateExited, 0), member(r, "proxy", StateRunning, 0), member(r, "log", StateExited, 137)}
			}),
			want: "start:" + id("log")},
		{name: "a member of another copy (a replace raced its add) goes, and its container is added anew",
			c: with(running(r), func(c *Container) {
				c.Members = []Container{member(r, "migrate", StateExited, 0), with(member(r, "proxy", StateRunning, 0), func(m *Container) { m.PodIP = "10.22.1.9" }), member(r, "log", StateRunning, 0)}
			}),
			want: "remove:" + id("proxy") + " add-container:" + id("proxy")},
		{name: "a replica whose state containerd does not know is left alone", c: with(created(r), func(c *Container) { c.State = StateUnknown })},
		{name: "a container whose probe failed is stopped, alone",
			c: with(running(r), func(c *Container) {
				c.Members = []Container{member(r, "migrate", StateExited, 0), with(member(r, "proxy", StateRunning, 0), func(m *Container) { m.Unhealthy = "liveness probe failed" }), member(r, "log", StateRunning, 0)}
			}),
			want: "stop:" + id("proxy")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := Plan([]Replica{r}, []Container{tc.c}, t0)
			if got := summary(res.Actions); got != tc.want {
				t.Errorf("actions = %q, want %q", got, tc.want)
			}
			if res.Requeue != tc.requeue {
				t.Errorf("requeue = %v, want %v", res.Requeue, tc.requeue)
			}
			for _, a := range res.Actions {
				if a.Old.ID != r.ID && a.Member == "" && a.Type != Remove {
					t.Errorf("%s on %s does not name its container", a.Type, a.Old.ID)
				}
			}
		})
	}
}

func TestMemberActionsKeepTheirOwnIDs(t *testing.T) {
	r := podReplica()
	res := Plan([]Replica{r}, []Container{created(r, member(r, "migrate", StateExited, 0))}, t0)
	if len(res.Actions) != 1 || res.Actions[0].Old.ID != r.ID || res.Actions[0].Member != "proxy" {
		t.Fatalf("actions = %+v, want one AddContainer of proxy in %s's sandbox", res.Actions, r.ID)
	}
	// A removal removes the replica's container, whose removal takes its
	// members with it: a member alone (its replica gone) is removed too.
	res = Plan(nil, []Container{member(r, "log", StateRunning, 0)}, t0)
	if got, want := summary(res.Actions), "remove:"+MemberID(r.ID, "log"); got != want {
		t.Errorf("actions = %q, want %q", got, want)
	}
}

func TestDecideResolvesEveryContainersEnvironment(t *testing.T) {
	r := podReplica()
	r.Spec.Init = []Spec{{Name: "migrate", Env: []EnvVar{{Name: "PASSWORD", Secret: "db", Key: "password"}}}}
	out := decideWith(fakeConfig{secrets: map[string]map[string][]byte{"default/db": {"password": []byte("s3cret")}}}, r, created(r))
	if len(out.Actions) != 1 || out.Actions[0].Type != AddContainer {
		t.Fatalf("actions = %+v, want one AddContainer", out.Actions)
	}
	if got := out.Actions[0].Replica.Spec.Init[0].Env; len(got) != 1 || got[0].Value != "s3cret" {
		t.Errorf("the init container's env = %+v, want PASSWORD resolved", got)
	}
	if r.Spec.Init[0].Env[0].Value != "" {
		t.Error("the view's Spec was changed")
	}
	out = decideWith(fakeConfig{}, r, created(r))
	if len(out.Actions) != 0 || out.ConfigErrors[r.ID] == nil {
		t.Errorf("without the Secret: actions %+v, config errors %v; want none and one", out.Actions, out.ConfigErrors)
	}
}

// decideWith runs Decide for node "a", which owns r and observes c,
// with the ConfigMaps and Secrets of src.
func decideWith(src ConfigData, r Replica, c Container) Output {
	in := decision([]Replica{r}, nil, []Container{c}, Fencing{Quorum: true})
	in.Config = src
	return Decide(in, t0)
}

// TestStatusOfAPodSumsItsContainersUp: READY counts the app containers
// and sidecars, a completed init container is Terminated, the
// containers not made yet wait, restarts add up, and an init container
// in backoff is named.
func TestStatusOfAPodSumsItsContainersUp(t *testing.T) {
	r := podReplica()
	ready := func(c Container) (bool, string) { return c.ContainerName != "log", "readiness probe failed" }
	running := with(running(r), func(c *Container) {
		c.ContainerName, c.Restarts = "web", 1
		c.Members = []Container{member(r, "migrate", StateExited, 0), member(r, "proxy", StateRunning, 0), with(member(r, "log", StateRunning, 0), func(m *Container) { m.Restarts = 2 })}
		c.Members[0].Init, c.Members[1].Sidecar = true, true
	})
	st := StatusOf(running, &r.Spec, ready, t0)
	if st.Ready != 2 || st.Total != 3 || st.Restarts != 3 || st.Init {
		t.Errorf("ready %d/%d, restarts %d, init %v; want 2/3 (log unready), 3, false", st.Ready, st.Total, st.Restarts, st.Init)
	}
	if len(st.Containers) != 4 || st.Containers[0].Name != "migrate" || st.Containers[0].State != "Terminated" || st.Containers[0].Reason != "Completed" {
		t.Errorf("containers %+v, want the completed init container first", st.Containers)
	}
	failing := created(r, with(member(r, "migrate", StateExited, 3), func(m *Container) { m.Init, m.BackoffStep, m.ExitedAt = true, 2, t0.Add(-time.Second) }))
	st = StatusOf(failing, &r.Spec, ready, t0)
	if !st.Init || st.Failed != "init container migrate: Error (exit 3)" {
		t.Errorf("init %v, failed %q; want the init container named", st.Init, st.Failed)
	}
	failing.Members[0].Restarts = 4
	if st := StatusOf(failing, &r.Spec, ready, t0); st.Restarts != 4 {
		t.Errorf("restarts while initializing: %d, want the init container's 4", st.Restarts)
	}
	names := ""
	for _, cs := range st.Containers {
		names += cs.Name + ":" + cs.State + " "
	}
	if names != "migrate:Waiting proxy:Waiting web:Waiting log:Waiting " {
		t.Errorf("containers %q, want every one waiting, the init containers first", names)
	}
	if one := StatusOf(Container{ID: "a", State: StateRunning}, &Spec{}, ready, t0); one.Containers != nil || one.Total != 1 {
		t.Errorf("a replica of one container: %+v, want no container list", one)
	}
}

// TestAContainersReasonIsWhatPeersAccept: a probe's output with control
// characters (colours) is published as one line of plain text; a peer
// that refused it would drop the node's whole record.
func TestAContainersReasonIsWhatPeersAccept(t *testing.T) {
	r := podReplica()
	ready := func(Container) (bool, string) { return false, "\x1b[31mFAIL\x1b[0m\nsecond line" }
	c := with(running(r), func(c *Container) {
		c.ContainerName = "web"
		c.Members = []Container{with(member(r, "log", StateExited, 1), func(m *Container) { m.StopReason = "liveness probe failed: \x07bell" })}
	})
	for _, cs := range StatusOf(c, &r.Spec, ready, t0).Containers {
		if err := cs.Check(); err != nil {
			t.Errorf("container %s: a peer would refuse it: %v", cs.Name, err)
		}
	}
}
