package logs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

var (
	// ErrInvalidName is returned for a service name that cannot be a file name.
	ErrInvalidName = errors.New("logs: invalid service name")
	// ErrUnsafePath is returned when a log path or the logs directory is a
	// symlink or not the kind of file it should be; nothing is written then.
	ErrUnsafePath = errors.New("logs: unsafe log path")
	// ErrClosed is returned by a Rotator or Prefixer after Close.
	ErrClosed = errors.New("logs: closed")
)

// Limits bounds the disk one service's output can use.
type Limits struct {
	// MaxSize is the size in bytes above which the live file is rotated and
	// the most a rotated file holds. Zero (or less) means 10 MiB.
	MaxSize int64
	// MaxFiles is how many rotated files (.1 … .MaxFiles) are kept.
	// Zero (or less) means 3.
	MaxFiles int
}

func (l Limits) withDefaults() Limits {
	if l.MaxSize <= 0 {
		l.MaxSize = 10 << 20
	}
	if l.MaxFiles <= 0 {
		l.MaxFiles = 3
	}
	return l
}

// Path is the live log file of service: <stateDir>/logs/<service>.log.
func Path(stateDir, service string) string {
	return filepath.Join(stateDir, "logs", service+".log")
}

// rotatedPath is the k-th older file beside live (k ≥ 1; 1 is the newest).
func rotatedPath(live string, k int) string {
	return live + "." + strconv.Itoa(k)
}

// OpenForChild opens service's live log file for the child's stdout and
// stderr: write-only, O_APPEND, created 0600 if missing (the logs directory
// 0700), close-on-exec (exec.Cmd dups it into the child). A symlink at the
// path is refused with ErrUnsafePath. The caller closes its copy after spawn.
func OpenForChild(stateDir, service string) (*os.File, error) {
	return openLog(stateDir, service, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT)
}

// openLog makes sure the logs directory exists and opens service's live
// file with flags.
func openLog(stateDir, service string, flags int) (*os.File, error) {
	if err := checkName(service); err != nil {
		return nil, err
	}
	if err := ensureDir(filepath.Join(stateDir, "logs")); err != nil {
		return nil, err
	}
	return openNoFollow(Path(stateDir, service), flags, 0o600)
}

func checkName(service string) error {
	if service == "" || service == "." || service == ".." || strings.ContainsAny(service, "/\x00") {
		return fmt.Errorf("%w: %q", ErrInvalidName, service)
	}
	return nil
}

// ensureDir creates dir 0700 if missing and refuses it if it is a symlink or
// not a directory.
func ensureDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("logs: create %s: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("logs: %w", err)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symlink", ErrUnsafePath, dir)
	case !fi.IsDir():
		return fmt.Errorf("%w: %s is not a directory", ErrUnsafePath, dir)
	}
	return nil
}

// openNoFollow opens path without following a symlink in its last component
// and returns it only if it is a regular file. O_NONBLOCK keeps a planted
// FIFO from blocking the open; it is cleared again for the regular file.
func openNoFollow(path string, flags int, perm uint32) (*os.File, error) {
	fd, err := unix.Open(path, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, perm)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%w: %s is a symlink", ErrUnsafePath, path)
	}
	if err != nil {
		return nil, fmt.Errorf("logs: %w", &fs.PathError{Op: "open", Path: path, Err: err})
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("logs: stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrUnsafePath, path)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("logs: fcntl %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

func fileSize(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("logs: %w", err)
	}
	return fi.Size(), nil
}
