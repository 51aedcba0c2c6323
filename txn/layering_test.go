package txn_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// txn is the only package of the module that sends the transaction
// commands: no other non-test source passes "WATCH", "UNWATCH", "MULTI",
// "EXEC" or "DISCARD" to a call (in capitals, or in any case to a
// method that sends a command).
func TestOnlyTxnSendsTransactionCommands(t *testing.T) {
	protocol := map[string]bool{"WATCH": true, "UNWATCH": true, "MULTI": true, "EXEC": true, "DISCARD": true}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "txn", "bench", ".git", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		files++
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			var fn string
			switch f := call.Fun.(type) {
			case *ast.SelectorExpr:
				fn = f.Sel.Name
			case *ast.Ident:
				fn = f.Name
			}
			sends := strings.HasPrefix(fn, "Do") || strings.HasPrefix(fn, "do") || fn == "Send" || fn == "send" || fn == "Queue"
			for _, a := range call.Args {
				lit, ok := a.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				if s, err := strconv.Unquote(lit.Value); err == nil && protocol[strings.ToUpper(s)] && (sends || s == strings.ToUpper(s)) {
					t.Errorf("%s: sends %s; only package txn may", fset.Position(lit.Pos()), s)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 20 {
		t.Fatalf("only %d source files found under %s", files, root)
	}
}
