package imagebuild

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Real server software for the tests, taken unchanged from Debian's
// packages: `make deps` downloads the .deb files (apt-get download, never
// installed on the host) into a directory; an image holds the programs
// from them, the shared libraries they load (found with ldd, from the
// packages or the host), the files named, and a passwd and group.

// TestDebs are the packages the real-software images are made from.
var TestDebs = []string{"nginx", "nginx-common", "redis-tools", "liblzf1", "libjemalloc2"}

// DebImage describes an image made from Debian packages.
type DebImage struct {
	Spec
	// Programs are paths of executables in the packages; each comes with
	// the libraries it loads.
	Programs []string
	// FromPackages are other paths in the packages to include.
	FromPackages []string
}

// FromDebian extracts pkgs (the newest <pkg>_*.deb of each in debDir)
// and writes img as a docker-archive tarball at out.
func FromDebian(ctx context.Context, debDir string, pkgs []string, img DebImage, out string) error {
	root, err := os.MkdirTemp("", "starling-debs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	for _, p := range pkgs {
		debs, _ := filepath.Glob(filepath.Join(debDir, p+"_*.deb"))
		if len(debs) == 0 {
			return fmt.Errorf("no %s_*.deb in %s: 'make deps' downloads them", p, debDir)
		}
		if b, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[len(debs)-1], root).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %v: %s", debs[len(debs)-1], err, b)
		}
	}
	spec := img.Spec
	seen := map[string]bool{}
	add := func(inImage, source string) {
		if !seen[inImage] {
			seen[inImage] = true
			spec.Files = append(spec.Files, File{Path: inImage, Mode: 0o755, Source: source})
		}
	}
	for _, p := range img.FromPackages {
		add(p, filepath.Join(root, p))
	}
	libPath := strings.Join([]string{filepath.Join(root, "usr/lib/x86_64-linux-gnu"), filepath.Join(root, "lib/x86_64-linux-gnu")}, ":")
	for _, prog := range img.Programs {
		src := filepath.Join(root, prog)
		add(prog, src)
		cmd := exec.CommandContext(ctx, "ldd", src)
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+libPath)
		b, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("ldd %s: %v", prog, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			var lib string
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				lib = f[2]
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				lib = f[0] // the dynamic loader
			case len(f) >= 3 && f[2] == "not":
				return fmt.Errorf("ldd %s: %s is not found", prog, f[0])
			default:
				continue
			}
			inImage := lib
			if rel, ok := strings.CutPrefix(lib, root); ok {
				inImage = rel
			}
			if real, err := filepath.EvalSymlinks(lib); err == nil {
				lib = real
			}
			add(inImage, lib)
		}
	}
	return Write(out, spec)
}

// Nginx is nginx from Debian's package, as its official image runs it:
// StopSignal SIGQUIT (a graceful stop), the master as root and workers as
// www-data, error log on stderr, access log on stdout, serving "hello
// from nginx" on port 80.
func Nginx(ctx context.Context, debDir, ref, out string) error {
	conf := `user www-data;
worker_processes 1;
daemon off;
error_log /dev/stderr notice;
pid /run/nginx.pid;
events { worker_connections 64; }
http {
  include /etc/nginx/mime.types;
  access_log /dev/stdout;
  client_body_temp_path /tmp/client_body;
  proxy_temp_path /tmp/proxy;
  fastcgi_temp_path /tmp/fastcgi;
  uwsgi_temp_path /tmp/uwsgi;
  scgi_temp_path /tmp/scgi;
  server {
    listen 80;
    location / { return 200 "hello from nginx\n"; }
  }
}
`
	return FromDebian(ctx, debDir, []string{"nginx", "nginx-common"}, DebImage{
		Spec: Spec{Ref: ref, Entrypoint: []string{"/usr/sbin/nginx", "-c", "/etc/nginx/nginx.conf"}, StopSignal: "SIGQUIT",
			Files: append(baseFiles("www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin", "www-data:x:33:"),
				File{Path: "/etc/nginx/nginx.conf", Data: []byte(conf)},
				File{Path: "/var/log/nginx", Dir: true, Mode: 0o755},
				File{Path: "/var/lib/nginx", Dir: true, Mode: 0o755})},
		Programs:     []string{"/usr/sbin/nginx"},
		FromPackages: []string{"/etc/nginx/mime.types"},
	}, out)
}

// Redis is redis-server and redis-cli from Debian's packages, run as the
// user redis (from the image's passwd), saving to /data on shutdown.
func Redis(ctx context.Context, debDir, ref, out string) error {
	return FromDebian(ctx, debDir, []string{"redis-tools", "liblzf1", "libjemalloc2"}, DebImage{
		Spec: Spec{Ref: ref, User: "redis", WorkingDir: "/data",
			Entrypoint: []string{"/usr/bin/redis-server", "--save", "3600 1", "--dir", "/data", "--bind", "0.0.0.0", "--protected-mode", "no"},
			Files: append(baseFiles("redis:x:999:999:redis:/data:/usr/sbin/nologin", "redis:x:999:"),
				File{Path: "/usr/bin/redis-server", Link: "redis-check-rdb"},
				File{Path: "/data", Dir: true, Mode: 0o1777})},
		Programs: []string{"/usr/bin/redis-check-rdb", "/usr/bin/redis-cli"},
	}, out)
}

// baseFiles are /etc/passwd and /etc/group with root and the given
// entries, and the directories servers expect.
func baseFiles(passwd, group string) []File {
	return []File{
		{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/bin/sh\n" + passwd + "\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")},
		{Path: "/etc/group", Data: []byte("root:x:0:\n" + group + "\nnogroup:x:65534:\n")},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/run", Dir: true, Mode: 0o755},
	}
}
