// Command vigil is a crash-recovering process supervisor: daemon and CLI in
// one binary. The command tree lives in internal/cli.
//
// updatemaxprocs=0: the Go runtime would otherwise wake every second to
// re-read the cgroup CPU limit, and an idle supervisor should not wake at
// all. GOMAXPROCS is still set from the limit once, at start.
//
//go:debug updatemaxprocs=0
package main

import (
	"os"

	"github.com/vigil-dev/vigil/internal/cli"
)

func main() { os.Exit(cli.Main()) }
