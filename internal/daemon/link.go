package daemon

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/vigil-dev/vigil/internal/guardian"
	"github.com/vigil-dev/vigil/internal/supervisor"
)

// orphanWait is how long an adopted instance's exit waits for the guardian
// to report the status of the process it reaped.
const orphanWait = 250 * time.Millisecond

// orphanBook keeps the exit statuses the guardian reports for processes
// it reaped: the previous daemon's children, some of them adopted.
type orphanBook struct {
	mu      sync.Mutex
	changed *sync.Cond
	status  map[int]syscall.WaitStatus
	order   []int // oldest first, to bound the book
}

func newOrphanBook() *orphanBook {
	b := &orphanBook{status: map[int]syscall.WaitStatus{}}
	b.changed = sync.NewCond(&b.mu)
	return b
}

func (b *orphanBook) add(e guardian.OrphanExit) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.order) >= 4096 {
		delete(b.status, b.order[0])
		b.order = b.order[1:]
	}
	b.status[e.PID] = e.Status
	b.order = append(b.order, e.PID)
	b.changed.Broadcast()
}

// wait returns the status of pid once the guardian reports it, giving up
// after orphanWait: the exit of an adopted process is seen through its
// pidfd, usually a moment before the guardian's report arrives.
func (b *orphanBook) wait(pid int) (syscall.WaitStatus, bool) {
	deadline := time.Now().Add(orphanWait)
	timer := time.AfterFunc(orphanWait, func() { b.mu.Lock(); b.changed.Broadcast(); b.mu.Unlock() })
	defer timer.Stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if ws, ok := b.status[pid]; ok {
			delete(b.status, pid)
			return ws, true
		}
		if !time.Now().Before(deadline) {
			return 0, false
		}
		b.changed.Wait()
	}
}

// serveGuardian heartbeats to the guardian while the supervisor's loop
// answers, and books the orphan exits it reports, until ctx is done.
func serveGuardian(ctx context.Context, link *guardian.Link, sup *supervisor.Supervisor, book *orphanBook) {
	go func() {
		for {
			select {
			case e, ok := <-link.Exits():
				if !ok {
					return
				}
				book.add(e)
			case <-ctx.Done():
				return
			}
		}
	}()
	every := link.Interval()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		if sup.Answers(every) {
			_ = link.Beat()
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}
