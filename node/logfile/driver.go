package logfile

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/runtime/v2/logging"
)

// DriverFlag marks an invocation of the starling binary as containerd's
// log driver (see Args, Main).
const DriverFlag = "--starling-log-driver"

// Args are the arguments of a binary:// log URI (containerd's cio.BinaryIO) that makes
// containerd's shim run the starling binary as the log driver of one
// container, writing to path. The shim passes each key and its value as
// two arguments, in no fixed order.
func Args(path string, maxSize int64, maxFiles int) map[string]string {
	return map[string]string{
		DriverFlag:    "1",
		"--path":      path,
		"--max-size":  strconv.FormatInt(maxSize, 10),
		"--max-files": strconv.Itoa(maxFiles),
	}
}

// IsDriver reports whether args (os.Args[1:]) are a log driver
// invocation (Args).
func IsDriver(args []string) bool {
	for i := 0; i+1 < len(args); i += 2 {
		if args[i] == DriverFlag {
			return true
		}
	}
	return false
}

// Main runs the log driver for the invocation args and exits: it reads
// the container's stdout and stderr from the pipes containerd's shim
// hands it (containerd's runtime/v2/logging protocol) until they close.
func Main(args []string) {
	opts := map[string]string{}
	for i := 0; i+1 < len(args); i += 2 {
		opts[args[i]] = args[i+1]
	}
	maxSize, err1 := strconv.ParseInt(opts["--max-size"], 10, 64)
	maxFiles, err2 := strconv.Atoi(opts["--max-files"])
	path := opts["--path"]
	if err := errors.Join(err1, err2); err != nil || path == "" {
		fmt.Fprintf(os.Stderr, "starling log driver: bad arguments %q\n", args)
		os.Exit(2)
	}
	logging.Run(func(ctx context.Context, cfg *logging.Config, ready func() error) error {
		w, err := NewWriter(path, maxSize, maxFiles)
		if err != nil {
			return err
		}
		defer w.Close()
		if err := ready(); err != nil {
			return err
		}
		return Drive(ctx, cfg.Stdout, cfg.Stderr, w, time.Now)
	})
}

// drainAfterCancel is how long Drive keeps reading once ctx ends (the
// shim stops the driver after the container's exit): what the container
// wrote last is still in the pipes.
const drainAfterCancel = 2 * time.Second

// Drive copies stdout and stderr into w, line by line (lines longer than
// MaxLineBytes in pieces), stamping each with now(), until both reach
// EOF, or drainAfterCancel after ctx ends.
func Drive(ctx context.Context, stdout, stderr io.Reader, w *Writer, now func() time.Time) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, s := range []struct {
		r    io.Reader
		name string
	}{{stdout, Stdout}, {stderr, Stderr}} {
		if s.r == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = copyLines(s.r, s.name, w, now)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		select {
		case <-done:
		case <-time.After(drainAfterCancel):
		}
	}
	return errors.Join(errs...)
}

// copyLines writes the lines of r as entries of stream to w. At EOF an
// unterminated last line is written as a full one.
func copyLines(r io.Reader, stream string, w *Writer, now func() time.Time) error {
	br := bufio.NewReaderSize(r, MaxLineBytes)
	for {
		line, isPrefix, err := br.ReadLine()
		if len(line) > 0 || err == nil {
			if werr := w.Write(Entry{Time: now(), Stream: stream, Partial: isPrefix, Content: line}); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
