package reconcile

import "fmt"

// A ReadWriteOncePod claim is mounted by one replica at a time, as
// Kubernetes holds a pod that would be its second user in Pending: a
// replica that mounts one waits, with a reason naming the user, while
// another replica's container on the node exists (running or not, until
// it is removed) or another create of this pass took it first.

// claimUsers maps each claim (namespace/name) mounted by a container of
// observed, on its way out or not, to the replica that mounts it (as the
// container records its claims; for one that does not, as its replica
// in all says, if it is there).
func claimUsers(observed []Container, all []Replica) map[string]Replica {
	byID := make(map[string]*Replica, len(all))
	for i := range all {
		byID[all[i].ID] = &all[i]
	}
	users := map[string]Replica{}
	for _, c := range observed {
		user := Replica{ID: c.ID, Name: c.Name, Namespace: c.Namespace}
		keys := c.Claims
		if r := byID[c.ID]; r != nil && keys == nil {
			keys = claimKeys(*r)
		}
		for _, key := range keys {
			users[key] = user
		}
	}
	return users
}

// ClaimKeys are the claims r mounts, as namespace/name.
func ClaimKeys(r Replica) []string { return claimKeys(r) }

// claimKeys are the claims r mounts, as namespace/name.
func claimKeys(r Replica) []string {
	var keys []string
	for _, v := range r.Spec.Volumes {
		if name := v.ClaimName(r); name != "" {
			keys = append(keys, r.Namespace+"/"+name)
		}
	}
	return keys
}

// oncePodWait is why replica r may not mount its ReadWriteOncePod claims
// (oncePod, by namespace/name) now, or nil: another replica (not r, not
// the copy replaced, replacing) uses one of them (users), which then
// holds it for r.
func oncePodWait(r Replica, replacing string, oncePod map[string]bool, users map[string]Replica) error {
	for _, key := range claimKeys(r) {
		if !oncePod[key] {
			continue
		}
		if u, ok := users[key]; ok && u.ID != r.ID && u.ID != replacing {
			return &ClaimWait{fmt.Sprintf("persistentvolumeclaim %q is ReadWriteOncePod and replica %s uses it", key[len(r.Namespace)+1:], u.Name)}
		}
		users[key] = r
	}
	return nil
}
