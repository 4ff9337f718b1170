package config

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrNoConfig is returned (wrapped, with the directory) by Find when a
// directory holds neither vigil.toml nor a Procfile.
var ErrNoConfig = errors.New("config: no vigil.toml or Procfile")

// Error is one problem in a configuration file, at a 1-based line and byte
// column.
type Error struct {
	File      string
	Line, Col int
	Msg       string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
}

// Errors is every problem Load found, ordered by position. Its Error is one
// problem per line.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.As find the individual *Error values.
func (es Errors) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}

// position is a 1-based line and byte column in the file being loaded.
type position struct{ line, col int }

// problems accumulates the Errors of one file.
type problems struct {
	file string
	errs Errors
}

func (p *problems) add(at position, format string, args ...any) {
	p.errs = append(p.errs, &Error{File: p.file, Line: at.line, Col: at.col, Msg: fmt.Sprintf(format, args...)})
}

// err returns the collected problems in file order, or nil if there were none.
func (p *problems) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	sorted := append(Errors(nil), p.errs...)
	// Stable, so problems found at one position keep the order they were found in.
	slices.SortStableFunc(sorted, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col))
	})
	return sorted
}
