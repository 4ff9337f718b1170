package notify

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// received is one datagram that reached Handle.
type received struct {
	from Sender
	msg  Message
	at   time.Time
}

// recorder collects what Handle is given.
type recorder struct {
	mu  sync.Mutex
	got []received
}

func (r *recorder) handle(from Sender, m Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, received{from, m, time.Now()})
}

func (r *recorder) all() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// waitMessage waits for a handled datagram that matches and returns it.
func (r *recorder) waitMessage(t testing.TB, what string, match func(received) bool) received {
	t.Helper()
	var found received
	waitFor(t, what, 10*time.Second, func() bool {
		for _, g := range r.all() {
			if match(g) {
				found = g
				return true
			}
		}
		return false
	})
	return found
}

// listen starts a server in a fresh temp dir and closes it when the test ends.
func listen(t testing.TB, opts ServerOptions) (*Server, *recorder) {
	t.Helper()
	rec := &recorder{}
	if opts.Path == "" {
		opts.Path = filepath.Join(t.TempDir(), "notify.sock")
	}
	if opts.Handle == nil {
		opts.Handle = rec.handle
	}
	s, err := Listen(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, rec
}

// dial returns a datagram socket connected to path, closed when the test ends.
func dial(t testing.TB, path string) int {
	t.Helper()
	return int(dialFile(t, path).Fd())
}

// dialFile is dial as an *os.File, which owns the descriptor.
func dialFile(t testing.TB, path string) *os.File {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "notify-client")
	t.Cleanup(func() { f.Close() })
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	return f
}

func send(t testing.TB, fd int, payload []byte, oob []byte) {
	t.Helper()
	if err := unix.Sendmsg(fd, payload, oob, nil, 0); err != nil {
		t.Fatalf("send %d bytes: %v", len(payload), err)
	}
}

func waitReceived(t testing.TB, s *Server, n uint64) Stats {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d datagrams received", n), 10*time.Second, func() bool { return s.Stats().Received >= n })
	return s.Stats()
}

func TestListenSocketFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "notify.sock")
	s, _ := listen(t, ServerOptions{Path: path})
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&fs.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket file mode = %v, want a socket with 0600", fi.Mode())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket file after Close: %v, want it removed", err)
	}
}

func TestListenReplacesStaleSocket(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "notify.sock")
	// A socket left behind by a daemon that died: bound, then its fd closed.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	s, rec := listen(t, ServerOptions{Path: path})
	if err := Send(path, "READY=1", false, time.Second); err != nil {
		t.Fatal(err)
	}
	rec.waitMessage(t, "READY=1", func(r received) bool { return r.msg.Ready })
	if st := s.Stats(); st.Accepted != 1 {
		t.Errorf("Stats = %+v, want 1 accepted", st)
	}
}

func TestListenRefusesSymlinkAndFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	dangling := filepath.Join(dir, "dangling.sock")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), dangling); err != nil {
		t.Fatal(err)
	}
	noop := func(Sender, Message) {}
	for _, tc := range []struct {
		path string
		want error
	}{{link, ErrSymlink}, {dangling, ErrSymlink}, {target, ErrNotSocket}} {
		s, err := Listen(ServerOptions{Path: tc.path, Handle: noop})
		if !errors.Is(err, tc.want) {
			if s != nil {
				s.Close()
			}
			t.Errorf("Listen(%s) = %v, want %v", filepath.Base(tc.path), err, tc.want)
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep me" {
		t.Errorf("symlink target = %q, %v; want it untouched", b, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "nowhere")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dangling symlink target was created: %v", err)
	}
	if _, err := Listen(ServerOptions{Path: filepath.Join(dir, "x.sock")}); err == nil {
		t.Error("Listen without Handle succeeded")
	}
}

// The pid reaching Handle is the sending process's, as the kernel saw it.
func TestCredentialsFromChildProcess(t *testing.T) {
	t.Parallel()
	s, rec := listen(t, ServerOptions{})
	cmd := runHelperOK(t, []string{"NOTIFY_SOCKET=" + s.path}, "send", "READY=1\nSTATUS=child up\n")
	got := rec.waitMessage(t, "the child's READY=1", func(r received) bool { return r.msg.Ready })
	want := Sender{PID: cmd.Process.Pid, UID: os.Getuid(), GID: os.Getgid()}
	if got.from != want {
		t.Errorf("sender = %+v, want %+v", got.from, want)
	}
	if got.msg.Status == nil || *got.msg.Status != "child up" {
		t.Errorf("status = %v, want \"child up\"", got.msg.Status)
	}
}

