"""check_py39.py FILE...: the files must parse as Python 3.9 (no match statements, no parenthesised
context managers, ...) and must not use 3.10+ constructs that parse but fail at run time on 3.9:
`X | Y` in annotations, zip(strict=...), int.bit_count(), dataclass(slots=...)/kw_only."""
import ast
import sys

bad = 0
for path in sys.argv[1:]:
    src = open(path).read()
    try:
        tree = ast.parse(src, path, feature_version=(3, 9))
    except SyntaxError as e:
        print("%s:%s: not Python 3.9: %s" % (path, e.lineno, e.msg))
        bad += 1
        continue
    for node in ast.walk(tree):
        anns = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            anns += [x.annotation for x in a.args + a.kwonlyargs + a.posonlyargs if x.annotation is not None]
            anns += [x.annotation for x in (a.vararg, a.kwarg) if x is not None and x.annotation is not None]
            if node.returns is not None:
                anns.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            anns.append(node.annotation)
        for ann in anns:
            for sub in ast.walk(ann):
                if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.BitOr):
                    print("%s:%d: `X | Y` annotation (3.10+)" % (path, sub.lineno))
                    bad += 1
        if isinstance(node, ast.Call):
            if any(k.arg in ("strict", "slots", "kw_only") for k in node.keywords):
                print("%s:%d: keyword %s (3.10+)" % (path, node.lineno,
                                                    [k.arg for k in node.keywords if k.arg in ("strict", "slots", "kw_only")]))
                bad += 1
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("bit_count",):
                print("%s:%d: .%s() (3.10+)" % (path, node.lineno, f.attr))
                bad += 1
print("%d file(s) checked, %d problem(s)" % (len(sys.argv) - 1, bad))
sys.exit(1 if bad else 0)
