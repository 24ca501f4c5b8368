#!/usr/bin/env python3
"""Import circles between the source files of each crate.

Every `crate::a::b` and `super::x` path in code (not in comments) is resolved to the file of
its module; strongly connected components of that graph with more than one file are circles.
Exits 1 when a circle has more than --max files, or when a crate named by --none-in has any.

    python3 tools/import_circles.py [--max 3] [--none-in shoal-broker ...]
"""
import argparse, os, re, sys
ap = argparse.ArgumentParser()
ap.add_argument('--root', default='.')
ap.add_argument('--max', type=int, default=None)
ap.add_argument('--none-in', nargs='*', default=[])
args = ap.parse_args()
root = args.root
def files_of(crate):
    src = os.path.join(crate, 'src')
    out = {}
    for dp, _, fs in os.walk(src):
        for f in fs:
            if f.endswith('.rs'):
                p = os.path.join(dp, f)
                rel = os.path.relpath(p, src)[:-3].split(os.sep)
                if rel[-1] in ('mod', 'lib', 'main'):
                    rel = rel[:-1]
                out[tuple(rel)] = p
    return out
def resolve(mods, path):
    # longest prefix of path that is a module file
    for k in range(len(path), 0, -1):
        if tuple(path[:k]) in mods:
            return tuple(path[:k])
    return None
def uses(text):
    # crate::a::b::{c, d}  -> expand braces one level
    res = []
    for m in re.finditer(r'crate((?:::\w+)+)(::\{([^}]*)\})?', text):
        base = m.group(1).strip(':').split('::')
        res.append(base)
        if m.group(3):
            for part in m.group(3).split(','):
                part = part.strip().split('::')[0].split(' ')[0]
                if part and part != 'self':
                    res.append(base + [part])
    # super:: references
    return res
def sccs(graph):
    index = {}; low = {}; st = []; on = set(); out = []; i = [0]
    sys.setrecursionlimit(10000)
    def strong(v):
        index[v] = low[v] = i[0]; i[0] += 1; st.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            out.append(comp)
    for v in graph:
        if v not in index: strong(v)
    return out
total = 0
bad = []
for c in sorted(os.listdir(os.path.join(root, 'crates'))):
    crate = os.path.join(root, 'crates', c)
    mods = files_of(crate)
    graph = {}
    for m, p in mods.items():
        text = '\n'.join(l for l in open(p).read().split('\n') if not l.lstrip().startswith('//'))
        # strip test modules roughly: ignore #[cfg(test)] mod tests { ... } is hard; keep all
        deps = set()
        for u in uses(text):
            r = resolve(mods, u)
            if r is not None and r != m and r != ():
                deps.add(r)
        # super:: references
        for sm in re.finditer(r'super((?:::\w+)+)', text):
            parent = list(m[:-1]) if not p.endswith('mod.rs') else list(m[:-1])
            path = parent + sm.group(1).strip(':').split('::')
            r = resolve(mods, path)
            if r is not None and r != m and r != ():
                deps.add(r)
        graph[m] = deps
    for comp in sccs(graph):
        if len(comp) > 1:
            total += len(comp)
            print(f"{c}: {len(comp)} files: " + ", ".join('/'.join(x) for x in sorted(comp)))
            if (args.max is not None and len(comp) > args.max) or c in args.none_in:
                bad.append(c)
print("files in circles:", total)
if bad:
    print("import circles not allowed in:", ", ".join(sorted(set(bad))))
    sys.exit(1)
