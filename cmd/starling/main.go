// Command starling is the single Starling binary: `starling agent` runs a
// node, every other subcommand is the CLI (see `starling --help`).
// containerd's shim also runs it as each container's log writer
// (node/logfile), and the agent as the holder of a replica's shared PID
// namespace (node/pidns).
package main

import (
	"os"

	"github.com/starling-orchestrator/starling/cli"
	"github.com/starling-orchestrator/starling/node/logfile"
	"github.com/starling-orchestrator/starling/node/pidns"
)

func main() {
	if logfile.IsDriver(os.Args[1:]) {
		logfile.Main(os.Args[1:])
	}
	if pidns.IsHolder(os.Args[1:]) {
		pidns.Main()
	}
	os.Exit(cli.Execute())
}
