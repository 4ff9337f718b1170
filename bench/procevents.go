package main

import (
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// The kernel's process events connector (linux/cn_proc.h): it reports every
// fork, exec and exit with a CLOCK_MONOTONIC timestamp taken in the kernel,
// so latencies are measured from outside vigil, at the instants that matter.
const (
	cnIdxProc         = 1
	cnValProc         = 1
	procCnMcastListen = 1

	procEventFork = 0x00000001
	procEventExec = 0x00000002
	procEventExit = 0x80000000
)

type procEvent struct {
	What uint32
	TS   uint64 // ns, CLOCK_MONOTONIC
	// fork: Parent = parent tgid, PID = child tgid; exec/exit: PID = tgid.
	Parent int
	PID    int
	Thread bool // a thread, not a process: ignore
}

type procEvents struct {
	fd  int
	buf []byte
}

func openProcEvents() (*procEvents, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_CONNECTOR)
	if err != nil {
		return nil, fmt.Errorf("proc connector socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<20); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: cnIdxProc, Pid: uint32(os.Getpid())}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("proc connector bind: %w", err)
	}
	msg := make([]byte, 16+20+4)
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))     // nlmsg_len
	binary.NativeEndian.PutUint16(msg[4:], unix.NLMSG_DONE)      // nlmsg_type
	binary.NativeEndian.PutUint32(msg[12:], uint32(os.Getpid())) // nlmsg_pid
	binary.NativeEndian.PutUint32(msg[16:], cnIdxProc)           // cn_msg.id.idx
	binary.NativeEndian.PutUint32(msg[20:], cnValProc)           // cn_msg.id.val
	binary.NativeEndian.PutUint16(msg[32:], 4)                   // cn_msg.len
	binary.NativeEndian.PutUint32(msg[36:], procCnMcastListen)   // op
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("proc connector listen: %w", err)
	}
	return &procEvents{fd: fd, buf: make([]byte, 1<<16)}, nil
}

// next blocks for the next fork, exec or exit event.
func (p *procEvents) next() (procEvent, error) {
	for {
		n, _, err := unix.Recvfrom(p.fd, p.buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return procEvent{}, fmt.Errorf("proc connector: %w (events lost?)", err)
		}
		b := p.buf[:n]
		if len(b) < 16+20+16 {
			continue
		}
		ev := b[16+20:]
		e := procEvent{What: binary.NativeEndian.Uint32(ev[0:]), TS: binary.NativeEndian.Uint64(ev[8:])}
		d := ev[16:]
		switch e.What {
		case procEventFork:
			e.Parent = int(binary.NativeEndian.Uint32(d[4:]))
			e.PID = int(binary.NativeEndian.Uint32(d[12:]))
			e.Thread = binary.NativeEndian.Uint32(d[8:]) != binary.NativeEndian.Uint32(d[12:])
		case procEventExec, procEventExit:
			e.PID = int(binary.NativeEndian.Uint32(d[4:]))
			e.Thread = binary.NativeEndian.Uint32(d[0:]) != binary.NativeEndian.Uint32(d[4:])
			if e.What == procEventExit && len(d) >= 24 {
				e.Parent = int(binary.NativeEndian.Uint32(d[20:]))
			}
		default:
			continue
		}
		if e.Thread {
			continue
		}
		return e, nil
	}
}

func (p *procEvents) Close() { unix.Close(p.fd) }
