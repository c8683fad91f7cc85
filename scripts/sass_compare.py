# Compares the SASS of every kernel in two builds of the CUDA backend (object dirs of
# moeserve_backend_cuda), function by function, for sm_80 and sm_90a: identical / differ /
# removed / new. Anonymous-namespace hashes (they encode the source path) are normalised;
# --norm-params also ignores kernel-parameter offsets. Usage:
#   CUOBJDUMP=... python3 scripts/sass_compare.py [--norm-params] BASE_DIR NEW_DIR
import subprocess, re, sys, os
CO=os.environ.get('CUOBJDUMP', 'cuobjdump')
A=sys.argv[-2]  # the base build's object dir (e.g. .../moeserve_backend_cuda.dir)
B=sys.argv[-1]  # the changed build's
norm = '--norm-params' in sys.argv
def funcs(obj):
    out = subprocess.run([CO, '-sass', obj], capture_output=True, text=True).stdout
    res = {}; cur = None; arch = None
    for line in out.splitlines():
        m = re.match(r'\s*arch = (sm_\w+)', line)
        if m: arch = m.group(1)
        m = re.match(r'\s*Function : (\S+)', line)
        if m:
            name = re.sub(r'\d+_GLOBAL__N__[0-9a-f]+_\d+_[A-Za-z0-9_]+?_cu_[0-9a-f]+', 'ANON', m.group(1))
            cur = (arch, name); res[cur] = []; continue
        if cur and re.search(r'/\*[0-9a-f]{4,}\*/', line):
            ins = re.sub(r'/\*[0-9a-f]+\*/', '', line).split(';')[0].strip()
            ins = re.sub(r'\d+_GLOBAL__N__[0-9a-f]+_\d+_[A-Za-z0-9_]+?_cu_[0-9a-f]+', 'ANON', ins)
            if norm: ins = re.sub(r'c\[0x0\]\[0x[0-9a-f]+\]', 'c[P]', ins)
            res[cur].append(ins)
    return res
tot_same = tot_diff = 0
for f in sorted(os.listdir(A)):
    if not f.endswith('.cu.o') or not os.path.exists(os.path.join(B, f)): continue
    fa, fb = funcs(os.path.join(A, f)), funcs(os.path.join(B, f))
    same = [k for k in fa if k in fb and fa[k] == fb[k]]
    diff = [k for k in fa if k in fb and fa[k] != fb[k]]
    gone = [k for k in fa if k not in fb]
    new = [k for k in fb if k not in fa]
    tot_same += len(same); tot_diff += len(diff)
    print(f"{f}: {len(same)} identical, {len(diff)} differ, {len(gone)} removed, {len(new)} new")
    for k in diff: print("   DIFF", k[0], k[1][:120], len(fa[k]), len(fb[k]))
    for k in new: print("   NEW", k[0], k[1][:120])
print("total identical", tot_same, "differ", tot_diff)