// Root (CAP_SYS_ADMIN) may put any live pid in SCM_CREDENTIALS and the kernel
// passes it on: the server cannot tell, which is why the supervisor maps
// pids to services and never signals a pid on trust.
func TestRootMayClaimAnotherPID(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: only CAP_SYS_ADMIN may claim another pid")
	}
	s, rec := listen(t, ServerOptions{})
	other := helper(t, nil, "wait")
	stdin, err := other.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	fd := dial(t, s.path)
	uc := unix.Ucred{Pid: int32(other.Process.Pid)}
	send(t, fd, []byte("WATCHDOG=1\nSTATUS=claimed"), unix.UnixCredentials(&uc))
	got := rec.waitMessage(t, "the claimed datagram", func(r received) bool { return r.msg.Watchdog })
	if got.from.PID != other.Process.Pid {
		t.Errorf("sender pid = %d, want the claimed pid %d (kernel behaviour for root)", got.from.PID, other.Process.Pid)
	}
}

// An unprivileged process can claim neither another pid nor another uid.
func TestUnprivilegedCannotForgeCredentials(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a child as an unprivileged user")
	}
	s, rec := listen(t, ServerOptions{})
	// The socket file is 0600 root's; hand the child an already connected
	// socket so that only the credential check is in its way.
	cmd := helper(t, nil, "forge", strconv.Itoa(os.Getpid()))
	cmd.ExtraFiles = []*os.File{dialFile(t, s.path)}
	const nobody = 65534 // the helper drops to it before sending
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("forge helper: %v; stderr: %s", err, cmd.Stderr)
	}
	if got := strings.Fields(string(out)); len(got) != 2 || got[0] != "EPERM" || got[1] != "EPERM" {
		t.Errorf("forging another pid, then uid 0: %q, want EPERM twice", got)
	}
	got := rec.waitMessage(t, "the honest datagram", func(r received) bool { return r.msg.Status != nil })
	want := Sender{PID: cmd.Process.Pid, UID: nobody, GID: nobody}
	if got.from != want {
		t.Errorf("sender = %+v, want %+v", got.from, want)
	}
	if st := s.Stats(); st.Received != 1 {
		t.Errorf("Stats = %+v, want exactly the honest datagram", st)
	}
}

