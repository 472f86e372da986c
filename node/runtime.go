package node

import (
	"context"
	"io"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// Runtime is what the agent needs from the container runtime. node/runtime
// implements it with containerd; in-process tests use a fake.
type Runtime interface {
	// List observes every managed container.
	List(ctx context.Context) ([]reconcile.Container, error)
	// Execute carries out one reconcile action.
	Execute(ctx context.Context, a reconcile.Action) error
	// UpdateVolume rewrites a projected volume of a replica on the node
	// (volumes.Updater).
	UpdateVolume(id string, v reconcile.Volume, files []reconcile.File) (bool, error)
	// CleanupSandboxes removes sandboxes without a container, except busy ones.
	CleanupSandboxes(ctx context.Context, observed []reconcile.Container, claim func(id string) (release func(), ok bool)) error
	// WatchExits calls onExit when a container's task exits, until ctx ends.
	WatchExits(ctx context.Context, onExit func())
	// Exec runs argv inside container id's running task and returns its
	// exit status and the start of its output; it kills the command after
	// timeout (counted from its start; the error wraps
	// context.DeadlineExceeded). runtime.ErrNotRunning (wrapped) when
	// there is no running task.
	Exec(ctx context.Context, id string, argv []string, timeout time.Duration) (exitCode int, output string, err error)
	// LogPath is the log file of a container; PreviousLogPath that of its
	// previous run.
	LogPath(id string) string
	PreviousLogPath(id string) string
	// CgroupPath is the cgroup of a container (as in its OCI spec).
	CgroupPath(id string) string
	ImportImages(ctx context.Context, tar io.Reader) ([]string, error)
	Images(ctx context.Context) ([]api.Image, error)
	// WriteBlob writes content blob d to w, calling size first (a peer
	// pulling an image); errdefs.ErrNotFound when the node lacks it.
	WriteBlob(ctx context.Context, d digest.Digest, size func(int64), w io.Writer) error
	HasImage(ctx context.Context, ref string) bool
	// ImageDigest is the digest of image ref's manifest or index.
	ImageDigest(ctx context.Context, ref string) (string, error)
	// ImageProgress says how a fetch of image ref from a peer goes ("":
	// none in flight).
	ImageProgress(ref string) string
	Close() error
}
