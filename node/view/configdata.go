package view

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// Opener opens a sealed Secret record's value (*sealed.Box).
type Opener interface {
	Open(recordKey string, value []byte) ([]byte, error)
}

// ConfigData is the data of the ConfigMaps and Secrets a view holds, by
// namespace and name (reconcile.ConfigData): immutable, rebuilt when one
// of their records changes. Secrets are held opened, in memory only.
type ConfigData struct {
	configMaps map[[2]string]*corev1.ConfigMap
	secrets    map[[2]string]map[string][]byte
}

// ConfigMap returns the data and binaryData of ConfigMap namespace/name.
func (c *ConfigData) ConfigMap(namespace, name string) (map[string]string, map[string][]byte, bool) {
	if c == nil {
		return nil, nil, false
	}
	cm, ok := c.configMaps[[2]string{namespace, name}]
	if !ok {
		return nil, nil, false
	}
	return cm.Data, cm.BinaryData, true
}

// Secret returns the data of Secret namespace/name.
func (c *ConfigData) Secret(namespace, name string) (map[string][]byte, bool) {
	if c == nil {
		return nil, false
	}
	d, ok := c.secrets[[2]string{namespace, name}]
	return d, ok
}

// configRetryEvery is how often the view tries again a ConfigMap or
// Secret record that did not decode or open.
const configRetryEvery = 10 * time.Second

// configInto sets v.Config: prev's when no ConfigMap or Secret record
// changed, else decoded again from the store (a record that does not
// decode or open is left out, logged once per version).
func (vs *Builder) configInto(v, prev *View) error {
	// A record that did not open is tried again every
	// configRetryEvery (the key it needs may have come with a keyring
	// refresh).
	retry := len(vs.badConfig) > 0 && !v.built.Before(vs.configRetry)
	if !v.Changes.Config && prev != nil && !retry {
		v.Config = prev.Config
		return nil
	}
	vs.configRetry = v.built.Add(configRetryEvery)
	seen := map[string]bool{}
	defer func() {
		for k := range vs.badConfig {
			if !seen[k] {
				delete(vs.badConfig, k) // gone from the store
			}
		}
	}()
	c := &ConfigData{configMaps: map[[2]string]*corev1.ConfigMap{}, secrets: map[[2]string]map[string][]byte{}}
	for _, kind := range []string{manifest.KindConfigMap, manifest.KindSecret} {
		recs, err := vs.cfg.Records.List(KindPrefix(kind))
		if err != nil {
			return err
		}
		for _, r := range recs {
			if r.Deleted {
				continue
			}
			seen[r.Key] = true
			o, err := vs.decodeConfig(r)
			if err == nil {
				delete(vs.badConfig, r.Key)
			}
			if err != nil {
				if vs.badConfig[r.Key] != r.Version.String() {
					vs.badConfig[r.Key] = r.Version.String()
					vs.cfg.Log.Warn("a stored ConfigMap or Secret is left out: replicas that use it wait", "key", r.Key, "err", api.OneLine(err.Error()))
				}
				continue
			}
			if o.ConfigMap != nil {
				c.configMaps[[2]string{o.Namespace, o.Name}] = o.ConfigMap
			} else if o.Secret != nil {
				c.secrets[[2]string{o.Namespace, o.Name}] = o.Secret.Data
			}
		}
	}
	v.Config = c
	return nil
}

// decodeConfig decodes a ConfigMap or Secret record (a Secret opened
// first, Config.Opener) and checks it is the object its key names.
func (vs *Builder) decodeConfig(r crdt.Record) (manifest.Object, error) {
	value := r.Value
	if vs.cfg.Opener != nil && strings.HasPrefix(r.Key, KindPrefix(manifest.KindSecret)) {
		var err error
		if value, err = vs.cfg.Opener.Open(r.Key, value); err != nil {
			return manifest.Object{}, err
		}
	}
	o, err := manifest.Decode(value)
	if err == nil && o.Key() != r.Key {
		err = errKeyMismatch{r.Key, o.Key()}
	}
	return o, err
}

type errKeyMismatch [2]string

func (e errKeyMismatch) Error() string { return "record " + e[0] + " holds " + e[1] }
