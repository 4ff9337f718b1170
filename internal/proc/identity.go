// Package proc is vigil's contact with Linux processes: it spawns service
// instances in their own process groups, names each by pid plus start time,
// owns the one reaper that waits for children, and finds every process an
// instance left behind — also those that left its process group — so that
// stopping a service leaves nothing running.
//
// Invariants: only the Reaper waits for children; an exit is delivered
// exactly once, to the callback registered in the same critical section as
// the fork, so an instant exit is never lost or misattributed; children
// inherit no descriptor but stdin, stdout, stderr and ExtraFiles; services
// never get a parent-death signal, since they must outlive the daemon.
//
// Finding strays uses a per-instance cgroup where a writable cgroup v2
// hierarchy exists (membership is then exact and cheap), and otherwise the
// /proc process tree: the instance's process group, the descendants of its
// main process, and orphans whose environment carries the instance's token.
// /proc is scanned only when asked, never periodically.
package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
)

// Identity names one process for its whole life: pids are reused, a pid
// together with its start time is not — within one boot. Start times
// count from boot, and early-boot processes get much the same pids and
// start times every boot, so an identity kept across a reboot carries
// the boot it was taken in.
type Identity struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"` // /proc/PID/stat field 22, clock ticks since boot
	// Boot is the kernel's boot id when the identity was taken; empty for
	// identities kept before vigil recorded it, which are taken to be of
	// this boot.
	Boot string `json:"boot,omitempty"`
}

// Boot returns this boot's id (/proc/sys/kernel/random/boot_id), or ""
// where the kernel does not expose one.
var Boot = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
})

// OtherBoot reports whether boot names a boot other than this one: what
// was recorded then is gone, and its pids and start times may name
// unrelated processes now.
func OtherBoot(boot string) bool { return boot != "" && Boot() != "" && boot != Boot() }

// ErrMalformedStat is returned for a /proc/PID/stat line that cannot be parsed.
var ErrMalformedStat = errors.New("proc: malformed stat line")

// stat is the part of /proc/PID/stat vigil uses.
type stat struct {
	state     byte
	ppid      int
	pgid      int
	sid       int
	startTime uint64
}

// parseStat parses a /proc/PID/stat line. The command name (field 2) is in
// parentheses and may itself contain spaces and parentheses, so fields are
// counted from the last ')'.
func parseStat(b []byte) (stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return stat{}, ErrMalformedStat
	}
	f := bytes.Fields(b[i+2:]) // f[0] is field 3 (state)
	if len(f) < 20 || len(f[0]) != 1 {
		return stat{}, ErrMalformedStat
	}
	var s stat
	var err error
	s.state = f[0][0]
	if s.ppid, err = strconv.Atoi(string(f[1])); err != nil {
		return stat{}, ErrMalformedStat
	}
	if s.pgid, err = strconv.Atoi(string(f[2])); err != nil {
		return stat{}, ErrMalformedStat
	}
	if s.sid, err = strconv.Atoi(string(f[3])); err != nil {
		return stat{}, ErrMalformedStat
	}
	if s.startTime, err = strconv.ParseUint(string(f[19]), 10, 64); err != nil {
		return stat{}, ErrMalformedStat
	}
	return s, nil
}

func readStat(pid int) (stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	s, err := parseStat(b)
	if err != nil {
		return stat{}, fmt.Errorf("%w: pid %d", err, pid)
	}
	return s, nil
}

// ReadIdentity returns the identity of the process that has pid now.
func ReadIdentity(pid int) (Identity, error) {
	s, err := readStat(pid)
	if err != nil {
		return Identity{}, fmt.Errorf("proc: identity of pid %d: %w", pid, err)
	}
	return Identity{PID: pid, StartTime: s.startTime, Boot: Boot()}, nil
}

// Alive reports whether the very process id names still runs: it was
// taken in this boot, the pid exists, has the same start time (it was not
// reused), and is not a zombie.
func (id Identity) Alive() bool {
	if OtherBoot(id.Boot) {
		return false
	}
	s, err := readStat(id.PID)
	return err == nil && s.startTime == id.StartTime && s.state != 'Z' && s.state != 'X'
}
