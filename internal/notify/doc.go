// Package notify speaks the sd_notify protocol for vigil: a pure parser for
// notify datagrams, the server that receives them on the daemon's unix
// datagram socket, and the client-side Send used by `vigil notify`.
//
// Wire format (sd_notify(3)): one datagram carries newline-separated
// KEY=VALUE assignments; a trailing newline is allowed. Parse understands
// READY=1, STOPPING=1, RELOADING=1, WATCHDOG=1, WATCHDOG=trigger, BARRIER=1,
// STATUS=, MAINPID=, EXTEND_TIMEOUT_USEC=, WATCHDOG_USEC=, ERRNO=,
// MONOTONIC_USEC= and vigil's own LEASE=id / RELEASE=id. Unknown keys are
// kept in Message.Assignments and otherwise ignored, as systemd does.
//
// Invariants of the server:
//   - One reader goroutine receives every datagram; Handle is called from it,
//     in arrival order, for each datagram that passes every check. Handle must
//     not block: the supervisor posts the message to its event loop. The
//     reader sleeps in a blocking recvmsg, so it occupies one OS thread.
//   - Every datagram is read with recvmsg into a MaxDatagram+1 byte buffer, so
//     an oversized datagram is always recognised, and with MSG_CMSG_CLOEXEC.
//   - Every file descriptor that arrives with a datagram (SCM_RIGHTS) is
//     closed before the datagram is looked at further, on every path. Closing
//     the descriptor is also the reply to BARRIER=1 that sd_notify_barrier(3)
//     and systemd-notify wait for; since datagrams are handled in order, the
//     reply means Handle has seen every earlier datagram of that sender (the
//     BARRIER=1 datagram itself is handled just after).
//   - A datagram that is truncated, oversized, empty (CVE-2016-7795), without
//     valid credentials, over its sender's rate, or that Parse rejects is
//     dropped and counted in Stats; nothing but Close stops the reader.
//   - Each sender pid has a token bucket (RatePerSender per second, burst of
//     the same size), so a flood from one process is dropped cheaply and does
//     not crowd out another's heartbeats.
//
// Authentication: the server reports the sender the kernel attached with
// SO_PASSCRED. The kernel lets an unprivileged process claim only its own
// pid, uid and gid, but a process with CAP_SYS_ADMIN may claim any live pid;
// systemd-notify does exactly that when run as root, sending on behalf of its
// parent. Deciding which service a pid belongs to (systemd's NotifyAccess) is
// the supervisor's job, not this package's: it alone knows the process groups.
//
// Permissions: the socket is created mode 0600 inside the 0700 state dir, so
// only the daemon's user (and root) can send. A service configured to run as
// another user cannot reach it; that is deliberate, the socket is not
// world-writable.
//
// What it deliberately does not do: it keeps no per-service state, starts no
// timers, never trusts MAINPID= (it only parses it), does not support
// systemd's file descriptor store (passed descriptors are always closed), and
// does not speak the vsock: NOTIFY_SOCKET addresses of newer systemd.
package notify
