// Command starling is the single Starling binary: `starling agent` runs a
// node, every other subcommand is the CLI (see `starling --help`).
package main

import (
	"os"

	"github.com/starling-orchestrator/starling/cli"
)

func main() { os.Exit(cli.Execute()) }
