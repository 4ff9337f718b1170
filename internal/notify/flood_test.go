package notify

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The flood mix, by datagram index modulo floodKinds.
const floodKinds = 6

var floodOversize = []byte("STATUS=" + strings.Repeat("o", 5000))

// sendFlood sends count datagrams to path, cycling through a valid ping,
// junk, a zero-length datagram, an oversized one, a NUL-carrying one and a
// ping carrying three descriptors.
func sendFlood(path string, count int) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return err
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	n := int(devnull.Fd())
	rights := unix.UnixRights(n, n, n)
	for i := range count {
		var p, oob []byte
		switch i % floodKinds {
		case 0:
			p = []byte("WATCHDOG=1\nSTATUS=flood")
		case 1:
			p = []byte("this is not KEY=VALUE\njunk")
		case 2:
		case 3:
			p = floodOversize
		case 4:
			p = []byte("READY=1\x00")
		case 5:
			p, oob = []byte("WATCHDOG=1"), rights
		}
		if err := unix.Sendmsg(fd, p, oob, nil, 0); err != nil {
			return err
		}
	}
	return nil
}

// floodFDs is how many descriptors sendFlood(count) passes.
func floodFDs(count int) int { return 3 * (count / floodKinds) }

// 100,000 hostile and noisy datagrams from several processes: the server
// survives, leaks no descriptor, every datagram is accounted for, and a
// separate sender's heartbeats keep arriving promptly. Not parallel: it
// counts this process's descriptors and measures latency.
func TestFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("flood skipped in -short mode")
	}
	const (
		floodProcs = 4
		perProc    = 25000
		beatEvery  = time.Millisecond
		maxLatency = 250 * time.Millisecond
	)
	me := os.Getpid()
	var (
		mu         sync.Mutex
		arrived    = map[int]time.Time{}
		fromOthers atomic.Int64
	)
	s, _ := listen(t, ServerOptions{Handle: func(from Sender, m Message) {
		if from.PID != me {
			fromOthers.Add(1)
			return
		}
		seq, err := strconv.Atoi(*m.Status)
		if err != nil || !m.Watchdog {
			t.Errorf("unexpected heartbeat %q", m.Assignments)
		}
		mu.Lock()
		arrived[seq] = time.Now()
		mu.Unlock()
	}})
	// The watched sender: this process, one heartbeat per millisecond.
	watched := dial(t, s.path)
	fdsBefore := openFDs(t)
	stop := make(chan struct{})
	var sent []time.Time
	beatsDone := make(chan struct{})
	go func() {
		defer close(beatsDone)
		tick := time.NewTicker(beatEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			seq := len(sent)
			sent = append(sent, time.Now())
			if err := unix.Sendmsg(watched, []byte("WATCHDOG=1\nSTATUS="+strconv.Itoa(seq)), nil, nil, 0); err != nil {
				t.Errorf("heartbeat %d: %v", seq, err)
				return
			}
		}
	}()

	began := time.Now()
	var wg sync.WaitGroup
	for range floodProcs {
		cmd := helper(t, []string{"NOTIFY_SOCKET=" + s.path}, "flood", strconv.Itoa(perProc))
		wg.Go(func() {
			if err := cmd.Run(); err != nil {
				t.Errorf("flood helper: %v; stderr: %s", err, cmd.Stderr)
			}
		})
	}
	wg.Wait()
	floodTook := time.Since(began)
	close(stop)
	<-beatsDone

	total := uint64(floodProcs*perProc + len(sent))
	st := waitReceived(t, s, total)
	waitFor(t, "the last heartbeat", 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(arrived) == len(sent)
	})
	t.Logf("flood of %d datagrams from %d processes took %v (%.0f/s); %d heartbeats; stats %+v",
		floodProcs*perProc, floodProcs, floodTook, float64(floodProcs*perProc)/floodTook.Seconds(), len(sent), st)

	if st.Received != total {
		t.Errorf("Received = %d, want %d", st.Received, total)
	}
	if want := uint64(floodProcs * floodFDs(perProc)); st.FDsClosed != want {
		t.Errorf("FDsClosed = %d, want %d", st.FDsClosed, want)
	}
	if got := uint64(fromOthers.Load()) + uint64(len(sent)); st.Accepted != got {
		t.Errorf("Accepted = %d, want the %d handled", st.Accepted, got)
	}
	if st.DroppedRateLimited == 0 || st.DroppedNoCreds != 0 || st.DroppedTruncated != 0 || st.ReadErrors != 0 {
		t.Errorf("unexpected drop counts: %+v", st)
	}
	// Each flood process may pass at most its burst plus its rate over the flood.
	if limit := int64(floodProcs) * int64(DefaultRatePerSender) * int64(2+floodTook/time.Second); fromOthers.Load() > limit {
		t.Errorf("%d flood datagrams handled, more than the rate limit allows (%d)", fromOthers.Load(), limit)
	}
	if len(sent) < int(floodTook/beatEvery)/4 {
		t.Errorf("only %d heartbeats sent during a %v flood", len(sent), floodTook)
	}
	var worst time.Duration
	for seq, at := range sent {
		if d := arrived[seq].Sub(at); d > worst {
			worst = d
		}
	}
	t.Logf("worst heartbeat latency during the flood: %v", worst)
	if worst > maxLatency {
		t.Errorf("a heartbeat took %v to arrive, over the %v bound", worst, maxLatency)
	}
	checkFDGrowth(t, fdsBefore)
}

// BenchmarkServerThroughput measures datagrams per second through the whole
// server path (recvmsg, credentials, rate limit, Parse, Handle) from 8
// sending goroutines.
func BenchmarkServerThroughput(b *testing.B) {
	const senders = 8
	var handled atomic.Int64
	s, _ := listen(b, ServerOptions{
		Handle:        func(Sender, Message) { handled.Add(1) },
		RatePerSender: 1 << 30, // one pid here; keep the limiter on the path without limiting
	})
	fds := make([]int, senders)
	for i := range fds {
		fds[i] = dial(b, s.path)
	}
	payload := []byte("WATCHDOG=1\nSTATUS=benchmark")
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, fd := range fds {
		n := b.N / senders
		if i == 0 {
			n += b.N % senders
		}
		wg.Go(func() {
			for range n {
				if err := unix.Sendmsg(fd, payload, nil, nil, 0); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for handled.Load() < int64(b.N) {
		time.Sleep(50 * time.Microsecond)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "datagrams/s")
}
