package session

import (
	"os"
	"time"

	"github.com/vigil-dev/vigil/internal/proc"
	"golang.org/x/sys/unix"
)

// members returns the live (not zombie) processes of process group pgid.
func members(pgid int) []int { return proc.GroupMembers(pgid) }

// watchGroup returns a channel closed once group pgid has no live member,
// or once stop is closed. It is driven by exits — a pidfd per member,
// waited for in the runtime's poller — and rescans the group after each,
// since a member may have forked meanwhile.
func watchGroup(pgid int, stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			pids := members(pgid)
			if len(pids) == 0 {
				return
			}
			ended := make(chan struct{}, len(pids))
			var files []*os.File
			missed := false
			for _, pid := range pids {
				fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
				if err != nil {
					missed = true // gone already, or no descriptor to spare
					continue
				}
				f := os.NewFile(uintptr(fd), "pidfd")
				files = append(files, f)
				// The pid may have been reused since the scan.
				if pg, ok := proc.ProcessGroup(pid); !ok || pg != pgid {
					missed = true
					continue
				}
				go func() {
					if waitReadable(f) {
						ended <- struct{}{}
					}
				}()
			}
			var retry <-chan time.Time
			if missed {
				// Usually a member that just ended; rescan soon, without
				// spinning should descriptors have run out.
				retry = time.After(10 * time.Millisecond)
			}
			select {
			case <-ended:
			case <-retry:
			case <-stop:
			}
			for _, f := range files {
				f.Close()
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	return done
}
