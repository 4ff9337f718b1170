package notify

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"
)

// TestMain lets the test binary act as a notify client or server in a child
// process, as os/exec's own tests do: with VIGIL_NOTIFY_HELPER set it runs
// that helper and exits.
func TestMain(m *testing.M) {
	if h := os.Getenv("VIGIL_NOTIFY_HELPER"); h != "" {
		if err := runHelper(h, os.Args[1:]); err != nil {
			fmt.Fprintf(os.Stderr, "helper %s: %v\n", h, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runHelper(name string, args []string) error {
	switch name {
	case "send": // send PAYLOAD [barrier]: Send to $NOTIFY_SOCKET
		return Send(os.Getenv("NOTIFY_SOCKET"), args[0], len(args) > 1 && args[1] == "barrier", 5*time.Second)
	case "go-systemd": // what a Go service using coreos/go-systemd does
		interval, err := daemon.SdWatchdogEnabled(false)
		if err != nil {
			return err
		}
		if interval != 2*time.Second {
			return fmt.Errorf("SdWatchdogEnabled = %v, want 2s", interval)
		}
		for _, state := range []string{daemon.SdNotifyReady + "\nSTATUS=serving", daemon.SdNotifyWatchdog} {
			if ok, err := daemon.SdNotify(false, state); !ok || err != nil {
				return fmt.Errorf("SdNotify(%q) = %v, %v", state, ok, err)
			}
		}
		return nil
	case "wait": // block until stdin closes: a live pid for the test to claim
		_, err := os.Stdin.Read(make([]byte, 1))
		_ = err
		return nil
	case "forge": // forge CLAIMPID: on the connected socket passed as fd 3, try to claim another identity, then send honestly
		return helperForge(args[0])
	case "flood": // flood COUNT: the mixed flood datagrams on $NOTIFY_SOCKET
		count, err := strconv.Atoi(args[0])
		if err != nil {
			return err
		}
		return sendFlood(os.Getenv("NOTIFY_SOCKET"), count)
	case "server": // server PATH COUNT [NOFILE]: listen, print "ready", print Stats as JSON once COUNT datagrams arrived
		return helperServer(args)
	}
	return fmt.Errorf("unknown helper %q", name)
}

// helperForge drops to user nobody, reports (one line each on stdout) the
// errno of sending with another pid's credentials and with root's uid, then
// sends honestly.
func helperForge(claimPID string) error {
	pid, err := strconv.Atoi(claimPID)
	if err != nil {
		return err
	}
	const nobody = 65534
	if err := syscall.Setgroups(nil); err != nil {
		return err
	}
	if err := syscall.Setgid(nobody); err != nil {
		return err
	}
	if err := syscall.Setuid(nobody); err != nil {
		return err
	}
	const fd = 3
	try := func(uc unix.Ucred) {
		err := unix.Sendmsg(fd, []byte("WATCHDOG=1"), unix.UnixCredentials(&uc), nil, 0)
		fmt.Println(errnoName(err))
	}
	try(unix.Ucred{Pid: int32(pid), Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())})
	try(unix.Ucred{Pid: int32(os.Getpid()), Uid: 0, Gid: 0})
	return unix.Sendmsg(fd, []byte("STATUS=honest"), nil, nil, 0)
}

func errnoName(err error) string {
	if errno, ok := err.(syscall.Errno); ok {
		return unix.ErrnoName(errno)
	}
	if err == nil {
		return "ok"
	}
	return err.Error()
}

func helperServer(args []string) error {
	count, err := strconv.Atoi(args[1])
	if err != nil {
		return err
	}
	if len(args) > 2 {
		nofile, err := strconv.ParseUint(args[2], 10, 64)
		if err != nil {
			return err
		}
		// The runtime opens its epoll descriptor at the first timer, which
		// would come after the test's descriptors have filled the table
		// were this process descheduled between "ready" and its first
		// sleep: take it now, while there is room.
		time.Sleep(time.Microsecond)
		// Descriptors the test process held without close-on-exec when it
		// forked us (those received with SCM_RIGHTS by a test running beside
		// it, for a moment) take room below the limit too: NOFILE is room
		// beyond those open now.
		if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
			nofile += uint64(max(len(ents)-4, 0)) // less 0-2 and ReadDir's own
		}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: nofile, Max: nofile}); err != nil {
			return err
		}
	}
	var handled atomic.Int64
	s, err := Listen(ServerOptions{Path: args[0], Handle: func(Sender, Message) { handled.Add(1) }, RatePerSender: -1})
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Println("ready")
	deadline := time.Now().Add(30 * time.Second)
	for s.Stats().Received < uint64(count) {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d datagrams arrived", s.Stats().Received, count)
		}
		time.Sleep(time.Millisecond)
	}
	return json.NewEncoder(os.Stdout).Encode(s.Stats())
}

// helper returns a command running the named helper of this test binary,
// killed and reaped when the test ends.
func helper(t testing.TB, env []string, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	// GORACE: a -race binary otherwise sleeps 1s at exit.
	cmd.Env = append(os.Environ(), append(env, "VIGIL_NOTIFY_HELPER="+name, "GORACE=atexit_sleep_ms=0")...)
	cmd.Stderr = &lockedBuffer{}
	t.Cleanup(func() {
		if cmd.Process != nil && cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// runHelperOK runs a helper to completion and fails the test if it fails.
func runHelperOK(t testing.TB, env []string, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := helper(t, env, name, args...)
	if err := cmd.Run(); err != nil {
		t.Fatalf("helper %s: %v; stderr: %s", name, err, cmd.Stderr)
	}
	return cmd
}

// startServerHelper starts the "server" helper and waits for its "ready".
func startServerHelper(t *testing.T, cmd *exec.Cmd) *bufio.Reader {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		t.Fatalf("server helper said %q, %v; stderr: %s", line, err, cmd.Stderr)
	}
	return r
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
