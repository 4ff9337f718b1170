package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vigil-dev/vigil/internal/notify"
)

// userNotifyRoot holds the sd_notify sockets of services that run as
// another user: the state dir's own socket is in a directory only the
// daemon's user may enter.
const userNotifyRoot = "/run/vigil"

// userNotify gives each user a service runs as (other than the daemon's)
// an sd_notify socket of its own: <root>/<hash of the state dir>/notify-<uid>.sock,
// owned by that user, mode 0600, in root-owned directories that others may
// traverse but not list (0711). No one else can write to it, and no user
// can touch the directories. The path is the same for every daemon of a
// state dir, so an instance adopted after a daemon restart still reaches it.
type userNotify struct {
	root   string // userNotifyRoot
	state  string // the state dir, whose hash names the directory
	handle func(notify.Sender, notify.Message)
	log    *slog.Logger

	mu      sync.Mutex
	servers map[uint32]*notify.Server
}

func (u *userNotify) dir() string { return filepath.Join(u.root, projectID(u.state)) }

// projectID names the project of a state dir where a path will not do:
// the hash of the state dir's absolute path, 16 hex digits. It names the
// directory of the per-user notify sockets, and begins every instance
// token (proc.ReaperOptions.Project).
func projectID(stateDir string) string {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	sum := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(sum[:8])
}

// path returns the socket for uid (with group gid), listening on it first
// if no service of that user has yet.
func (u *userNotify) path(uid, gid uint32) (string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	dir := u.dir()
	path := filepath.Join(dir, "notify-"+strconv.FormatUint(uint64(uid), 10)+".sock")
	if u.servers[uid] != nil {
		return path, nil
	}
	for _, d := range []string{u.root, dir} {
		if err := rootDir(d); err != nil {
			return "", err
		}
	}
	s, err := notify.Listen(notify.ServerOptions{Path: path, Handle: u.handle})
	if err != nil {
		return "", err
	}
	// bind made it root's, 0600; the socket's inode is its own (Lchown
	// does not follow a symlink, and the directory is root's alone).
	if err := unix.Lchown(path, int(uid), int(gid)); err != nil {
		s.Close()
		return "", fmt.Errorf("daemon: notify socket for uid %d: %w", uid, err)
	}
	if u.servers == nil {
		u.servers = map[uint32]*notify.Server{}
	}
	u.servers[uid] = s
	return path, nil
}

// rootDir makes d a directory of root's, mode 0711: it creates it, or
// checks that it is one (not a symlink, root's, not writable by anyone
// else) and sets its mode, past the umask or an earlier 0700.
func rootDir(d string) error {
	err := unix.Mkdir(d, 0o711)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("daemon: %s: %w", d, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(d, &st); err != nil {
		return fmt.Errorf("daemon: %s: %w", d, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("daemon: %s is not a directory", d)
	case st.Uid != 0:
		return fmt.Errorf("daemon: %s belongs to uid %d, not root", d, st.Uid)
	case st.Mode&0o022 != 0:
		return fmt.Errorf("daemon: %s is writable by others (mode %o)", d, st.Mode&0o777)
	}
	// Its parent is root's too (checked first), so d cannot be swapped for
	// a symlink between the check and this.
	if err := unix.Chmod(d, 0o711); err != nil {
		return fmt.Errorf("daemon: %s: %w", d, err)
	}
	return nil
}

// close stops every user's socket and removes their directory if empty.
func (u *userNotify) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for uid, s := range u.servers {
		if err := s.Close(); err != nil {
			u.log.Warn("notify socket", "uid", uid, "err", err)
		}
	}
	if len(u.servers) > 0 {
		os.Remove(u.dir())
	}
	u.servers = nil
}
