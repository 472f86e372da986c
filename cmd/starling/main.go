// Command starling is the single Starling binary: `starling agent` runs a
// node, every other subcommand is the CLI (see `starling --help`).
// containerd's shim also runs it as each container's log writer
// (node/logfile).
package main

import (
	"os"

	"github.com/starling-orchestrator/starling/cli"
	"github.com/starling-orchestrator/starling/node/logfile"
)

func main() {
	if logfile.IsDriver(os.Args[1:]) {
		logfile.Main(os.Args[1:])
	}
	os.Exit(cli.Execute())
}