// A sender the kernel cannot name in our pid namespace arrives with pid 0:
// dropped as having no credentials. The server runs in a new pid namespace,
// where this test process is invisible.
func TestNoCredentialsDropped(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a new pid namespace")
	}
	path := filepath.Join(t.TempDir(), "notify.sock")
	const count = 5
	cmd := helper(t, nil, "server", path, strconv.Itoa(count))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	out := startServerHelper(t, cmd)
	for range count {
		if err := Send(path, "READY=1", false, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var st Stats
	if err := json.NewDecoder(out).Decode(&st); err != nil {
		t.Fatalf("server helper stats: %v; stderr: %s", err, cmd.Stderr)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if st.DroppedNoCreds != count || st.Accepted != 0 {
		t.Errorf("Stats = %+v, want %d dropped for no credentials", st, count)
	}
}

// Every way a datagram can be bad is dropped, counted once, and the server
// keeps handling the good ones in between.
func TestBadDatagramsDroppedAndCounted(t *testing.T) {
	t.Parallel()
	s, rec := listen(t, ServerOptions{})
	fd := dial(t, s.path)
	bad := [][]byte{
		{},                                // zero length (CVE-2016-7795)
		[]byte(strings.Repeat("x", 4097)), // one byte over
		[]byte("STATUS=" + strings.Repeat("y", 70000)),
		[]byte("READY=1\x00"),
		[]byte("READY=1\nno equals sign"),
		[]byte("MAINPID=12ab"),
		[]byte("LEASE=has space"),
	}
	for i, b := range bad {
		send(t, fd, b, nil)
		send(t, fd, []byte("STATUS=good "+strconv.Itoa(i)), nil)
	}
	send(t, fd, []byte("STATUS="+strings.Repeat("z", MaxDatagram-len("STATUS="))), nil) // exactly the limit
	st := waitReceived(t, s, uint64(2*len(bad)+1))
	want := Stats{Received: uint64(2*len(bad) + 1), Accepted: uint64(len(bad) + 1),
		DroppedEmpty: 1, DroppedOversize: 2, DroppedInvalid: 4}
	if st != want {
		t.Errorf("Stats =\n%+v, want\n%+v", st, want)
	}
	got := rec.all()
	for i := range bad {
		if s := got[i].msg.Status; s == nil || *s != "good "+strconv.Itoa(i) {
			t.Errorf("handled[%d].Status = %v, want good %d", i, s, i)
		}
	}
}

// A datagram whose descriptors do not fit the receiver's fd table arrives
// with MSG_CTRUNC: dropped and counted, and the server carries on.
func TestTruncatedControlDropped(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "notify.sock")
	// 128 descriptors leave the server helper room for the Go runtime (and
	// the race detector) but not for 200 passed descriptors.
	cmd := helper(t, nil, "server", path, "3", "128")
	out := startServerHelper(t, cmd)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	many := make([]int, 200)
	for i := range many {
		many[i] = int(devnull.Fd())
	}
	fd := dial(t, path)
	send(t, fd, []byte("WATCHDOG=1"), unix.UnixRights(many...))
	send(t, fd, []byte("WATCHDOG=1"), unix.UnixRights(many[:2]...))
	send(t, fd, []byte("READY=1"), nil)
	var st Stats
	if err := json.NewDecoder(out).Decode(&st); err != nil {
		t.Fatalf("server helper stats: %v; stderr: %s", err, cmd.Stderr)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if st.DroppedTruncated != 1 || st.Accepted != 2 || st.FDsClosed < 2 {
		t.Errorf("Stats = %+v, want 1 truncated, 2 accepted, the installed fds closed", st)
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// checkFDGrowth fails the test if this process holds noticeably more
// descriptors than before. The Go runtime opens a few of its own at times
// (cgroup CPU limit files, the netpoller), hence the slack; a leak of passed
// descriptors would be thousands.
func checkFDGrowth(t testing.TB, before int) {
	t.Helper()
	const slack = 4
	if after := openFDs(t); after > before+slack {
		t.Errorf("open descriptors grew from %d to %d", before, after)
	}
}

// Every passed descriptor is closed, whatever happens to its datagram.
// Not parallel: it counts this process's descriptors.
func TestPassedDescriptorsClosed(t *testing.T) {
	s, _ := listen(t, ServerOptions{})
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	fd := dial(t, s.path)
	before := openFDs(t)
	rights := unix.UnixRights(int(devnull.Fd()), int(devnull.Fd()), int(devnull.Fd()))
	payloads := [][]byte{[]byte("WATCHDOG=1"), {}, []byte("junk"), []byte(strings.Repeat("o", 5000))}
	const count = 10000
	for i := range count {
		send(t, fd, payloads[i%len(payloads)], rights)
	}
	st := waitReceived(t, s, count)
	if st.FDsClosed != 3*count {
		t.Errorf("FDsClosed = %d, want %d", st.FDsClosed, 3*count)
	}
	checkFDGrowth(t, before)
}

func TestRateLimitPerSender(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	start := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return start.Add(time.Duration(now.Load())) }
	s, rec := listen(t, ServerOptions{RatePerSender: 5, Now: clock})
	fd := dial(t, s.path)
	for range 8 {
		send(t, fd, []byte("WATCHDOG=1"), nil)
	}
	st := waitReceived(t, s, 8)
	if st.Accepted != 5 || st.DroppedRateLimited != 3 {
		t.Fatalf("burst of 8 at rate 5: %+v, want 5 accepted, 3 limited", st)
	}
	// Another process has its own bucket.
	child := runHelperOK(t, []string{"NOTIFY_SOCKET=" + s.path}, "send", "READY=1")
	rec.waitMessage(t, "the other sender's READY=1", func(r received) bool { return r.from.PID == child.Process.Pid })
	// 400ms refill two tokens.
	now.Add(int64(400 * time.Millisecond))
	for range 3 {
		send(t, fd, []byte("WATCHDOG=1"), nil)
	}
	st = waitReceived(t, s, 12)
	if st.Accepted != 8 || st.DroppedRateLimited != 4 {
		t.Errorf("after 400ms: %+v, want 8 accepted (5+1+2), 4 limited", st)
	}
	// A full second later the whole burst is back, and no more.
	now.Add(int64(10 * time.Second))
	for range 6 {
		send(t, fd, []byte("WATCHDOG=1"), nil)
	}
	st = waitReceived(t, s, 18)
	if st.Accepted != 13 || st.DroppedRateLimited != 5 {
		t.Errorf("after 10s idle: %+v, want 13 accepted, 5 limited", st)
	}
}

func TestCloseStopsHandling(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	s, _ := listen(t, ServerOptions{Handle: func(Sender, Message) { calls.Add(1) }})
	if err := Send(s.path, "WATCHDOG=1", true, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	n := calls.Load()
	if err := Send(s.path, "WATCHDOG=1", false, time.Second); err == nil {
		t.Error("Send after Close succeeded")
	}
	if n != 2 || calls.Load() != n {
		t.Errorf("Handle calls = %d then %d, want 2 (payload, barrier) and no more after Close", n, calls.Load())
	}
}
