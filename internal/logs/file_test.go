package logs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestOpenForChildCreatesPrivateAppendOnlyFile(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	f, err := OpenForChild(state, "web")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	dir, err := os.Stat(filepath.Join(state, "logs"))
	if err != nil {
		t.Fatal(err)
	}
	if got := dir.Mode().Perm(); got != 0o700 {
		t.Errorf("logs dir mode = %o, want 700", got)
	}
	file, err := os.Lstat(Path(state, "web"))
	if err != nil {
		t.Fatal(err)
	}
	if got := file.Mode(); got != 0o600 {
		t.Errorf("log file mode = %v, want -rw-------", got)
	}
	flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags&unix.O_ACCMODE != unix.O_WRONLY || flags&unix.O_APPEND == 0 || flags&unix.O_NONBLOCK != 0 {
		t.Errorf("file flags = %#x, want O_WRONLY|O_APPEND without O_NONBLOCK", flags)
	}
	fdFlags, err := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fdFlags&unix.FD_CLOEXEC == 0 {
		t.Error("descriptor is not close-on-exec")
	}

	// A second opener appends rather than overwriting.
	if _, err := f.WriteString("one\n"); err != nil {
		t.Fatal(err)
	}
	g, err := OpenForChild(state, "web")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.WriteString("two\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("three\n"); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, Path(state, "web")); got != "one\ntwo\nthree\n" {
		t.Errorf("content = %q", got)
	}
}

func TestOpenForChildRefusesSymlinks(t *testing.T) {
	t.Parallel()
	elsewhere := t.TempDir()
	target := filepath.Join(elsewhere, "target")
	if err := os.WriteFile(target, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("file", func(t *testing.T) {
		t.Parallel()
		state := t.TempDir()
		if err := os.Mkdir(filepath.Join(state, "logs"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, Path(state, "web")); err != nil {
			t.Fatal(err)
		}
		f, err := OpenForChild(state, "web")
		if !errors.Is(err, ErrUnsafePath) {
			f.Close()
			t.Fatalf("OpenForChild through a symlink: err = %v, want ErrUnsafePath", err)
		}
		t.Log(err)
		if got := readFile(t, target); got != "precious\n" {
			t.Errorf("symlink target changed to %q", got)
		}
	})
	t.Run("dangling", func(t *testing.T) {
		t.Parallel()
		state := t.TempDir()
		if err := os.Mkdir(filepath.Join(state, "logs"), 0o700); err != nil {
			t.Fatal(err)
		}
		planted := filepath.Join(elsewhere, "planted")
		if err := os.Symlink(planted, Path(state, "web")); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenForChild(state, "web"); !errors.Is(err, ErrUnsafePath) {
			t.Fatalf("err = %v, want ErrUnsafePath", err)
		}
		if _, err := os.Lstat(planted); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("symlink target was created: %v", err)
		}
	})
	t.Run("dir", func(t *testing.T) {
		t.Parallel()
		state := t.TempDir()
		if err := os.Symlink(elsewhere, filepath.Join(state, "logs")); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenForChild(state, "target"); !errors.Is(err, ErrUnsafePath) {
			t.Fatalf("err = %v, want ErrUnsafePath", err)
		}
		if got := readFile(t, target); got != "precious\n" {
			t.Errorf("file behind symlinked dir changed to %q", got)
		}
	})
}

func TestOpenForChildRefusesFIFO(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	if err := os.Mkdir(filepath.Join(state, "logs"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(Path(state, "web"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Without a reader, opening a FIFO for writing would block or fail; with
	// one it would succeed. Either way it is not a log file.
	r, err := os.OpenFile(Path(state, "web"), os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := OpenForChild(state, "web"); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("err = %v, want ErrUnsafePath", err)
	}
}

func TestInvalidServiceNames(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	for _, name := range []string{"", ".", "..", "a/b", "../x", "a\x00b"} {
		if _, err := OpenForChild(state, name); !errors.Is(err, ErrInvalidName) {
			t.Errorf("OpenForChild(%q): err = %v, want ErrInvalidName", name, err)
		}
		if _, err := Tail(state, name, 1, 10); !errors.Is(err, ErrInvalidName) {
			t.Errorf("Tail(%q): err = %v, want ErrInvalidName", name, err)
		}
	}
}
