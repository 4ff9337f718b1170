package checkpoint

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-dev/vigil/internal/journal"
)

var kills = flag.Int("kills", 200, "SIGKILLs in TestKillAnywhere")

// killHelperEnv names the state dir the helper process writes into.
const killHelperEnv = "VIGIL_KILL_HELPER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(killHelperEnv); dir != "" {
		killHelper(dir)
		return
	}
	os.Exit(m.Run())
}

// killHelper writes journal records from four goroutines and checkpoints
// from a fifth, as fast as it can, until it is killed. On stdout it says
// "R" once both are open, then "J seq crc" for every record the journal
// acknowledged as durable and "C generation restarts" for every
// checkpoint Write that returned. Each line is one write(2), so a line the
// parent reads was acknowledged before the kill.
func killHelper(dir string) {
	say := func(format string, args ...any) { fmt.Fprintf(os.Stdout, format+"\n", args...) }
	j, err := journal.Open(journal.Options{Dir: filepath.Join(dir, "journal"), SegmentSize: 64 << 10})
	if err != nil {
		say("E %v", err)
		os.Exit(1)
	}
	s := &Store{Dir: dir}
	say("R")
	pid := os.Getpid()
	for w := range 4 {
		go func() {
			for i := 0; ; i++ {
				p := fmt.Appendf(nil, `{"pid":%d,"w":%d,"i":%d,"pad":%q}`, pid, w, i, strings.Repeat("x", (i*7+w)%300))
				sum := crc32.ChecksumIEEE(p)
				done := make(chan struct{})
				var seq uint64
				var mu sync.Mutex
				mu.Lock()
				seq, err := j.Append(journal.TypeEvent, p, func(err error) {
					mu.Lock()
					defer mu.Unlock()
					if err == nil {
						say("J %d %d", seq, sum)
					}
					close(done)
				})
				mu.Unlock()
				if err != nil {
					say("E %v", err)
					os.Exit(1)
				}
				<-done
			}
		}()
	}
	for i := 1; ; i++ {
		st := testState(i%40, i)
		st.Services[0].Restarts = i
		info, err := s.Write(st)
		if err != nil {
			say("E %v", err)
			os.Exit(1)
		}
		say("C %d %d", info.Generation, i)
	}
}

// TestKillAnywhere SIGKILLs a process that writes journal records and
// checkpoints, at random moments (some during Open and its repair), and
// after each kill checks what the next process would find: the newest
// acknowledged checkpoint or a newer one, a journal whose every record
// verifies, and every acknowledged record there. The same directory is
// used throughout, so every run also appends after the previous kill's
// repair.
func TestKillAnywhere(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	acked := map[uint64]uint32{} // seq → CRC of the payload
	var ackedGen uint64
	var ackedRestarts int
	repairs, duringOpen := 0, 0
	for k := range *kills {
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), killHelperEnv+"="+dir)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill() })
		lines := make(chan string, 1<<16)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		// One kill in ten lands while the helper opens (and repairs) the
		// journal; the rest after both are open, within 25ms of writing.
		var seen []string
		if k%10 == 0 {
			time.Sleep(time.Duration(rng.Int64N(int64(15 * time.Millisecond))))
			duringOpen++
		} else {
			deadline := time.After(30 * time.Second)
			for ready := false; !ready; {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("kill %d: helper exited before it was ready: %v", k, cmd.Wait())
					}
					seen = append(seen, l)
					ready = l == "R"
				case <-deadline:
					t.Fatalf("kill %d: helper not ready within 30s", k)
				}
			}
			time.Sleep(time.Duration(rng.Int64N(int64(25 * time.Millisecond))))
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		for l := range lines {
			seen = append(seen, l)
		}
		for _, l := range seen {
			f := strings.Fields(l)
			switch f[0] {
			case "J":
				seq, _ := strconv.ParseUint(f[1], 10, 64)
				sum, _ := strconv.ParseUint(f[2], 10, 32)
				acked[seq] = uint32(sum)
			case "C":
				gen, _ := strconv.ParseUint(f[1], 10, 64)
				ackedGen = max(ackedGen, gen)
				if gen == ackedGen {
					ackedRestarts, _ = strconv.Atoi(f[2])
				}
			case "E":
				t.Fatalf("kill %d: helper failed: %s", k, l)
			}
		}

		// Reopening repairs a torn tail; after it every record verifies
		// and every acknowledged one is there, unchanged.
		j, err := journal.Open(journal.Options{Dir: filepath.Join(dir, "journal"), SegmentSize: 64 << 10})
		if err != nil {
			t.Fatalf("kill %d: reopening the journal: %v", k, err)
		}
		repairs += len(j.Repairs())
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		found := make(map[uint64]uint32, len(acked))
		probs, err := (&journal.Reader{Dir: filepath.Join(dir, "journal")}).Scan(func(r journal.Record) bool {
			found[r.Seq] = crc32.ChecksumIEEE(r.Payload)
			if !json.Valid(r.Payload) || !bytes.HasPrefix(r.Payload, []byte(`{"pid":`)) {
				t.Errorf("kill %d: record %d is not what was written: %q", k, r.Seq, r.Payload)
			}
			return true
		})
		if err != nil || len(probs) > 0 {
			t.Fatalf("kill %d: journal after reopening: %v, problems %v", k, err, probs)
		}
		for seq, sum := range acked {
			if got, ok := found[seq]; !ok || got != sum {
				t.Fatalf("kill %d: acknowledged record %d missing or changed (present %v)", k, seq, ok)
			}
		}

		l, err := (&Store{Dir: dir}).Read()
		switch {
		case ackedGen == 0 && err != nil:
			// No checkpoint acknowledged yet; none or one may be there.
		case err != nil:
			t.Fatalf("kill %d: checkpoint: %v (generation %d was acknowledged)", k, err, ackedGen)
		case l.Generation < ackedGen:
			t.Fatalf("kill %d: checkpoint generation %d, but %d was acknowledged", k, l.Generation, ackedGen)
		case l.Generation == ackedGen && l.State.Services[0].Restarts != ackedRestarts:
			t.Fatalf("kill %d: generation %d holds another state", k, l.Generation)
		case l.FellBack || len(l.Problems) > 0 || len(l.Skipped) > 0:
			// A kill is not a power loss: the page cache keeps every
			// complete rename, so the current file is always whole.
			t.Fatalf("kill %d: checkpoint fell back: %v %v", k, l.Problems, l.Skipped)
		}
	}
	if len(acked) == 0 || ackedGen == 0 {
		t.Fatalf("after %d kills nothing was acknowledged: %d records, generation %d", *kills, len(acked), ackedGen)
	}
	t.Logf("%d kills (%d during open): %d records and %d checkpoints acknowledged, %d torn tails repaired",
		*kills, duringOpen, len(acked), ackedGen, repairs)
}
