// Package pidns holds the PID namespace of a replica whose containers
// share one (its pod template sets shareProcessNamespace: true), as the
// kubelet's pause container
// holds a pod's: a small process, the agent's own binary run as
// `starling pid-holder DIR`, is PID 1 of a new PID namespace; every
// container of the replica joins it (/proc/PID/ns/pid), sees the
// others' processes, and has its orphans reaped by it. Its PID is kept
// in DIR (the replica's pod directory), so a restarted agent finds it;
// it outlives the agent (its own session; the systemd unit's
// KillMode=process) and ends when killed (Stop), which ends every
// process in the namespace.
package pidns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Command is the argument that runs the holder (Main).
const Command = "pid-holder"

// pidFile is the file in the pod directory that holds the holder's PID.
const pidFile = "pid-holder.pid"

// IsHolder reports whether args (the binary's, without the program
// name) run the holder.
func IsHolder(args []string) bool { return len(args) == 2 && args[0] == Command }

// Main is the holder: PID 1 of its namespace, it reaps every process
// that ends in it and otherwise waits, until killed. It never returns.
func Main() {
	// Every signal it can ignore: a container's process may signal PID 1
	// of its namespace, and Go's defaults (SIGQUIT dumps and exits) would
	// end the pod; only SIGKILL from outside (Stop) ends it.
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
		syscall.SIGALRM, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGVTALRM, syscall.SIGPROF, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGWINCH)
	children := make(chan os.Signal, 16)
	signal.Notify(children, syscall.SIGCHLD)
	for range children {
		for {
			var ws unix.WaitStatus
			if pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
	select {}
}

// Start starts the holder of pod directory dir (made if missing) with
// the agent's binary and records its PID there; it returns the PID.
func Start(dir string) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	cmd := exec.Command(exe, Command, dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start the replica's PID namespace holder: %w", err)
	}
	go cmd.Wait() // reaped by this agent run if it ends before the agent
	pid := cmd.Process.Pid
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(pid)), 0o600); err != nil {
		cmd.Process.Kill()
		return 0, err
	}
	return pid, nil
}

// Find returns the PID of the holder of pod directory dir, if it runs:
// the recorded PID whose command line is the holder's of dir (a PID
// reused by another process does not count).
func Find(dir string) (int, bool) {
	return Running(filepath.Join(dir, pidFile), func(args []string) bool {
		return len(args) == 3 && args[1] == Command && args[2] == dir
	})
}

// Running is the process whose PID file pidPath names, if it runs and
// its command line (its arguments, the program's first) is the one
// match expects: a PID reused by another process does not count.
func Running(pidPath string, match func(args []string) bool) (int, bool) {
	b, err := os.ReadFile(pidPath)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, false
	}
	args, ok := cmdline(pid)
	return pid, ok && match(args)
}

// cmdline is the command line of process pid.
func cmdline(pid int) ([]string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, false
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), true
}

// Path is the namespace file a container joins, of the holder pid.
func Path(pid int) string { return fmt.Sprintf("/proc/%d/ns/pid", pid) }

// Stop kills the holder of pod directory dir, if it runs (which ends
// whatever still runs in its namespace).
func Stop(dir string) error {
	pid, ok := Find(dir)
	if !ok {
		return nil
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("stop the replica's PID namespace holder %d: %w", pid, err)
	}
	return nil
}
