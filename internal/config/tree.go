package config

import (
	"errors"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// kind is the TOML type of a value, named as error messages say it.
type kind string

const (
	kindTable    kind = "table"
	kindArray    kind = "array"
	kindString   kind = "string"
	kindInteger  kind = "integer"
	kindFloat    kind = "float"
	kindBool     kind = "boolean"
	kindDatetime kind = "datetime"
)

// A value is one TOML value together with where it was written. go-toml's
// map decoding keeps neither positions nor key order, and strict errors need
// both, so the document is rebuilt from the parser's AST.
type value struct {
	kind   kind
	keyPos position // where its key was first written
	pos    position // where the value itself starts
	// text is the decoded string for kindString and the literal as written
	// for integers, floats, booleans and datetimes.
	text  string
	table *table   // kindTable
	elems []*value // kindArray
}

// table keeps its keys in the order they first appear in the file.
type table struct {
	keys   []string
	fields map[string]*value
}

func newTable(keyPos, pos position) *value {
	return &value{kind: kindTable, keyPos: keyPos, pos: pos, table: &table{fields: map[string]*value{}}}
}

func (t *table) set(key string, v *value) {
	t.keys = append(t.keys, key)
	t.fields[key] = v
}

// parseTOML returns the document's root table, or the first syntax error.
//
// go-toml's decoder runs first because it enforces the rules the bare parser
// leaves to its caller (a key defined twice, a table reopened, an inline
// table extended); the tree is built only from documents it accepts.
func parseTOML(data []byte) (*value, *posError) {
	var doc map[string]any
	if err := toml.Unmarshal(data, &doc); err != nil {
		if de, ok := errors.AsType[*toml.DecodeError](err); ok {
			line, col := de.Position()
			return nil, &posError{position{line, col}, strings.TrimPrefix(de.Error(), "toml: ")}
		}
		return nil, &posError{position{1, 1}, err.Error()}
	}
	b := &builder{data: data}
	for i, c := range data {
		if c == '\n' {
			b.lineStarts = append(b.lineStarts, i+1)
		}
	}
	b.p.Reset(data)
	root := newTable(position{1, 1}, position{1, 1})
	current := root
	for b.p.NextExpression() {
		var err *posError
		switch e := b.p.Expression(); e.Kind {
		case unstable.KeyValue:
			err = b.keyValue(current, e)
		case unstable.Table, unstable.ArrayTable:
			current, err = b.header(root, e)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := b.p.Error(); err != nil {
		// Unreachable after toml.Unmarshal accepted the document; kept so a
		// disagreement between the two is an error, not a panic.
		return nil, &posError{position{1, 1}, err.Error()}
	}
	return root, nil
}

// posError is a problem at a position, before a file name is attached.
type posError struct {
	at  position
	msg string
}

type builder struct {
	p          unstable.Parser
	data       []byte
	lineStarts []int // offsets where lines 2, 3, ... begin
}

func (b *builder) position(offset int) position {
	line := sort.SearchInts(b.lineStarts, offset+1) // lines starting at or before offset
	start := 0
	if line > 0 {
		start = b.lineStarts[line-1]
	}
	return position{line + 1, offset - start + 1}
}

// keyPart is one part of a dotted key.
type keyPart struct {
	name string
	pos  position
	end  int // offset just past the part as written (quotes included)
}

func (b *builder) key(it unstable.Iterator) []keyPart {
	var parts []keyPart
	for it.Next() {
		n := it.Node()
		parts = append(parts, keyPart{string(n.Data), b.position(int(n.Raw.Offset)), int(n.Raw.Offset + n.Raw.Length)})
	}
	return parts
}

// descend walks from t into the table named by part, creating it if it does
// not exist yet. An array of tables stands for its last table, as in TOML.
func (b *builder) descend(t *value, part keyPart) (*value, *posError) {
	next, ok := t.table.fields[part.name]
	if !ok {
		next = newTable(part.pos, part.pos)
		t.table.set(part.name, next)
		return next, nil
	}
	if next.kind == kindArray && len(next.elems) > 0 && next.elems[len(next.elems)-1].kind == kindTable {
		next = next.elems[len(next.elems)-1]
	}
	if next.kind != kindTable {
		return nil, &posError{part.pos, "key " + quoteKey(part.name) + " is already defined as a " + string(next.kind)}
	}
	return next, nil
}

// header handles [a.b] and [[a.b]] and returns the table that following
// key/value lines fill.
func (b *builder) header(root *value, e *unstable.Node) (*value, *posError) {
	parts := b.key(e.Key())
	t := root
	for _, part := range parts[:len(parts)-1] {
		var err *posError
		if t, err = b.descend(t, part); err != nil {
			return nil, err
		}
	}
	last := parts[len(parts)-1]
	if e.Kind == unstable.Table {
		return b.descend(t, last)
	}
	arr, ok := t.table.fields[last.name]
	if !ok {
		arr = &value{kind: kindArray, keyPos: last.pos, pos: last.pos}
		t.table.set(last.name, arr)
	}
	if arr.kind != kindArray {
		return nil, &posError{last.pos, "key " + quoteKey(last.name) + " is already defined as a " + string(arr.kind)}
	}
	elem := newTable(last.pos, last.pos)
	arr.elems = append(arr.elems, elem)
	return elem, nil
}

// keyValue adds `a.b = v` to t.
func (b *builder) keyValue(t *value, kv *unstable.Node) *posError {
	parts := b.key(kv.Key())
	for _, part := range parts[:len(parts)-1] {
		var err *posError
		if t, err = b.descend(t, part); err != nil {
			return err
		}
	}
	last := parts[len(parts)-1]
	if _, ok := t.table.fields[last.name]; ok {
		return &posError{last.pos, "key " + quoteKey(last.name) + " is defined twice"}
	}
	// The value starts after the key, blanks and '='. Arrays carry no
	// position of their own in the AST, so it is found from the text.
	start := last.end
	for start < len(b.data) && strings.IndexByte(" \t=", b.data[start]) >= 0 {
		start++
	}
	v, err := b.value(kv.Value(), b.position(start))
	if err != nil {
		return err
	}
	v.keyPos = last.pos
	t.table.set(last.name, v)
	return nil
}

func (b *builder) value(n *unstable.Node, pos position) (*value, *posError) {
	v := &value{pos: pos, keyPos: pos, text: string(n.Data)}
	switch n.Kind {
	case unstable.String:
		v.kind = kindString
	case unstable.Integer:
		v.kind = kindInteger
	case unstable.Float:
		v.kind = kindFloat
	case unstable.Bool:
		v.kind = kindBool
	case unstable.LocalDate, unstable.LocalTime, unstable.LocalDateTime, unstable.DateTime:
		v.kind = kindDatetime
	case unstable.Array:
		v.kind = kindArray
		for it := n.Children(); it.Next(); {
			elemPos := pos // a nested array has no position of its own
			if c := it.Node(); c.Kind != unstable.Array {
				elemPos = b.position(int(c.Raw.Offset))
			}
			elem, err := b.value(it.Node(), elemPos)
			if err != nil {
				return nil, err
			}
			v.elems = append(v.elems, elem)
		}
	case unstable.InlineTable:
		v = newTable(pos, pos)
		for it := n.Children(); it.Next(); {
			if err := b.keyValue(v, it.Node()); err != nil {
				return nil, err
			}
		}
	default:
		return nil, &posError{pos, "unexpected TOML node " + n.Kind.String()}
	}
	return v, nil
}
