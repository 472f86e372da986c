// Package imagebuild builds the small OCI images that tests and the demo
// import into containerd, with no registry: a static Go binary (or any
// set of files) packed as one layer with go-containerregistry and written
// as a docker-archive tarball, which `starling image import` accepts.
package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// File is one file of an image layer: Path inside the image, Mode bits,
// and either Data or a Source path on the host to copy.
type File struct {
	Path   string
	Mode   int64
	Data   []byte
	Source string
	// Link, when set, makes the entry a symlink to this target.
	Link string
	// Dir makes the entry a directory (with Mode, e.g. 01777 for one
	// any user may write).
	Dir bool
}

// Spec describes an image: its reference (e.g. "starling.local/echo:v1"),
// files, entrypoint and environment ("KEY=value").
type Spec struct {
	Ref        string
	Files      []File
	Entrypoint []string
	Env        []string
	// StopSignal is the image config's StopSignal ("SIGQUIT"); empty:
	// none (the runtime sends SIGTERM).
	StopSignal string
	// User is the image config's User ("nginx", "1000:1000"); empty: root.
	User string
	// WorkingDir is the image config's WorkingDir.
	WorkingDir string
}

// Write packs spec into a docker-archive tarball at path.
// Errors: a file that cannot be read, a bad reference, or an I/O failure.
func Write(path string, spec Spec) error {
	ref, err := name.ParseReference(spec.Ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", spec.Ref, err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs, explicit := map[string]bool{}, map[string]bool{}
	for _, f := range spec.Files {
		if f.Dir {
			explicit[f.Path] = true
		}
	}
	for _, f := range spec.Files {
		for d := filepath.Dir(f.Path); d != "/" && d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		if explicit[d] {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Name: d[1:] + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			return err
		}
	}
	for _, f := range spec.Files {
		name := f.Path[1:]
		if f.Dir {
			if err := tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: f.Mode}); err != nil {
				return err
			}
			continue
		}
		if f.Link != "" {
			if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: f.Link, Mode: 0o777}); err != nil {
				return err
			}
			continue
		}
		data := f.Data
		if f.Source != "" {
			if data, err = os.ReadFile(f.Source); err != nil {
				return fmt.Errorf("read %s: %w", f.Source, err)
			}
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(data))}); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Env = append([]string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"}, spec.Env...)
	cf.Config.StopSignal = spec.StopSignal
	cf.Config.User = spec.User
	cf.Config.WorkingDir = spec.WorkingDir
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	img = mutate.MediaType(img, "application/vnd.docker.distribution.manifest.v2+json")
	return tarball.WriteToFile(path, ref, img)
}

// BuildGo compiles the main package pkg (an import path or ./dir, relative
// to dir) as a static linux binary into outBinary. Uses the go tool on PATH.
func BuildGo(ctx context.Context, dir, pkg, outBinary string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", outBinary, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return nil
}

// Echo builds the echo server image (test/images/echo) as ref into the
// tarball at out. moduleDir is the Starling module root; message is baked
// in as MESSAGE so two versions of the image answer differently.
func Echo(ctx context.Context, moduleDir, ref, message, out string) error {
	return EchoWith(ctx, moduleDir, Spec{Ref: ref, Env: []string{"MESSAGE=" + message}}, out)
}

// EchoWith is Echo with spec's Ref, Env, StopSignal and User (its Files and
// Entrypoint are the echo server's).
func EchoWith(ctx context.Context, moduleDir string, spec Spec, out string) error {
	bin := out + ".bin"
	defer os.Remove(bin)
	if err := BuildGo(ctx, moduleDir, "./test/images/echo", bin); err != nil {
		return err
	}
	spec.Files = []File{{Path: "/echo", Mode: 0o755, Source: bin}, {Path: "/tmp/.keep", Data: nil}}
	spec.Entrypoint = []string{"/echo"}
	return Write(out, spec)
}

// Busybox builds an image with Debian's static busybox (package
// busybox-static, /bin/busybox) and its applet links, as ref into out.
// The entrypoint is "sleep infinity" so the replica can be exec'd into.
func Busybox(ref, busybox, out string) error {
	files := []File{{Path: "/bin/busybox", Mode: 0o755, Source: busybox}, {Path: "/tmp/.keep"}}
	for _, applet := range []string{"sh", "wget", "nc", "sleep", "cat", "ls", "ip", "ps", "echo", "hostname", "ifconfig", "kill"} {
		files = append(files, File{Path: "/bin/" + applet, Link: "busybox"})
	}
	return Write(out, Spec{Ref: ref, Files: files, Entrypoint: []string{"/bin/sleep", "infinity"}})
}
