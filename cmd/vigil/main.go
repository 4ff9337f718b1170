// Command vigil is a crash-recovering process supervisor: daemon and CLI in
// one binary. The command tree lives in internal/cli.
package main

import (
	"os"

	"github.com/vigil-dev/vigil/internal/cli"
)

func main() { os.Exit(cli.Main()) }
