package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Load reads, decodes and validates the configuration at path: a Procfile
// when its base name is "Procfile", TOML when it ends in ".toml", and
// otherwise whichever its first line that is not blank or a comment looks
// like ("name: command" means a Procfile, such as Procfile.dev).
//
// Problems in the file come back as Errors, every one found, in file order,
// each naming path as given, so messages read as the user typed the path.
// Failing to read the file is a wrapped *fs.PathError.
func Load(path string) (*Config, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	data, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	pr := &problems{file: path}
	dir := filepath.Dir(abs)
	var cfg *Config
	if isProcfile(abs, data) {
		cfg = parseProcfile(data, abs, dir, pr)
	} else if root, perr := parseTOML(data); perr != nil {
		pr.add(perr.at, "%s", perr.msg)
	} else {
		cfg = decodeTOML(root, abs, dir, pr)
	}
	if err := pr.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Find returns the configuration file of the project in dir: dir/vigil.toml
// if it exists, else dir/Procfile, else an error wrapping ErrNoConfig.
func Find(dir string) (string, error) {
	for _, name := range []string{"vigil.toml", "Procfile"} {
		path := filepath.Join(dir, name)
		info, err := os.Stat(path)
		switch {
		case err == nil && !info.IsDir():
			return path, nil
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return "", fmt.Errorf("config: %w", err)
		}
	}
	return "", fmt.Errorf("%w in %s", ErrNoConfig, dir)
}

var procfileStart = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*:`)

func isProcfile(path string, data []byte) bool {
	base := filepath.Base(path)
	switch {
	case base == "Procfile":
		return true
	case strings.HasSuffix(base, ".toml"):
		return false
	}
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if line != "" && line[0] != '#' {
			return procfileStart.MatchString(line)
		}
	}
	return false
}
