package policy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestPure fails when the package's own code starts importing more than the
// few standard packages pure logic needs, reads the clock, or starts a
// goroutine: time must come in as arguments (DESIGN §4, STYLE 4 and 15).
func TestPure(t *testing.T) {
	t.Parallel()
	allowed := []string{"math", "slices", "syscall", "time"}
	clockReads := []string{"Now", "Since", "Until", "Sleep", "After", "AfterFunc", "Tick", "NewTimer", "NewTicker"}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !slices.Contains(allowed, path) {
				t.Errorf("%s imports %q; policy may import only %v", fset.Position(imp.Pos()), path, allowed)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: a goroutine in a pure package", fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" && slices.Contains(clockReads, n.Sel.Name) {
					t.Errorf("%s: time.%s; take now as an argument instead", fset.Position(n.Pos()), n.Sel.Name)
				}
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}
