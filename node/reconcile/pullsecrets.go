package reconcile

import (
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// RegistryCred is a user name and password for a registry.
type RegistryCred struct {
	Username, Password string
}

// RegistryCreds returns the credentials of replica r's imagePullSecrets
// (Spec.PullSecrets) from src, by registry host as a pull asks for it
// ("registry.example:5000"; Docker Hub's "index.docker.io" as
// "registry-1.docker.io"), the first Secret's winning, as the kubelet
// tries them in order. A Secret that is missing or holds no
// .dockerconfigjson or .dockercfg is skipped (the kubelet pulls without
// it); an entry whose "auth" does not decode, or that gives no user
// name, is skipped.
func RegistryCreds(pullSecrets []string, namespace string, src ConfigData) map[string]RegistryCred {
	var out map[string]RegistryCred
	for _, name := range pullSecrets {
		data, ok := src.Secret(namespace, name)
		if !ok {
			continue
		}
		var entries map[string]dockerAuth
		if js, ok := data[corev1.DockerConfigJsonKey]; ok {
			var cfg struct {
				Auths map[string]dockerAuth `json:"auths"`
			}
			if json.Unmarshal(js, &cfg) == nil {
				entries = cfg.Auths
			}
		} else if js, ok := data[corev1.DockerConfigKey]; ok {
			json.Unmarshal(js, &entries)
		}
		for key, a := range entries {
			host, cred, ok := a.cred(key)
			if !ok {
				continue
			}
			if out == nil {
				out = map[string]RegistryCred{}
			}
			if _, seen := out[host]; !seen {
				out[host] = cred
			}
		}
	}
	return out
}

// dockerAuth is one registry's entry of a Docker config.
type dockerAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
	Auth     string `json:"auth"`
}

// cred is entry a of key (a host, or a URL as "https://index.docker.io/v1/")
// as a host and credentials.
func (a dockerAuth) cred(key string) (string, RegistryCred, bool) {
	host := key
	if u, err := url.Parse(key); err == nil && u.Host != "" {
		host = u.Host
	}
	host, _, _ = strings.Cut(host, "/")
	switch host {
	case "docker.io", "index.docker.io":
		host = "registry-1.docker.io"
	}
	c := RegistryCred{Username: a.Username, Password: a.Password}
	if a.Auth != "" {
		b, err := base64.StdEncoding.DecodeString(a.Auth)
		user, pass, ok := strings.Cut(string(b), ":")
		if err != nil || !ok {
			return "", RegistryCred{}, false
		}
		c = RegistryCred{Username: user, Password: pass}
	}
	return host, c, host != "" && c.Username != ""
}
